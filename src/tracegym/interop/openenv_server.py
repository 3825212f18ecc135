"""OpenEnv server: any tracegym taskset served over OpenEnv's HTTP and WebSocket protocol (Starlette on uvicorn).

Each WebSocket at `/ws` is one session (`TasksetSession`): `reset` picks a task (by `index`, `seed` or `key`) and
answers with its prompt; `step` takes the agent's message or tool calls and answers with what the environment
added, and the reward once `done`; `state`, `close`, and `mcp` (JSON-RPC `tools/list`, `tools/call`). Sessions are
isolated (each its own rollout), at most `max_concurrent_envs` at once (past it: `CAPACITY_REACHED`), and one idle
for `session_timeout` seconds is told so (`SESSION_ERROR`) and closed. Bad input gets OpenEnv's error frames
(`INVALID_JSON`, `UNKNOWN_TYPE`, `VALIDATION_ERROR`, `EXECUTION_ERROR`) and the session goes on; other sessions never
notice. HTTP: `/health`, `/schema`, `/metadata`, `/state`, `/reset` (a one-off rollout's prompt), `/step` (refused:
steps need a session) and `/mcp` (`tools/list`). Binding anywhere but loopback needs a shared secret
(`TRACEGYM_ENV_SECRET`), which clients send as `Authorization: Bearer SECRET`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from openenv.core.env_server.mcp_types import JsonRpcErrorCode, JsonRpcRequest, WSMCPMessage
from openenv.core.env_server.types import (
    StepRequest,
    WSCloseMessage,
    WSErrorCode,
    WSResetMessage,
    WSStateMessage,
    WSStepMessage,
)
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tracegym.core.errors import UsageError
from tracegym.envs.taskset import Taskset
from tracegym.interop.openenv_protocol import (
    ResetChoice,
    TasksetAction,
    TasksetState,
    error_frame,
    mcp_tools,
    schemas,
    step_result,
)
from tracegym.interop.openenv_session import SessionError, TaskPicker, TasksetSession
from tracegym.interop.openenv_settings import OpenEnvSettings
from tracegym.serve.curve import shared_secret
from tracegym.serve.wire import SECRET_ENV, is_loopback

log = logging.getLogger("tracegym.interop.openenv_server")

DEFAULTS = OpenEnvSettings()
Reply = tuple[dict[str, Any] | None, bool]
"""A WebSocket message's answer (None: none) and whether the session goes on."""


