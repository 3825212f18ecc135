"""OpenEnv server: any tracegym taskset served over OpenEnv's HTTP and WebSocket protocol (Starlette on uvicorn).

Each WebSocket at `/ws` is one session (`TasksetSession`): `reset` picks a task (by `index`, `seed` or `key`) and
answers with its prompt; `step` takes the agent's message or tool calls and answers with what the environment added,
and the reward once `done` (a step may also be openenv's MCP-style `call_tool` / `list_tools` action, answered as
its CallToolObservation / ListToolsObservation); `state`, `close`, and `mcp` (JSON-RPC `tools/list`, `tools/call`,
whose result says `done` and `reward` beside MCP's content blocks). Sessions are isolated
(each its own rollout; each session held by a worker process, the server passing its frames there unread:
`openenv_workers`; `workers=0`: held in this process), at most
`max_concurrent_envs` at once (past it: `CAPACITY_REACHED`, unless a session idle for `reap_idle_after` seconds gives
its place), and one idle for `session_timeout` seconds is told so (`SESSION_ERROR`) and closed. Bad input gets
OpenEnv's error frames (`INVALID_JSON`, also for JSON nested past `MAX_DEPTH`; `UNKNOWN_TYPE`, `VALIDATION_ERROR`,
`EXECUTION_ERROR`) and the session goes on; other sessions never notice. HTTP: `/health`, `/schema`, `/metadata`,
`/state`, `/reset` (a one-off rollout's prompt), `/step` (refused: steps need a session) and `/mcp` (`tools/list`,
`tools/call`, and the session lifecycle of OpenEnv's `MCPToolClient`: `openenv/session/create` makes a session that a
WebSocket joins with `/ws?session_id=ID`, `openenv/session/close` ends it), and OpenEnv's Task API listing the
taskset's tasks as one split (`openenv_task_api`; a reset takes its `split` and `index`). A body over
`max_frame_bytes` gets 413 unread; a connection that has not sent its headers within `header_timeout` is closed.
Binding anywhere but loopback needs a shared secret (`TRACEGYM_ENV_SECRET`, sent by clients as `Authorization: Bearer
SECRET`) and TLS, so the secret never crosses a network in clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from openenv.core.env_server.mcp_types import (
    JsonRpcErrorCode,
    JsonRpcRequest,
)
from openenv.core.env_server.types import (
    StepRequest,
    WSErrorCode,
)
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tracegym.core.errors import UsageError
from tracegym.envs.adapter_fit import check_adapter_fit
from tracegym.envs.multi_agent import MultiAgentTask, is_multi_agent
from tracegym.envs.seats import Seat
from tracegym.envs.taskset import Taskset
from tracegym.interop.openenv_answers import SessionAnswers, rpc_error, rpc_result
from tracegym.interop.openenv_protocol import (
    ResetChoice,
    TasksetAction,
    TasksetState,
    TooDeep,
    error_frame,
    loads,
    schemas,
    step_result,
)
from tracegym.interop.openenv_session import SessionError, TaskPicker, TasksetSession
from tracegym.interop.openenv_settings import OpenEnvSettings
from tracegym.interop.openenv_task_api import TaskListing
from tracegym.interop.openenv_workers import RemoteSession, SessionWorkers
from tracegym.serve.curve import shared_secret
from tracegym.serve.wire import SECRET_ENV, is_loopback

log = logging.getLogger("tracegym.interop.openenv_server")

Reply = tuple[dict[str, Any] | None, bool]
"""A WebSocket message's answer (None: none) and whether the session goes on."""


class BodyTooLarge(Exception):
    """An HTTP body over the server's limit (answered 413)."""


@dataclass(eq=False)
class Held:
    """A session the server holds: its rollouts, its WebSocket (None for one made over HTTP MCP until a WebSocket
    joins it), and since when it has waited for its client (None: it is answering one now)."""

    session: TasksetSession | RemoteSession
    websocket: WebSocket | None = None
    idle_since: float | None = field(default_factory=time.monotonic)

    def idle(self, now: float) -> float:
        return 0.0 if self.idle_since is None else now - self.idle_since


