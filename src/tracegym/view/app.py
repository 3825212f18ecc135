"""Viewer app: the aiohttp application serving a run folder's pages and their JSON under `/api/`, read-only.

Pages are rendered on the server from the index (no JavaScript needed to read them); a record is read from disk
only when its page is shown. The index follows the folder in the background, so a run still being written
shows its new traces on the next load. Bad input (a garbage query, a row out of range, an unreadable line or
file) gets a short page or JSON error with a 4xx status, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import sys
import traceback
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from tracegym.config.image_store import ImageStore
from tracegym.core.errors import UsageError
from tracegym.core.image_ref import mime_of
from tracegym.core.trace import Trace
from tracegym.train.rl_folder import RLFolder
from tracegym.view.episode_page import episode_page, member_url
from tracegym.view.message_view import text_url
from tracegym.view.page import layout
from tracegym.view.row_query import QueryError, RowQuery
from tracegym.view.run_folder_index import Row, RowError, RowKind, RunFolderIndex, RunKind
from tracegym.view.run_page import run_page, select
from tracegym.view.text_reader import TextPage, text_page, text_page_html
from tracegym.view.tokens_view import token_text_for
from tracegym.view.trace_page import trace_page

STATIC = Path(__file__).parent / "static"
LINES_PER_LOOK = 500
"""Lines indexed at a time (one turn of the follower, or a request): ~15 ms on an idle core, so pages stay
responsive while a large folder is read."""
FOLLOW_EVERY_S = 0.5
"""How often the follower looks for appended lines once it has caught up."""
LIVE_RELOAD_S = 5
BATCHES_KEPT = 4


@dataclass
class Viewer:
    """What the handlers share: the index, and what is loaded once and kept (tokenizer, step advantages)."""

    index: RunFolderIndex
    following: bool = False
    """A background task indexes appended lines: requests then index only what little is new once it has caught
    up (a reload shows an appended line at once), never a backlog."""
    caught_up: bool = False
    """The follower's last look found nothing new."""
    tokenizers: dict[str, asyncio.Future[Any]] = field(default_factory=dict)
    advantages: OrderedDict[int, dict[tuple[str, int], float]] = field(default_factory=OrderedDict)

    def look(self) -> int:
        """Index a bounded number of new lines."""
        return self.index.refresh(max_lines=LINES_PER_LOOK)

    async def tokenizer(self, trace: Trace | None = None) -> Any:
        """The token texts of the run's model (the config's, else the trace's; None when they cannot be loaded
        here), loaded once in a thread: the first trace page waits for it, other requests do not."""
        try:
            model = self.index.model()
        except UsageError:  # a config that cannot be read: the run page says so; a trace page goes on without it
            model = ""
        name = model or (trace.model if trace else None)
        if not name:
            return None
        if name not in self.tokenizers:
            self.tokenizers[name] = asyncio.ensure_future(asyncio.to_thread(_quietly, token_text_for, name))
        return await self.tokenizers[name]

    async def branch_advantages(self, row: Row, trace: Trace) -> dict[int, float]:
        """An RL trace's advantage per branch, from its step's batch (empty when the batch is gone, and for a
        held-out evaluation's trace, which no step trained on)."""
        if self.index.kind is not RunKind.RL or row.step is None or row.held_out is not None:
            return {}
        if row.step not in self.advantages:
            batch = await asyncio.to_thread(_quietly, RLFolder(self.index.path).read_batch, row.step)
            self.advantages[row.step] = {(s.trace_id, s.branch): s.advantage for s in batch.samples} if batch else {}
            while len(self.advantages) > BATCHES_KEPT:
                self.advantages.popitem(last=False)
        found = self.advantages[row.step]
        return {branch: found[(trace.id, branch)] for branch in range(len(trace.branches))
                if (trace.id, branch) in found}


VIEWER = web.AppKey("viewer", Viewer)


