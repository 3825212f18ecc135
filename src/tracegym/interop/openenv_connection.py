"""OpenEnv connection: one WebSocket session with an OpenEnv server, through the `openenv` package's own client,
its error frames and dropped connections turned into tracegym's errors at this one edge.

Opening a session is retried a bounded number of times with exponential backoff when the server is at capacity
(`CAPACITY_REACHED`), refuses the connection or drops it: nothing has happened in the environment yet. A step is
never retried (the action may have been applied); a connection lost mid-episode is an InfrastructureError.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed, WebSocketException

from tracegym.core.errors import ErrorKind, InfrastructureError, TracegymError

RETRYABLE_CODES = frozenset({"CAPACITY_REACHED"})
"""Error codes that refuse a session before it starts: opening it again later may succeed."""
MAX_BACKOFF_S = 10.0
CAPACITY_POLL_S = 1.0
"""The longest pause between two asks for a session of a server at capacity (a freed one is taken soon)."""


class OpenEnvError(TracegymError):
    """An OpenEnv error frame (`code` is the server's: VALIDATION_ERROR, EXECUTION_ERROR, CAPACITY_REACHED, ...):
    infrastructure when it refused or ended the session, the task's otherwise."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(f"{message} (code: {code})")
        self.code, self.data = code, data or {}
        self.kind = ErrorKind.INFRASTRUCTURE if code in (*RETRYABLE_CODES, "SESSION_ERROR") else ErrorKind.TASK

    def details(self) -> str:
        """The message with the server's validation errors, as a model should read them."""
        problems = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
                    for e in self.data.get("errors") or () if isinstance(e, dict)]
        return f"{self.data.get('message', self.code)}" + (f": {'; '.join(problems)}" if problems else "")


@functools.cache
def _client_class() -> type[Any]:
    """openenv's client, raising OpenEnvError with the frame's code instead of a RuntimeError with it in text.
    Made on first use: importing openenv takes seconds (it loads gradio), which processes that only list tasks
    (an eval's own, an env server's router) never pay."""
    from openenv.core.generic_client import GenericEnvClient

    class Client(GenericEnvClient):
        async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
            with contextlib.suppress(ConnectionClosed):  # a refused session sends its error frame, then closes
                await self._send(message)
            response = await self._receive()
            if response.get("type") == "error":
                data = response.get("data") or {}
                raise OpenEnvError(str(data.get("code", "UNKNOWN")), str(data.get("message", "error")), data)
            return response

    return Client


class OpenEnvConnection:
    """One OpenEnv session (one WebSocket); `open` resets it, `step` and `mcp` act in it, `close` ends it."""

    def __init__(self, url: str, *, retries: int = 3, backoff: float = 0.5, connect_timeout: float = 10.0,
                 message_timeout: float = 60.0, headers: dict[str, str] | None = None,
                 capacity_wait: float = 0.0, on_capacity: Callable[[int], None] | None = None) -> None:
        self.url, self.retries, self.backoff, self.capacity_wait = url, retries, backoff, capacity_wait
        self.on_capacity = on_capacity
        """Told the server's `max_sessions` when a CAPACITY_REACHED frame says it."""
        self._options = {"connect_timeout_s": connect_timeout, "message_timeout_s": message_timeout,
                         "headers": headers}
        self._client: Any = None
        self._ids = itertools.count(1)

    async def open(self, **reset_args: Any) -> dict[str, Any]:
        """Connect and reset; the reset's result (`observation`, `reward`, `done`). A server at capacity is asked
        again, at most `CAPACITY_POLL_S` apart, for `capacity_wait` seconds (its sessions end as their rollouts
        do); other refusals and connection failures are retried `retries` times with backoff; then an
        InfrastructureError says what happened."""
        loop = asyncio.get_running_loop()
        waiting_until, failures = loop.time() + self.capacity_wait, 0
        for attempt in itertools.count():
            try:
                self._client = _client_class()(base_url=self.url, **self._options)
                return _result(await self._guarded("reset", self._client.reset(**reset_args)))
            except TracegymError as exc:
                await self.close()
                full = isinstance(exc, OpenEnvError) and exc.code in RETRYABLE_CODES
                if isinstance(exc, OpenEnvError) and full:
                    self._said_capacity(exc)
                delay = min(self.backoff * 2 ** min(attempt, 30), CAPACITY_POLL_S if full else MAX_BACKOFF_S)
                if full and loop.time() + delay < waiting_until:
                    await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                    continue
                if exc.kind != ErrorKind.INFRASTRUCTURE or failures >= self.retries:
                    raise self._gave_up(exc, attempt) from None
                failures += 1
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # jitter: refused clients do not return in step
        raise AssertionError("unreachable")

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        """One action; its result. A VALIDATION_ERROR (or any error frame) is an OpenEnvError."""
        return _result(await self._guarded("step", self._live().step(action)))

    async def mcp(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One MCP JSON-RPC call over the session's WebSocket; its `result`, or an OpenEnvError for its `error`."""
        frame = {"type": "mcp", "data": {"jsonrpc": "2.0", "method": method, "params": params or {},
                                         "id": next(self._ids)}}
        reply = (await self._guarded(method, self._live()._send_and_receive(frame))).get("data") or {}
        if reply.get("error"):
            error = reply["error"]
            raise OpenEnvError(f"JSONRPC_{error.get('code')}", str(error.get("message", "MCP error")), error)
        return reply.get("result")

    async def close(self) -> None:
        """End the session (best effort: the server frees it when the socket closes anyway)."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # a broken socket fails to close in many ways; it is over anyway
                await client.close()

    def _said_capacity(self, refusal: OpenEnvError) -> None:
        sessions = refusal.data.get("max_sessions")
        if self.on_capacity is not None and isinstance(sessions, int) and sessions > 0:
            self.on_capacity(sessions)

    def _live(self) -> Any:
        if self._client is None:
            raise InfrastructureError(f"OpenEnv session with {self.url} is not open")
        return self._client

    async def _guarded(self, what: str, call: Any) -> Any:
        """Await one exchange, with transport failures as InfrastructureError naming the server and the step."""
        try:
            return await call
        except OpenEnvError:
            raise
        except (ConnectionError, ConnectionClosed, WebSocketException, OSError, TimeoutError) as exc:
            said = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise InfrastructureError(f"OpenEnv server {self.url}: {what} failed ({said})") from None

    def _gave_up(self, exc: TracegymError, attempt: int) -> TracegymError:
        if exc.kind != ErrorKind.INFRASTRUCTURE or attempt == 0:
            return exc
        return InfrastructureError(f"{exc} (gave up after {attempt + 1} attempts)")


def _result(result: Any) -> dict[str, Any]:
    """openenv's StepResult as the wire's plain shape, so dotted paths (`observation.score`) reach any field."""
    return {"observation": result.observation, "reward": result.reward, "done": result.done,
            "metadata": result.metadata or {}}
