"""Interception proxy: an OpenAI-compatible chat-completions endpoint through which an agent program calls its
rollout's model, every call landing in that rollout's message graph.

One aiohttp server per event loop (an env worker's) serves every rollout running there, on 127.0.0.1 and on a Unix
socket (`<temp>/tracegym-proxy-*/proxy.sock`): a program in a sandbox without network reaches the socket through its
own loopback (`ProxyLease.forward`, carried by the sandbox's program init), at the same base URL as a program on the
host's network (only the process-group fallback, which has no network namespace, calls the TCP port itself). A
rollout is named by a secret key, in the path (`/r/<key>/v1`, the base URL a program is given) or as the API key at
`/v1`. A call goes through the rollout's own model client (`Rollout.call_model`: the model stage's timeout and the
client's retries, exact tokens and logprobs from the token client), so the graph records it as a loop's turn: a
request that resends the branch's conversation extends it; one whose history was rewritten or compacted is attached
where it stops matching, a new branch, and the token check of `add_model_turn` never lets stale tokens stand in for
the new prompt. Calls of one rollout are answered one at a time, in order of arrival.

Sampling is the rollout's (temperature, top-p, seed: what training needs recorded); a request may lower
`max_tokens` and add stop strings. `stream: true` is answered as server-sent events relayed while the model
samples (`envs.program_reply.Relay`: the rollout's client streams from the endpoint, and the trace records the
same tokens, logprobs and finish reason as for the call unstreamed); with a client that does not stream, the
whole reply comes in one piece once the call returns. A call with an unknown key gets 401, one for a finished
rollout 404, a malformed one 400, each with an OpenAI-style error body. A call that fails (a malformed body, the
model stage's timeout, the endpoint down, the context overflowing, `max_turns` spent) is recorded on the trace at
its stage and ends the rollout, as the same failure ends a loop's rollout; once part of a streamed reply was sent,
the failure comes as an `error` event instead (and is not retried: what was sent cannot be taken back). A program
that closes its connection mid-stream cancels its call: the model stops, the reply is not recorded, the rollout
goes on and counts it (`calls_abandoned`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import shutil
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from tracegym.core.errors import ErrorKind, StageTimeout, TaskError, TracegymError
from tracegym.core.graph import MessageGraph
from tracegym.core.messages import Message
from tracegym.core.sampling import Sampling
from tracegym.core.tool_spec import ToolSpec
from tracegym.core.trace import StopReason
from tracegym.envs.program_reply import Relay, completion_body, usage_of
from tracegym.envs.rollout import CALLS_ABANDONED, Ended, Rollout
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.runtimes.sandbox import Forward

log = logging.getLogger(__name__)
FINISHED_KEYS_KEPT = 4096
"""Keys of finished rollouts remembered, so that a late call hears 404 (finished) rather than 401 (unknown)."""


class CallRefused(Exception):
    """A call the proxy answers with an OpenAI-style error (status, message, type, code)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict[str, Any]:
        """The error body, as OpenAI's API answers one (and streams one)."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        """The error as OpenAI's API answers one."""
        return web.json_response(self.body(), status=self.status)


@dataclass
class ProxyLease:
    """One rollout's lease on the proxy: its key and base URL, how many calls it made, whether the last reply was
    cut by the completion budget, and `ended`, set to the stop reason when a call's failure ended the rollout."""

    rollout: Rollout
    key: str
    base_url: str
    forward: Forward
    """The proxy's port and Unix socket, for `Sandbox.run(forward=...)`."""
    calls: int = 0
    truncated: bool = False
    ended: asyncio.Future[StopReason] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    in_flight: set[asyncio.Task[Any]] = field(default_factory=set)
    """Its model calls under way, cancelled when the lease ends."""
    handlers: set[asyncio.Task[Any]] = field(default_factory=set)
    """The HTTP handlers awaiting them, given a moment to answer when it ends."""
    seen: list[tuple[Any, Message]] = field(default_factory=list)
    """The last call's messages as sent and as read (see `parse_call`)."""
    tools: Sequence[ToolSpec] = ()
    """The last call's tools: a call with others is rendered in full (they are in the prompt's first tokens)."""

    def end(self, reason: StopReason) -> None:
        """End the rollout for `reason` (its error already recorded); the first reason stays."""
        if not self.ended.done():
            self.ended.set_result(reason)