def make_app(index: RunFolderIndex, *, follow: bool = True, any_host: bool = False) -> web.Application:
    """The viewer over `index`; `follow` keeps indexing appended lines in the background. It answers only requests
    whose `Host` is a loopback name or address (a web page the user visits cannot rebind its own name to
    127.0.0.1 and read the run), unless `any_host` (served on a remote address, which `--allow-remote` accepts)."""
    viewer = Viewer(index, following=follow)
    app = web.Application(middlewares=[_errors] if any_host else [_loopback_hosts_only, _errors])
    app[VIEWER] = viewer
    app.router.add_get("/", _run_page)
    app.router.add_get("/trace/{n}", _trace_page)
    app.router.add_get("/episode/{n}", _episode_page)
    app.router.add_get("/episode/{n}/member/{member}", _member_page)
    app.router.add_get("/trace/{n}/node/{node}/text", _text_page)
    app.router.add_get("/episode/{n}/member/{member}/node/{node}/text", _text_page)
    app.router.add_get("/api/run", _api_run)
    app.router.add_get("/api/rows", _api_rows)
    app.router.add_get("/api/trace/{n}", _api_trace)
    app.router.add_get("/api/episode/{n}", _api_episode)
    app.router.add_get("/api/trace/{n}/node/{node}/text", _api_text)
    app.router.add_get("/api/episode/{n}/member/{member}/node/{node}/text", _api_text)
    app.router.add_get("/api/metrics", _api_metrics)
    app.router.add_get("/image/{name}", _image)
    app.router.add_static("/static/", STATIC)
    if follow:
        app.cleanup_ctx.append(_follower)
    return app