class OpenEnvServer:
    """The ASGI app (`.app`) serving one taskset; `serve` runs it in the foreground, `running` in a thread.
    `source`: the taskset's id and options as its workers load it (default: its id and config)."""

    def __init__(self, taskset: Taskset, settings: OpenEnvSettings | None = None, *,
                 source: tuple[str, dict[str, Any]] | None = None, secret: str | None = None,
                 **fields: Any) -> None:
        self.settings = OpenEnvSettings.model_validate({**(settings or OpenEnvSettings()).model_dump(), **fields})
        check_adapter_fit(taskset, "an OpenEnv session")
        self.others = opponent_seats(taskset, self.settings)
        """With a multi-agent taskset: the other members' binding (the agent plays `settings.seat`)."""
        self.taskset, self.picker = taskset, TaskPicker(taskset)
        self.source = source or (taskset.id, taskset.config.model_dump(mode="json"))
        self.secret = secret
        self.held: dict[str, Held] = {}
        """The sessions open now, by id."""
        self.workers: SessionWorkers | None = None
        """The worker processes holding the sessions, while serving with workers."""
        self.app = Starlette(routes=[
            Route("/health", lambda _: JSONResponse({"status": "healthy"})),
            Route("/schema", self._guard(lambda _: JSONResponse(schemas()))),
            Route("/metadata", self._guard(lambda _: JSONResponse(
                {"name": taskset.id, "description": taskset.description or f"tracegym taskset {taskset.id}"}))),
            Route("/state", self._guard(lambda _: JSONResponse(TasksetState().model_dump()))),
            Route("/reset", self._guard(self._http_reset), methods=["POST"]),
            Route("/step", self._guard(self._http_step), methods=["POST"]),
            Route("/mcp", self._guard(self._http_mcp), methods=["POST"]),
            WebSocketRoute("/ws", self._websocket),
            *TaskListing(taskset.id, self.picker.rows, self._guard, self._body).routes,
        ])
        self.answers = SessionAnswers(self.picker, self.settings.max_frame_bytes)

    @classmethod
    def from_settings(cls, taskset: Taskset, settings: OpenEnvSettings,
                      source: tuple[str, dict[str, Any]] | None = None) -> OpenEnvServer:
        """A server with these settings and the shared secret in force ($TRACEGYM_ENV_SECRET), if any."""
        return cls(taskset, settings, source=source, secret=shared_secret(None))

    @property
    def active(self) -> int:
        """Sessions open now."""
        return len(self.held)

    # --- running -----------------------------------------------------------------------------------------
    def bind(self, host: str | None = None, port: int = 0) -> socket.socket:
        """A listening socket (port 0: a free one); a host other than loopback needs the secret and TLS."""
        host = host or self.settings.host
        if not is_loopback(f"tcp://{host}:0"):
            if not self.secret:
                raise UsageError(f"serving on {host} (not loopback) needs a shared secret: set {SECRET_ENV}")
            if self.settings.tls_certfile is None:
                raise UsageError(f"serving on {host} (not loopback) over plain HTTP would send the shared secret in "
                                 "clear: give --openenv.tls-certfile and --openenv.tls-keyfile (or serve on loopback "
                                 "behind a TLS proxy)")
        return listen(host, port)

    @property
    def scheme(self) -> str:
        """`wss` with TLS, else `ws`."""
        return "wss" if self.settings.tls_certfile is not None else "ws"

    def uvicorn_server(self) -> uvicorn.Server:
        # frames up to 4x our own limit reach us and are answered; past it uvicorn closes the socket (1009).
        # No per-message deflate: compressing small JSON frames costs more CPU than the bytes it saves on loopback
        s = self.settings
        return uvicorn.Server(uvicorn.Config(
            self.app, log_level="warning", lifespan="off", ws_ping_interval=None, ws_per_message_deflate=False,
            ws_max_size=max(16 << 20, 4 * s.max_frame_bytes), http=header_deadline(s.header_timeout),
            ssl_certfile=s.tls_certfile, ssl_keyfile=s.tls_keyfile))

    async def serve_async(self, sock: socket.socket, server: uvicorn.Server | None = None) -> None:
        """Answer on `sock` (with the worker pool, if any) until `server` (default: a new one) exits."""
        server = server or self.uvicorn_server()
        if not self.settings.workers:
            await server.serve(sockets=[sock])
            return
        async with SessionWorkers(*self.source, self.settings).running() as workers:
            self.workers = workers
            try:
                await server.serve(sockets=[sock])
            finally:
                self.workers = None

    def serve(self, sock: socket.socket) -> None:
        """Answer on `sock` until SIGINT or SIGTERM."""
        with asyncio.Runner(loop_factory=self.loop_factory()) as runner:
            runner.run(self.serve_async(sock))

    @contextlib.contextmanager
    def running(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """Serve in a background thread for the `with` block; yields the `ws://HOST:PORT` URL."""
        sock, server = self.bind(host, port), self.uvicorn_server()
        with serving(self.app, host, port, server=server, sock=sock, serve=self.serve_async(sock, server),
                     scheme=self.scheme, loop_factory=self.loop_factory()) as url:
            yield url

    def loop_factory(self) -> Callable[[], asyncio.AbstractEventLoop] | None:
        """uvloop's event loop where it is installed and the sessions live in workers (this process then runs no
        task code: a task's sandbox needs asyncio's own subprocess transports); else asyncio's (None). Each frame
        passes through this process twice, so its loop's cost per wake-up is most of the worker hop's."""
        if not self.settings.workers:
            return None
        try:
            import uvloop
        except ImportError:
            return None
        return uvloop.new_event_loop

    def _new_session(self) -> TasksetSession | RemoteSession:
        """A session in a worker, while serving with workers; else in this process."""
        if self.workers is not None:
            return self.workers.session()
        return TasksetSession(self.taskset, self.picker)

    # --- holding sessions --------------------------------------------------------------------------------
    async def _admit(self) -> dict[str, Any] | None:
        """Make room for one more session: None when there is (closing sessions past their time, or the one idle
        longest past `reap_idle_after` when full); else the CAPACITY_REACHED frame."""
        now, s = time.monotonic(), self.settings
        for sid, held in list(self.held.items()):  # a session made over HTTP has no loop to time it out
            if held.websocket is None and s.session_timeout is not None and held.idle(now) > s.session_timeout:
                await self._drop(sid, f"session idle for more than {s.session_timeout:g} s: closed")
        if self.active < s.max_concurrent_envs:
            return None
        sid, held = max(self.held.items(), key=lambda item: item[1].idle(now))
        if s.reap_idle_after is not None and held.idle(now) > s.reap_idle_after:
            await self._drop(sid, f"session idle for {held.idle(now):.0f} s while the server was full: closed to "
                                  "make room")
            return None
        return error_frame(WSErrorCode.CAPACITY_REACHED, f"server at capacity: {self.active}/{s.max_concurrent_envs} "
                           "sessions active", active_sessions=self.active, max_sessions=s.max_concurrent_envs)

    def _open(self, websocket: WebSocket | None) -> tuple[str, Held]:
        sid = uuid.uuid4().hex
        self.held[sid] = held = Held(self._new_session(), websocket)
        return sid, held

    async def _drop(self, sid: str, why: str | None = None) -> None:
        """Stop holding a session: end its rollout, and close its WebSocket (saying `why`, if given)."""
        held = self.held.pop(sid, None)
        if held is None:
            return
        if held.websocket is not None and why is not None:
            await _refuse(held.websocket, error_frame(WSErrorCode.SESSION_ERROR, why))
        await held.session.close()

    # --- WebSocket sessions ------------------------------------------------------------------------------
    async def _websocket(self, websocket: WebSocket) -> None:
        await websocket.accept()
        if not self._authorized(websocket.headers.get("authorization")):
            await _refuse(websocket, error_frame(WSErrorCode.SESSION_ERROR, "unauthorized: send the shared secret "
                                                 "as `Authorization: Bearer SECRET`"), code=1008)
            return
        joining = websocket.query_params.get("session_id")
        if joining is not None:
            held = self.held.get(joining)
            if held is None or held.websocket is not None:
                await _refuse(websocket, error_frame(WSErrorCode.SESSION_ERROR, f"no session {joining!r} to join (or "
                                                     "one WebSocket joined it already)"))
                return
            sid, held.websocket = joining, websocket
        else:
            refusal = await self._admit()
            if refusal is not None:
                await _refuse(websocket, refusal)
                return
            sid, held = self._open(websocket)
        try:
            await self._converse(websocket, held)
        except WebSocketDisconnect:
            pass
        finally:
            if self.held.get(sid) is held:
                await self._drop(sid)

    async def _converse(self, websocket: WebSocket, held: Held) -> None:
        timeout = self.settings.session_timeout
        with IdleWatch(held, timeout) as watch:
            while True:
                held.idle_since = time.monotonic()
                try:
                    message = await websocket.receive()
                except asyncio.CancelledError:
                    if not watch.ended():
                        raise
                    await _refuse(websocket, error_frame(WSErrorCode.SESSION_ERROR, f"session idle for more than "
                                                         f"{timeout:g} s: closed"))
                    return
                if not await self._turn(websocket, held, message):
                    return

    async def _turn(self, websocket: WebSocket, held: Held, message: MutableMapping[str, Any]) -> bool:
        """Answer one WebSocket message; whether the session goes on."""
        if message["type"] == "websocket.disconnect":
            return False
        held.idle_since = None
        reply, goes_on = await self._answer(held.session, message.get("text") or message.get("bytes") or b"")
        if reply is not None:
            await websocket.send_text(reply)
        if not goes_on:
            await websocket.close()
        return goes_on

    async def _answer(self, session: TasksetSession | RemoteSession, frame: str | bytes) -> tuple[str | None, bool]:
        """One frame's reply (JSON text; None: none) and whether the session goes on: answered here, or passed
        unread to the session's worker (after the size check, so an oversized frame never crosses)."""
        if isinstance(session, TasksetSession):
            reply, goes_on = await self.answers.answer(session, frame)
            return (None if reply is None else json.dumps(reply)), goes_on
        refusal = self.answers.oversized(frame)
        if refusal is not None:
            return json.dumps(refusal), True
        return await session.answer(frame.encode() if isinstance(frame, str) else frame)

    async def _rpc(self, request: JsonRpcRequest, session: TasksetSession | RemoteSession | None) -> dict[str, Any]:
        if isinstance(session, RemoteSession):
            return await session.rpc(request.model_dump(mode="json", exclude_none=True))
        return await self.answers.rpc(request, session)

    # --- HTTP --------------------------------------------------------------------------------------------
    async def _http_reset(self, request: Request) -> JSONResponse:
        """A one-off rollout's prompt (OpenEnv's HTTP reset keeps no session)."""
        try:
            choice = ResetChoice.model_validate(await self._body(request))
            session = self._new_session()
            try:
                if isinstance(session, TasksetSession):
                    return JSONResponse(step_result(await session.reset(choice)))
                frame = json.dumps({"type": "reset", "data": choice.model_dump(exclude_none=True)}).encode()
                text, _ = await session.answer(frame)
                reply = json.loads(text or "{}")
                if reply.get("type") != "observation":
                    return JSONResponse({"detail": reply.get("data", {}).get("message", reply)}, 400)
                return JSONResponse(reply["data"])
            finally:
                await session.close()
        except ValidationError as exc:
            return JSONResponse({"detail": json.loads(exc.json(include_url=False, include_context=False))}, 422)
        except (SessionError, UsageError) as exc:
            return JSONResponse({"detail": str(exc)}, 400)

    async def _http_step(self, request: Request) -> JSONResponse:
        try:
            TasksetAction.model_validate(StepRequest.model_validate(await self._body(request)).action)
        except ValidationError as exc:
            return JSONResponse({"detail": json.loads(exc.json(include_url=False, include_context=False))}, 422)
        return JSONResponse({"detail": "a step needs a session: open a WebSocket at /ws (one session each), reset, "
                                       "then step"}, 409)

    async def _http_mcp(self, request: Request) -> JSONResponse:
        try:
            rpc = JsonRpcRequest.model_validate(await self._body(request))
        except ValidationError as exc:
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {
                "code": JsonRpcErrorCode.INVALID_REQUEST.value, "message": f"Invalid request: {exc}"}})
        if rpc.method == "openenv/session/create":
            refusal = await self._admit()
            if refusal is not None:
                return JSONResponse(rpc_error(rpc, JsonRpcErrorCode.INTERNAL_ERROR, refusal["data"]["message"]))
            return JSONResponse(rpc_result(rpc, {"session_id": self._open(None)[0]}))
        sid = rpc.params.get("session_id")
        held = self.held.get(sid) if isinstance(sid, str) else None
        if sid is not None and held is None:
            return JSONResponse(rpc_error(rpc, JsonRpcErrorCode.INVALID_PARAMS, f"Unknown session_id: {sid}"))
        if rpc.method == "openenv/session/close":
            if held is None:
                return JSONResponse(rpc_error(rpc, JsonRpcErrorCode.INVALID_PARAMS, "`session_id` is required"))
            await self._drop(sid, "session closed by openenv/session/close")
            return JSONResponse(rpc_result(rpc, {"session_id": sid, "closed": True}))
        if held is None:
            return JSONResponse(await self._rpc(rpc, None))
        held.idle_since = None
        try:
            return JSONResponse(await self._rpc(rpc, held.session))
        finally:
            held.idle_since = time.monotonic()

    async def _body(self, request: Request) -> Any:
        """The body's JSON (its text when it is not JSON: validation then names it); BodyTooLarge past the limit
        (refused by its declared length before it is read, else as it arrives)."""
        limit = self.settings.max_frame_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(f"a body of {declared} bytes is over this server's limit of {limit} bytes")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise BodyTooLarge(f"a body over this server's limit of {limit} bytes")
        try:
            return loads(bytes(raw)) if raw.strip() else {}
        except TooDeep:
            raise
        except ValueError:
            return raw.decode(errors="replace")  # not JSON: validation says so, naming the body

    def _guard(self, endpoint: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Any]]:
        async def guarded(request: Request) -> Any:
            if not self._authorized(request.headers.get("authorization")):
                return JSONResponse({"detail": "unauthorized: send `Authorization: Bearer SECRET`"}, 401)
            try:
                answer = endpoint(request)
                return await answer if asyncio.iscoroutine(answer) else answer
            except BodyTooLarge as exc:
                return JSONResponse({"detail": str(exc)}, 413, headers={"connection": "close"})
            except TooDeep as exc:
                return JSONResponse({"detail": str(exc)}, 400)
        return guarded

    def _authorized(self, header: str | None) -> bool:
        if not self.secret:
            return True
        return hmac.compare_digest((header or "").encode(), f"Bearer {self.secret}".encode())