class InterceptionProxy:
    """`async with InterceptionProxy.shared().lease(rollout) as lease:` gives a program `lease.base_url`
    and `lease.key`; the server runs while any lease is open."""

    _per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, InterceptionProxy] = weakref.WeakKeyDictionary()

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port: int | None = None
        self.socket: Path | None = None
        """The Unix socket it also listens on (while it runs)."""
        self._runner: web.AppRunner | None = None
        self._leases: dict[str, ProxyLease] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._starting = asyncio.Lock()

    @classmethod
    def shared(cls) -> InterceptionProxy:
        """This event loop's proxy (one per env worker), made on first use."""
        loop = asyncio.get_running_loop()
        proxy = cls._per_loop.get(loop)
        if proxy is None:
            proxy = cls._per_loop[loop] = cls()
        return proxy

    @property
    def url(self) -> str:
        """The server's root URL (while it runs)."""
        return f"http://{self.host}:{self.port}"

    @contextlib.asynccontextmanager
    async def lease(self, rollout: Rollout) -> AsyncIterator[ProxyLease]:
        """A key for `rollout`, valid until the block exits; then its calls still in flight are cancelled and
        later ones refused."""
        await self._start()
        key = secrets.token_urlsafe(18)
        assert self.port is not None and self.socket is not None
        lease = ProxyLease(rollout, key, f"{self.url}/r/{key}/v1", Forward(self.port, self.socket))
        self._leases[key] = lease
        try:
            yield lease
        finally:
            del self._leases[key]
            self._finished[key] = None
            while len(self._finished) > FINISHED_KEYS_KEPT:
                self._finished.popitem(last=False)
            calls, handlers = list(lease.in_flight), list(lease.handlers)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            if handlers:  # let them answer 404 before the server may stop
                await asyncio.wait(handlers, timeout=1.0)
            if not self._leases:
                await self._stop()

    # --- the server --------------------------------------------------------------------------------------
    async def _start(self) -> None:
        async with self._starting:
            if self._runner is not None:
                return
            app = web.Application(client_max_size=64 * 1024 * 1024)
            for prefix in ("/r/{key}/v1", "/v1"):
                app.router.add_post(prefix + "/chat/completions", self._chat)
                app.router.add_get(prefix + "/models", self._models)
            app.router.add_route("*", "/{tail:.*}", self._not_found)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, self.host, 0).start()
            folder = Path(tempfile.mkdtemp(prefix="tracegym-proxy-"))
            folder.chmod(0o711)  # a sandbox's uid may reach the socket, not list or change the folder
            socket = folder / "proxy.sock"
            await web.UnixSite(runner, str(socket)).start()
            socket.chmod(0o666)  # a call still needs its rollout's secret key
            self._runner, self.port, self.socket = runner, runner.addresses[0][1], socket

    async def _stop(self) -> None:
        async with self._starting:
            if self._runner is not None and not self._leases:
                runner, socket, self._runner, self.port, self.socket = self._runner, self.socket, None, None, None
                await runner.cleanup()
                if socket is not None:
                    shutil.rmtree(socket.parent, ignore_errors=True)

    # --- handlers ----------------------------------------------------------------------------------------
    async def _chat(self, http: web.Request) -> web.StreamResponse:
        relay: Relay | None = None
        try:
            lease = self._lease_of(http)
            relay = Relay(http, lease.rollout.model.name)
            call = relay.call = asyncio.create_task(self._answer(lease, await http.read(), relay))
            _track(lease.in_flight, call)
            _track(lease.handlers, asyncio.current_task())
            try:
                response, program_call = await call
            except asyncio.CancelledError:
                if not call.cancelled() or _cancelling():  # the handler itself is being cancelled
                    raise
                if relay.gone:  # the program closed its connection mid-stream
                    lease.rollout.count(CALLS_ABANDONED, 1)
                    return relay.response or web.Response()
                raise self._finished_refusal(lease.key) from None
        except CallRefused as refused:
            if relay is None or not relay.shown:
                return refused.response()
            await relay.fail(refused.body())  # part of the reply was sent: a status can no longer be
            return relay.response or web.Response()
        return await _reply(relay, response, program_call)

    async def _models(self, http: web.Request) -> web.Response:
        try:
            lease = self._lease_of(http)
        except CallRefused as refused:
            return refused.response()
        model = {"id": lease.rollout.model.name, "object": "model", "created": 0, "owned_by": "tracegym"}
        return web.json_response({"object": "list", "data": [model]})

    async def _not_found(self, http: web.Request) -> web.Response:
        return CallRefused(404, f"no route {http.method} {http.path}: this proxy answers POST "
                                f"/r/<key>/v1/chat/completions", code="unknown_url").response()

    def _lease_of(self, http: web.Request) -> ProxyLease:
        """The lease the path's key (else the bearer API key) names; 401 unknown, 404 finished."""
        key = http.match_info.get("key") or _bearer(http.headers.get("Authorization", ""))
        lease = self._leases.get(key or "")
        if lease is not None:
            return lease
        if key is not None and key in self._finished:
            raise self._finished_refusal(key)
        raise CallRefused(401, "Incorrect API key provided: this proxy knows no running rollout by that key "
                               "(it is in the base URL /r/<key>/v1 or the Authorization header)",
                          code="invalid_api_key")

    @staticmethod
    def _finished_refusal(key: str) -> CallRefused:
        return CallRefused(404, f"the rollout of key {key[:6]}... has finished (or passed its deadline); it takes "
                                f"no more calls", code="rollout_finished")

    # --- one call ----------------------------------------------------------------------------------------
    async def _answer(self, lease: ProxyLease, raw: bytes, relay: Relay) -> tuple[ModelResponse, ProgramCall]:
        """The model's reply to one call (and the call, which says how to send it), recorded on the rollout and
        streamed through `relay` when the call asks; a failure is recorded there too, ends the rollout, and is
        raised as the program's CallRefused."""
        async with lease.lock:
            if lease.ended.done():
                raise self._finished_refusal(lease.key)
            rollout = lease.rollout
            try:
                call = parse_call(raw, rollout.sampling, lease.seen)
            except CallRefused as refused:
                rollout.error_from(TaskError(f"the program sent a malformed chat-completions request: "
                                             f"{refused.message}"), "model")
                lease.end(StopReason.ERROR)
                raise
            if lease.calls >= rollout.task.max_turns:
                lease.end(StopReason.MAX_TURNS)
                raise CallRefused(429, f"this rollout allows {rollout.task.max_turns} model calls (max_turns); "
                                       f"it has ended", type="rate_limit_error", code="max_turns")
            response = await self._call_model(lease, call, relay if call.stream else None)
        lease.truncated = response.finish_reason == "length"
        return response, call

    async def _call_model(self, lease: ProxyLease, call: ProgramCall, relay: Relay | None) -> ModelResponse:
        rollout = lease.rollout
        graph = rollout.trace.graph
        if not graph.nodes:
            rollout.trace.prompt_length = len(call.messages)
        attach(graph, call.messages)
        # the branch's tokens were rendered with the previous call's tools: with other tools they are stale, and
        # a full render makes add_model_turn fork a branch whose prompt has the new ones
        prefix = graph.token_prefix() if call.tools == lease.tools else None
        lease.tools = call.tools
        if relay is not None:
            relay.stops = call.sampling.stop
        request = ModelRequest(messages=graph.messages(), tools=list(call.tools), sampling=call.sampling,
                               prefix=prefix, stream=relay)
        rollout.turn, lease.calls = lease.calls, lease.calls + 1
        try:
            return await rollout.call_model(request)
        except Ended as ended:  # the context overflowed: recorded by call_model
            lease.end(ended.reason)
            raise CallRefused(400, rollout.trace.errors[-1].message, code="context_length_exceeded") from None
        except Exception as exc:  # recorded and ended as a loop's model stage is
            rollout.error_from(exc, "model")
            lease.end(StopReason.after(exc))
            raise _refusal_for(exc) from None