async def _follower(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(_follow(app[VIEWER]))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _follow(viewer: Viewer) -> None:
    """Index the folder a bounded slice at a time, yielding to requests in between, then watch it grow. Once
    caught up the first time, load the model's token texts, so the first trace page need not wait for them."""
    prefetch: asyncio.Future[Any] | None = None
    while True:
        try:
            read = viewer.look()
        except OSError as exc:  # a file vanished or became unreadable: the pages say so; look again later
            print(f"tracegym view: cannot read the run folder: {exc}", file=sys.stderr)
            read = 0
        viewer.caught_up = not read
        if not read and prefetch is None:
            prefetch = asyncio.ensure_future(_quiet_tokenizer(viewer))
        await asyncio.sleep(0 if read else FOLLOW_EVERY_S)


async def _quiet_tokenizer(viewer: Viewer) -> None:
    with contextlib.suppress(OSError):  # a config that cannot be read: its pages say so
        await viewer.tokenizer()


# --- pages -----------------------------------------------------------------------------------------------------
async def _run_page(request: web.Request) -> web.Response:
    viewer = _viewer(request)
    query = _query(request, viewer.index)
    body = run_page(viewer.index, select(viewer.index, query))
    live = query.live and LIVE_RELOAD_S
    return _html(layout("run", body, run=str(viewer.index.path), refresh=live or None))


async def _trace_page(request: web.Request) -> web.Response:
    viewer = _viewer(request)
    n = _number(request)
    row, trace = viewer.index.row(RowKind.TRACE, n), viewer.index.trace(n)
    branch = _branch(request, trace)
    count = len(viewer.index.traces)
    nav = " ".join(link for link in (f'<a href="/trace/{n - 1}">← previous</a>' if n > 0 else "",
                                     f'<a href="/trace/{n + 1}">next →</a>' if n + 1 < count else "") if link)
    body = trace_page(trace, where=viewer.index.where(row), branch=branch, tokenizer=await viewer.tokenizer(trace),
                      advantages=await viewer.branch_advantages(row, trace), json_url=f"/api/trace/{n}", nav=nav,
                      reader=f"/trace/{n}")
    return _html(layout(f"trace {n}", body, run=str(viewer.index.path)))


async def _episode_page(request: web.Request) -> web.Response:
    viewer = _viewer(request)
    n = _number(request)
    row, episode = viewer.index.row(RowKind.EPISODE, n), viewer.index.episode(n)
    body = episode_page(episode, where=viewer.index.where(row), number_=n, json_url=f"/api/episode/{n}")
    return _html(layout(f"episode {n}", body, run=str(viewer.index.path)))


async def _member_page(request: web.Request) -> web.Response:
    viewer = _viewer(request)
    n, member = _number(request), request.match_info["member"]
    row, trace = _member_trace(viewer, n, member)
    nav = f'<a href="/episode/{n}">← episode {n}</a>'
    body = trace_page(trace, where=viewer.index.where(row), branch=_branch(request, trace),
                      tokenizer=await viewer.tokenizer(trace), advantages=await viewer.branch_advantages(row, trace),
                      json_url=f"/api/episode/{n}", nav=nav, reader=member_url(n, member))
    return _html(layout(f"episode {n} · {member}", body, run=str(viewer.index.path)))


async def _text_page(request: web.Request) -> web.Response:
    """The text reader: one page of one text of a message (`text_reader`) of a trace or an episode member's."""
    viewer = _viewer(request)
    row, trace, reader = _read_trace(viewer, request)
    shown = _text_asked(request, trace)
    body = text_page_html(shown, reader=reader, where=viewer.index.where(row),
                          json_url="/api" + text_url(reader, shown.node.id, shown.part, shown.page))
    return _html(layout(f"node {shown.node.id} · page {shown.page} of {shown.pages}", body,
                        run=str(viewer.index.path)))


def _member_trace(viewer: Viewer, n: int, member: str) -> tuple[Row, Trace]:
    row, episode = viewer.index.row(RowKind.EPISODE, n), viewer.index.episode(n)
    trace = episode.traces.get(member)
    if trace is None:
        raise RowError(f"episode {n} has no trace of a member {member!r} (members: {', '.join(episode.members)})",
                       404)
    return row, trace


def _read_trace(viewer: Viewer, request: web.Request) -> tuple[Row, Trace, str]:
    """The trace a text reader's URL names (`/trace/N/...` or `/episode/N/member/ID/...`), its row and its page's
    URL."""
    n = _number(request)
    if "member" not in request.match_info:
        return viewer.index.row(RowKind.TRACE, n), viewer.index.trace(n), f"/trace/{n}"
    member = request.match_info["member"]
    return *_member_trace(viewer, n, member), member_url(n, member)


def _text_asked(request: web.Request, trace: Trace) -> TextPage:
    params = request.query
    unknown = sorted(set(params) - {"page", "part"})
    if unknown or any(len(params.getall(k)) > 1 for k in params):
        raise QueryError(f"the text reader takes page= and part=, each once; not {', '.join(unknown) or 'twice'}")
    return text_page(trace, request.match_info["node"], params.get("part", "text"), params.get("page", "1"))


async def _image(request: web.Request) -> web.FileResponse:
    """A stored image of the run folder (`images/<sha256>.<ext>`): only a hex name with a known extension is
    looked up (no other path can be named), served with its own type and never sniffed as another."""
    name = request.match_info["name"]
    path = ImageStore.of(_viewer(request).index.path).path(name)
    if path is None:
        raise RowError(f"no stored image {name[:80]!r} in this run folder", 404)
    return web.FileResponse(path, headers={"Content-Type": mime_of(name), "X-Content-Type-Options": "nosniff",
                                           "Cache-Control": "max-age=31536000, immutable"})


# --- JSON --------------------------------------------------------------------------------------------------------
async def _api_run(request: web.Request) -> web.Response:
    index = _viewer(request).index
    return web.json_response({
        "path": str(index.path), "kind": index.kind.value, "generation": index.generation,
        "traces": len(index.traces), "episodes": len(index.episodes),
        "unreadable": index.unreadable,
        "pending_bytes": index.pending_bytes, "incomplete": index.incomplete(), "steps": index.steps(),
        "summary": index.summary() if index.kind is RunKind.EVAL else None, "config": index.config()})


async def _api_rows(request: web.Request) -> web.Response:
    viewer = _viewer(request)
    selection = select(viewer.index, _query(request, viewer.index))
    rows = viewer.index.rows(selection.query.show)
    return web.json_response({
        "kind": selection.query.show.value, "total": selection.total, "matching": len(selection.numbers),
        "page": selection.query.page, "pages": selection.pages, "per_page": selection.query.per_page,
        "rows": [row_json(viewer.index, n, rows[n]) for n in selection.shown]})


async def _api_trace(request: web.Request) -> web.Response:
    viewer = _viewer(request)
    return web.json_response(viewer.index.trace(_number(request)).model_dump(mode="json"))


async def _api_episode(request: web.Request) -> web.Response:
    viewer = _viewer(request)
    return web.json_response(viewer.index.episode(_number(request)).model_dump(mode="json"))


async def _api_text(request: web.Request) -> web.Response:
    _, trace, _ = _read_trace(_viewer(request), request)
    return web.json_response(_text_asked(request, trace).json())


async def _api_metrics(request: web.Request) -> web.Response:
    index = _viewer(request).index
    return web.json_response({"metrics": index.metrics(), "trainer": index.trainer_metrics()})


def row_json(index: RunFolderIndex, n: int, row: Row) -> dict[str, Any]:
    """A table row as `/api/rows` gives it."""
    data = asdict(row)
    for internal in ("source", "offset", "length"):
        data.pop(internal)
    data["member_rewards"] = dict(row.member_rewards) if row.member_rewards else None
    return {"n": n, "where": index.where(row), **data}


# --- requests and errors -------------------------------------------------------------------------------------
def _viewer(request: web.Request) -> Viewer:
    viewer: Viewer = request.app[VIEWER]
    if not viewer.following or viewer.caught_up:
        viewer.look()
    return viewer


def _query(request: web.Request, index: RunFolderIndex) -> RowQuery:
    params = request.query
    repeated = sorted({k for k in params if len(params.getall(k)) > 1})
    if repeated:
        raise QueryError(f"each parameter once: {', '.join(repeated)} given more than once")
    query = RowQuery.parse(dict(params))
    if "show" not in params:
        query = replace(query, show=index.first_shown)
    return query


def _number(request: web.Request) -> int:
    text = request.match_info["n"]
    if not text.isdigit() or len(text) > 12:
        raise RowError(f"{text[:40]!r} is not a row number (a whole number from 0)", 404)
    return int(text)


def _branch(request: web.Request, trace: Trace) -> int | None:
    text = request.query.get("branch")
    if text is None:
        return None
    count = len(trace.branches)
    if not text.isdigit() or int(text) >= count:
        raise QueryError(f"branch={text[:40]!r}: this trace has branches 0 to {count - 1}")
    return int(text)


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")


def is_loopback(host: str) -> bool:
    """True for `localhost` and a loopback address (IPv4 or IPv6, brackets allowed)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@web.middleware
async def _loopback_hosts_only(request: web.Request,
                               handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """421 for a request whose Host header names anything but loopback (DNS rebinding)."""
    name = urlsplit(f"//{request.host}").hostname or ""
    if not is_loopback(name):
        return web.Response(status=421, text=f"this viewer serves loopback only, not Host {request.host!r}\n")
    return await handler(request)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    """Every failure as a short page (or JSON under /api/) with a 4xx status; only a bug in the viewer is a 500,
    and its traceback goes to the viewer's stderr, never to the browser."""
    try:
        return await handler(request)
    except QueryError as exc:
        return _error(request, 400, f"bad query string: {exc}")
    except RowError as exc:
        return _error(request, exc.status, str(exc))
    except UsageError as exc:
        return _error(request, 422, str(exc))
    except OSError as exc:
        name = f" {exc.filename}" if exc.filename else ""
        return _error(request, 403, f"cannot read{name}: {exc.strerror or exc}")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(request, exc.status, f"{exc.reason}: {request.path}")
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return _error(request, 500, f"the viewer failed on this request ({type(exc).__name__}: {exc}); "
                                    "see its terminal")


def _error(request: web.Request, status: int, message: str) -> web.Response:
    if request.path.startswith("/api/"):
        return web.Response(text=json.dumps({"error": message, "status": status}), status=status,
                            content_type="application/json")
    body = f'<h1>{status}</h1><p class="note err">{escape(message)}</p><p><a href="/">back to the run</a></p>'
    return _html(layout(f"error {status}", body), status)


def _quietly(load: Callable[..., Any], *args: Any) -> Any:
    """`load(*args)`, or None (said on stderr) when it fails: a missing tokenizer or batch leaves a part of a
    page out, not the page."""
    try:
        return load(*args)
    except Exception as exc:
        print(f"tracegym view: {getattr(load, '__name__', 'loading')} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None