class IdleWatch:
    """`with IdleWatch(held, timeout) as watch:` cancels the block's task once `held` has waited for its client
    for `timeout` seconds (None: never); `watch.ended()` then says so (and takes the cancellation back). One timer
    for the session, moved on only when it fires, rather than one set and cancelled per message."""

    def __init__(self, held: Held, timeout: float | None) -> None:
        self.held, self.timeout = held, timeout
        self.task: asyncio.Task[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.fired = False
        self.cancelling = 0
        """Cancellations the task had pending when the watch began."""

    def __enter__(self) -> IdleWatch:
        if self.timeout is not None:
            self.task = asyncio.current_task()
            self.cancelling = self.task.cancelling() if self.task is not None else 0
            self._arm(time.monotonic() + self.timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def ended(self) -> bool:
        """Whether the watch, and nothing else, cancelled the task (its cancellation then taken back), as
        `asyncio.timeout` tells its own cancellation from others'."""
        if not self.fired or self.task is None:
            return False
        return self.task.uncancel() <= self.cancelling

    def _arm(self, when: float) -> None:  # (time.monotonic is the loop's clock)
        self.timer = asyncio.get_running_loop().call_at(when, self._check)

    def _check(self) -> None:
        assert self.timeout is not None and self.task is not None
        since, now = self.held.idle_since, time.monotonic()
        if since is None or now - since < self.timeout:
            self._arm((now if since is None else since) + self.timeout)
            return
        self.timer, self.fired = None, True
        self.task.cancel()


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket whose connections send at once (TCP_NODELAY, inherited by each accepted socket: asyncio
    sets it only on sockets it made itself, and without it a reply written in two parts, as uvicorn writes an HTTP
    response, waits ~40 ms for the peer's delayed ACK)."""
    sock = socket.create_server((host, port), reuse_port=False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def opponent_seats(taskset: Taskset, settings: OpenEnvSettings) -> dict[str, Seat]:
    """For a multi-agent taskset, the members other than `settings.seat`, each played by `settings.opponent`
    (none for a single-agent one); a UsageError naming the seats when the settings cannot serve it."""
    if not is_multi_agent(taskset):
        if settings.seat is not None or settings.opponent is not None:
            raise UsageError(f"taskset {taskset.id!r} is single-agent: --openenv.seat and --openenv.opponent are for "
                             "multi-agent tasksets")
        return {}
    task = taskset.task(taskset[0])
    members = task.members if isinstance(task, MultiAgentTask) else []
    if settings.seat not in members or settings.opponent is None or not settings.workers:
        raise UsageError(f"taskset {taskset.id!r} is multi-agent (seats: {', '.join(members)}): an OpenEnv agent plays "
                         "one seat, given by --openenv.seat NAME, and the others are played by --openenv.opponent "
                         "(--openenv.opponent.base-url URL --openenv.opponent.model NAME), in worker processes "
                         "(--openenv.workers 1 or more)")
    return {m: Seat(model=settings.opponent, trainable=False) for m in members if m != settings.seat}


async def _refuse(websocket: WebSocket, frame: dict[str, Any], code: int = 1000) -> None:
    """Say why in an error frame, then close (as openenv's server refuses a session)."""
    with contextlib.suppress(Exception):  # the peer may be gone already
        await websocket.send_text(json.dumps(frame))
        await websocket.close(code)


def header_deadline(seconds: float) -> type[HttpToolsProtocol]:
    """uvicorn's HTTP protocol with a deadline for each request's headers (a WebSocket handshake's too): a connection
    that has not sent them in time is closed, so slow or silent clients cannot hold sockets (uvicorn itself times
    out only idle keep-alive connections)."""

    class HeaderDeadline(HttpToolsProtocol):
        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self.deadline is None:
                self.deadline = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _too_slow(self) -> None:
            self.deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadline


@contextlib.contextmanager
def serving(app: Any, host: str = "127.0.0.1", port: int = 0, *, server: uvicorn.Server | None = None,
            sock: socket.socket | None = None, serve: Awaitable[None] | None = None,
            scheme: str = "ws", loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> Iterator[str]:
    """Run an ASGI app (ours, or one of openenv's `create_app`) under uvicorn in a daemon thread for the `with`
    block (`serve`: the coroutine that runs `server`, if not its own `serve`; on `loop_factory`'s loop, if given);
    yields its `ws://HOST:PORT` URL once it accepts connections."""
    sock = sock or socket.create_server((host, port))
    server = server or uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_ping_interval=None))
    main = serve or server.serve(sockets=[sock])

    def run() -> None:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(main)  # type: ignore[arg-type]
    thread = threading.Thread(target=run, daemon=True, name=f"uvicorn:{sock.getsockname()[1]}")
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the OpenEnv server thread ended before it started; see its log")
            threading.Event().wait(0.005)
        yield f"{scheme}://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