async def _reply(relay: Relay, response: ModelResponse, call: ProgramCall) -> web.StreamResponse:
    """The reply as one body, or the rest of its stream (`relay`)."""
    if not call.stream:
        return web.json_response(completion_body(response, relay.model))
    await relay.finish(response, usage_of(response) if call.include_usage else None)
    if relay.diverged:  # the program's next call resends what it was shown, and forks there
        log.warning("a streamed reply changed after part of it was shown (the parse of the whole reply differs from "
                    "the parse so far); the program holds what it was shown, the trace the whole reply")
    return relay.response or web.Response()


def _track(tasks: set[asyncio.Task[Any]], task: asyncio.Task[Any] | None) -> None:
    if task is not None:
        tasks.add(task)
        task.add_done_callback(tasks.discard)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _bearer(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _refusal_for(exc: BaseException) -> CallRefused:
    """What the program hears when the model call failed (a 5xx its SDK may retry: the rollout has ended, so a
    retry hears 404)."""
    if isinstance(exc, StageTimeout):
        return CallRefused(504, str(exc), type="timeout", code="model_timeout")
    kind = exc.kind if isinstance(exc, TracegymError) else ErrorKind.MODEL
    return CallRefused(502, f"the model call failed ({kind.value}): {exc}", type="api_error", code="model_failed")


# --- requests and replies in OpenAI's shape ----------------------------------------------------------------
@dataclass(frozen=True)
class ProgramCall:
    """One chat-completions request of a program, checked: its conversation, tools, sampling, streaming."""

    messages: list[Message]
    tools: Sequence[ToolSpec]
    sampling: Sampling
    stream: bool
    include_usage: bool


def parse_call(raw: bytes, sampling: Sampling, seen: list[tuple[Any, Message]] | None = None) -> ProgramCall:
    """The call in `raw`, sampled with the rollout's `sampling` (the request may lower `max_tokens` and add stop
    strings); a CallRefused (400) naming the field at fault. `seen` holds the previous call's messages as sent and
    as read: those sent again, in the same places, are not read again (an agent resends its whole history)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CallRefused(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise CallRefused(400, "the body must be a JSON object")
    messages = _messages(body.get("messages"), [] if seen is None else seen)
    if body.get("n", 1) != 1:
        raise CallRefused(400, "n must be 1: a rollout samples one reply per call", param="n")
    stream_options = body.get("stream_options") or {}
    return ProgramCall(messages, _tools(body.get("tools")), _sampling(body, sampling), bool(body.get("stream")),
                       bool(isinstance(stream_options, dict) and stream_options.get("include_usage")))


def _messages(value: Any, seen: list[tuple[Any, Message]]) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise CallRefused(400, "'messages' must be a non-empty list of messages", param="messages")
    out = []
    for index, item in enumerate(value):
        if index < len(seen) and seen[index][0] == item:
            out.append(seen[index][1])
            continue
        try:
            if not isinstance(item, dict):
                raise ValueError("not an object")
            out.append(Message.from_openai(item))
        except (KeyError, ValueError, ValidationError) as exc:
            said = _first_line(exc) if not isinstance(exc, KeyError) else f"missing {exc}"
            raise CallRefused(400, f"messages[{index}] is not a chat message: {said}",
                              param=f"messages[{index}]") from None
    seen[:] = zip(value, out, strict=True)
    return out


def _tools(value: Any) -> list[ToolSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise CallRefused(400, "'tools' must be a list", param="tools")
    out = []
    for index, item in enumerate(value):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise CallRefused(400, f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                              param=f"tools[{index}]")
        out.append(ToolSpec(name=function["name"], description=function.get("description") or "",
                            parameters=function.get("parameters") or {"type": "object", "properties": {}}))
    return out


def _sampling(body: dict[str, Any], sampling: Sampling) -> Sampling:
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    if asked is not None and (not isinstance(asked, int) or asked < 1):
        raise CallRefused(400, f"max_tokens must be a positive integer, not {asked!r}", param="max_tokens")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise CallRefused(400, "'stop' must be a string or a list of strings", param="stop")
    limit = sampling.max_tokens if asked is None else min(asked, sampling.max_tokens or asked)
    if limit == sampling.max_tokens and not stop:
        return sampling
    return sampling.model_copy(update={"max_tokens": limit, "stop": [*sampling.stop, *stop]})


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


# --- the graph ---------------------------------------------------------------------------------------------
def attach(graph: MessageGraph, messages: Sequence[Message]) -> None:
    """Make the graph's head end a path whose conversation is `messages`: the longest path already there that
    starts the conversation (the newest among equals) is extended by the rest; a conversation that matches
    nothing starts a new root. Assistant turns the program resends match the reply they were given (extra fields
    its SDK dropped or added aside), so a resent history reuses those nodes and their tokens."""
    best, best_depth = _along_the_head(graph, messages)
    if best is None:
        best, best_depth = _longest_match(graph, messages)
    rest = list(messages[best_depth:])
    if not rest and best != graph.head:  # the whole conversation is an older path: answer it on a sibling
        assert best is not None
        best, rest = graph.nodes[best].parent, [messages[-1]]
    parent = best
    for message in rest:
        parent = graph.add(message, parent=parent).id


def _along_the_head(graph: MessageGraph, messages: Sequence[Message]) -> tuple[int | None, int]:
    """The head and its depth when its whole path starts the conversation (an agent resending its history: the
    common case, checked first); else (None, 0)."""
    path = graph.path()
    if not path or len(path) > len(messages):
        return None, 0
    for node, sent in zip(path, messages, strict=False):
        if node.message is not sent and not same_message(node.message, sent):
            return None, 0
    return path[-1].id, len(path)


def _longest_match(graph: MessageGraph, messages: Sequence[Message]) -> tuple[int | None, int]:
    """The deepest node whose path starts the conversation (the newest among equals) and its depth."""
    depth: dict[int, int] = {}
    best, best_depth = None, 0
    for node in graph.nodes:  # parents come before children, so one pass finds every matching path
        matched = 0 if node.parent is None else depth.get(node.parent)
        if matched is None or matched >= len(messages) or not same_message(node.message, messages[matched]):
            continue
        depth[node.id] = matched + 1
        if matched + 1 >= best_depth:
            best, best_depth = node.id, matched + 1
    return best, best_depth


def same_message(stored: Message, sent: Message) -> bool:
    """Whether a resent message is the stored one: role, content (None and "" alike), tool calls and the call
    answered; a name or reasoning text the program's SDK dropped or added does not count."""
    return (stored.role == sent.role and (stored.content or "") == (sent.content or "")
            and stored.tool_calls == sent.tool_calls and stored.tool_call_id == sent.tool_call_id)