class OpenEnvServer:
    """The ASGI app (`.app`) serving one taskset; `serve` runs it in the foreground, `running` in a thread."""

    def __init__(self, taskset: Taskset, *, max_concurrent_envs: int = DEFAULTS.max_concurrent_envs,
                 session_timeout: float | None = DEFAULTS.session_timeout,
                 max_frame_bytes: int = DEFAULTS.max_frame_bytes, secret: str | None = None) -> None:
        self.taskset, self.picker = taskset, TaskPicker(taskset)
        self.max_concurrent_envs, self.session_timeout = max_concurrent_envs, session_timeout
        self.max_frame_bytes, self.secret = max_frame_bytes, secret
        self.active = 0
        """Sessions open now."""
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
        ])
        self._handlers: dict[str, Callable[[TasksetSession, dict[str, Any]], Awaitable[Reply]]] = {
            "reset": self._reset, "step": self._step, "state": self._state, "close": self._close, "mcp": self._mcp}

    @classmethod
    def from_settings(cls, taskset: Taskset, settings: OpenEnvSettings) -> OpenEnvServer:
        """A server with these settings and the shared secret in force ($TRACEGYM_ENV_SECRET), if any."""
        return cls(taskset, max_concurrent_envs=settings.max_concurrent_envs, session_timeout=settings.session_timeout,
                   max_frame_bytes=settings.max_frame_bytes, secret=shared_secret(None))

    # --- running -----------------------------------------------------------------------------------------
    def bind(self, host: str = "127.0.0.1", port: int = 0) -> socket.socket:
        """A listening socket (port 0: a free one); a host other than loopback needs the secret."""
        if not is_loopback(f"tcp://{host}:0") and not self.secret:
            raise UsageError(f"serving on {host} (not loopback) needs a shared secret: set {SECRET_ENV}")
        sock = socket.create_server((host, port), reuse_port=False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return sock

    def uvicorn_server(self) -> uvicorn.Server:
        # frames up to 4x our own limit reach us and are answered; past it uvicorn closes the socket (1009).
        # No per-message deflate: compressing small JSON frames costs more CPU than the bytes it saves on loopback
        return uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off", ws_ping_interval=None,
                                             ws_per_message_deflate=False,
                                             ws_max_size=max(16 << 20, 4 * self.max_frame_bytes)))

    def serve(self, sock: socket.socket) -> None:
        """Answer on `sock` until SIGINT or SIGTERM."""
        asyncio.run(self.uvicorn_server().serve(sockets=[sock]))

    @contextlib.contextmanager
    def running(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """Serve in a background thread for the `with` block; yields the `ws://HOST:PORT` URL."""
        with serving(self.app, host, port, server=self.uvicorn_server(), sock=self.bind(host, port)) as url:
            yield url

    # --- WebSocket sessions ------------------------------------------------------------------------------
    async def _websocket(self, websocket: WebSocket) -> None:
        await websocket.accept()
        if not self._authorized(websocket.headers.get("authorization")):
            await _refuse(websocket, error_frame(WSErrorCode.SESSION_ERROR, "unauthorized: send the shared secret "
                                                 "as `Authorization: Bearer SECRET`"), code=1008)
            return
        if self.active >= self.max_concurrent_envs:
            await _refuse(websocket, error_frame(
                WSErrorCode.CAPACITY_REACHED, f"server at capacity: {self.active}/{self.max_concurrent_envs} "
                "sessions active", active_sessions=self.active, max_sessions=self.max_concurrent_envs))
            return
        self.active += 1
        session = TasksetSession(self.taskset, self.picker)
        try:
            await self._converse(websocket, session)
        except WebSocketDisconnect:
            pass
        finally:
            self.active -= 1
            await session.close()

    async def _converse(self, websocket: WebSocket, session: TasksetSession) -> None:
        while True:
            try:
                async with asyncio.timeout(self.session_timeout):  # no task per message, unlike wait_for
                    message = await websocket.receive()
            except TimeoutError:
                await _refuse(websocket, error_frame(WSErrorCode.SESSION_ERROR, f"session idle for more than "
                                                     f"{self.session_timeout:g} s: closed"))
                return
            if message["type"] == "websocket.disconnect":
                return
            reply, goes_on = await self._answer(session, message.get("text") or message.get("bytes") or b"")
            if reply is not None:
                await websocket.send_text(json.dumps(reply))
            if not goes_on:
                await websocket.close()
                return

    async def _answer(self, session: TasksetSession, frame: str | bytes) -> Reply:
        """The answer to one frame; bad input is answered with an error frame and the session goes on."""
        size = len(frame) if isinstance(frame, bytes) or 4 * len(frame) <= self.max_frame_bytes else len(frame.encode())
        if size > self.max_frame_bytes:  # (a text frame that short cannot be over, however it encodes)
            return error_frame(WSErrorCode.VALIDATION_ERROR, f"frame of {size} bytes is over this server's limit of "
                               f"{self.max_frame_bytes} bytes"), True
        try:
            message = json.loads(frame)
        except (ValueError, UnicodeDecodeError) as exc:
            return error_frame(WSErrorCode.INVALID_JSON, f"Invalid JSON: {exc}"), True
        if not isinstance(message, dict):
            return error_frame(WSErrorCode.VALIDATION_ERROR, "a message is a JSON object with a `type`"), True
        kind = message.get("type")
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return error_frame(WSErrorCode.UNKNOWN_TYPE, f"Unknown message type: {message.get('type')!r} (known: "
                               f"{', '.join(self._handlers)})"), True
        try:
            return await handler(session, message)
        except ValidationError as exc:
            return error_frame(WSErrorCode.VALIDATION_ERROR, "Invalid message",
                               errors=json.loads(exc.json(include_url=False, include_context=False))), True
        except (SessionError, UsageError) as exc:
            return error_frame(WSErrorCode.EXECUTION_ERROR, str(exc)), True

    async def _reset(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        choice = ResetChoice.model_validate(WSResetMessage.model_validate(message).data)
        return {"type": "observation", "data": step_result(await session.reset(choice))}, True

    async def _step(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        action = TasksetAction.model_validate(WSStepMessage.model_validate(message).data)
        return {"type": "observation", "data": step_result(await session.step(action))}, True

    async def _state(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        WSStateMessage.model_validate(message)
        return {"type": "state", "data": session.state().model_dump()}, True

    async def _close(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        WSCloseMessage.model_validate(message)
        return None, False

    async def _mcp(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        request = JsonRpcRequest.model_validate(WSMCPMessage.model_validate(message).data)
        return {"type": "mcp", "data": await self._rpc(request, session)}, True

    async def _rpc(self, request: JsonRpcRequest, session: TasksetSession | None) -> dict[str, Any]:
        """One MCP JSON-RPC call: `tools/list`, or `tools/call` as one turn of the session's rollout."""
        if request.method == "tools/list":
            tools = session.tools() if session is not None else mcp_tools(self.picker.first_tools)
            return rpc_result(request, {"tools": tools})
        if request.method != "tools/call":
            return rpc_error(request, JsonRpcErrorCode.METHOD_NOT_FOUND, f"Method not found: {request.method}")
        name, arguments = request.params.get("name"), request.params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return rpc_error(request, JsonRpcErrorCode.INVALID_PARAMS, "tools/call takes `name` (a string) and "
                             "`arguments` (an object)")
        if session is None:
            return rpc_error(request, JsonRpcErrorCode.INVALID_REQUEST, "tools/call needs a session: open a "
                             "WebSocket at /ws and reset it")
        try:
            text, failed = await session.call_tool(name, arguments)
        except SessionError as exc:
            return rpc_error(request, JsonRpcErrorCode.INVALID_REQUEST, str(exc))
        return rpc_result(request, {"content": [{"type": "text", "text": text}], "isError": failed})

    # --- HTTP --------------------------------------------------------------------------------------------
    async def _http_reset(self, request: Request) -> JSONResponse:
        """A one-off rollout's prompt (OpenEnv's HTTP reset keeps no session)."""
        try:
            choice = ResetChoice.model_validate(await _body(request))
            session = TasksetSession(self.taskset, self.picker)
            try:
                return JSONResponse(step_result(await session.reset(choice)))
            finally:
                await session.close()
        except ValidationError as exc:
            return JSONResponse({"detail": json.loads(exc.json(include_url=False, include_context=False))}, 422)
        except (SessionError, UsageError) as exc:
            return JSONResponse({"detail": str(exc)}, 400)

    async def _http_step(self, request: Request) -> JSONResponse:
        try:
            TasksetAction.model_validate(StepRequest.model_validate(await _body(request)).action)
        except ValidationError as exc:
            return JSONResponse({"detail": json.loads(exc.json(include_url=False, include_context=False))}, 422)
        return JSONResponse({"detail": "a step needs a session: open a WebSocket at /ws (one session each), reset, "
                                       "then step"}, 409)

    async def _http_mcp(self, request: Request) -> JSONResponse:
        try:
            rpc = JsonRpcRequest.model_validate(await _body(request))
        except ValidationError as exc:
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {
                "code": JsonRpcErrorCode.INVALID_REQUEST.value, "message": f"Invalid request: {exc}"}})
        return JSONResponse(await self._rpc(rpc, None))

    def _guard(self, endpoint: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Any]]:
        async def guarded(request: Request) -> Any:
            if not self._authorized(request.headers.get("authorization")):
                return JSONResponse({"detail": "unauthorized: send `Authorization: Bearer SECRET`"}, 401)
            answer = endpoint(request)
            return await answer if asyncio.iscoroutine(answer) else answer
        return guarded

    def _authorized(self, header: str | None) -> bool:
        if not self.secret:
            return True
        return hmac.compare_digest((header or "").encode(), f"Bearer {self.secret}".encode())


async def _refuse(websocket: WebSocket, frame: dict[str, Any], code: int = 1000) -> None:
    """Say why in an error frame, then close (as openenv's server refuses a session)."""
    with contextlib.suppress(Exception):  # the peer may be gone already
        await websocket.send_text(json.dumps(frame))
        await websocket.close(code)


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw.decode(errors="replace")  # not JSON: validation says so, naming the body


def rpc_result(request: JsonRpcRequest, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request.id, "result": result}


def rpc_error(request: JsonRpcRequest, code: JsonRpcErrorCode, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request.id, "error": {"code": code.value, "message": message}}


@contextlib.contextmanager
def serving(app: Any, host: str = "127.0.0.1", port: int = 0, *, server: uvicorn.Server | None = None,
            sock: socket.socket | None = None) -> Iterator[str]:
    """Run an ASGI app (ours, or one of openenv's `create_app`) under uvicorn in a daemon thread for the `with`
    block; yields its `ws://HOST:PORT` URL once it accepts connections."""
    sock = sock or socket.create_server((host, port))
    server = server or uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_ping_interval=None))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True,
                              name=f"uvicorn:{sock.getsockname()[1]}")
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the OpenEnv server thread ended before it started; see its log")
            threading.Event().wait(0.005)
        yield f"ws://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
