"""OpenEnv workers: the env-server worker pool that runs an OpenEnv server's rollouts out of its process, and the
relay that carries each rollout's model calls back to its session.

A session's rollout is an ordinary `run` request to a tracegym env server (`serve.env_server`, in a thread of this
process, its workers separate processes) whose model endpoint is this relay: a loopback-only HTTP server answering
`POST /v1/chat/completions` with the agent's next step (`AgentTurns.turn`) of the session its body names (`session`:
an unguessable token per session, sent through the run's `Sampling.extra`; one endpoint for every session, so a
worker keeps one HTTP client for them all). The relay is a bare HTTP/1.1 keep-alive server on asyncio (`Relay`:
a request line, headers and a JSON body in, one write out), not an ASGI app: it is every step's hop, and a
framework's routing and middleware would cost the server more than the step itself. So task code that ends its
process (`os._exit`) or crashes it costs its own session only: the env server reruns the dead worker's other
rollouts, which the relay answers from their agents' earlier turns, and answers the poison one with an error once it
has killed a worker on its own.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httptools

from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.rollout import Timeouts
from tracegym.envs.seats import Seats
from tracegym.interop.openenv_server import listen
from tracegym.interop.openenv_session import AGENT, WAIT_S, AgentTurns, Runner, SessionError
from tracegym.models.endpoint import Endpoint
from tracegym.serve.env_client import EnvClient
from tracegym.serve.env_server import EnvServer
from tracegym.serve.pool import PoolSize


class SessionWorkers:
    """`async with SessionWorkers(id, options, 2) as workers:` a worker pool and its relay; `workers.runner()`: a
    session's Runner (its own relay token)."""

    def __init__(self, taskset_id: str, options: dict[str, Any], workers: int) -> None:
        self.server = EnvServer(taskset_id, options, size=PoolSize(min=workers))
        self.agents: dict[str, AgentTurns] = {}
        """The agent of each session's running rollout, by relay token."""
        self.client: EnvClient | None = None
        self.endpoint: Endpoint | None = None
        """The relay as the model endpoint of every session's rollouts."""

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SessionWorkers]:
        """The env server (a thread) and the relay (on this event loop) for the block."""
        address = self.server.bind()
        thread = threading.Thread(target=self.server.serve, daemon=True, name="openenv-workers")
        thread.start()
        sock = listen("127.0.0.1", 0)
        relay = await asyncio.get_running_loop().create_server(lambda: Relay(self._complete), sock=sock)
        self.endpoint = Endpoint(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", model=AGENT,
                                 api_key_env=None, max_retries=0, timeout=WAIT_S, tokens="off")
        self.client = EnvClient(address)
        try:
            yield self
        finally:
            await self.client.aclose()
            relay.close()
            sock.close()
            self.server.stop()
            await asyncio.to_thread(thread.join, 30)

    def runner(self, seat: str | None = None, others: Seats | None = None) -> Runner:
        """A session's Runner: its rollouts run in a worker, reaching the agent through the relay; with `seat`, they
        are episodes of a multi-agent taskset where the agent plays `seat` and `others` binds the other members."""
        token = secrets.token_urlsafe(18)
        sampling = Sampling(extra={"session": token})

        async def run(data: TaskData, agent: AgentTurns, timeouts: Timeouts) -> Trace:
            endpoint = self.endpoint
            assert self.client is not None and endpoint is not None, "SessionWorkers used outside `running()`"
            self.agents[token] = agent
            try:
                if seat is None:
                    [trace] = await self.client.run(data, endpoint, sampling, timeouts=timeouts, infra_retries=0)
                    return trace
                [episode] = await self.client.run_episodes(data, endpoint, sampling, seats=others, timeouts=timeouts,
                                                           infra_retries=0)
                if seat not in episode.traces:
                    raise SessionError(f"the episode ended before seat {seat!r} played: "
                                       f"{episode.error.message if episode.error else 'no trace'}")
                return episode.traces[seat]
            finally:
                if self.agents.get(token) is agent:
                    del self.agents[token]
        return run

    async def _complete(self, body: Any) -> tuple[int, dict[str, Any]]:
        """A worker's model call: the agent's answer to the turn it asks for (status, JSON body)."""
        token = body.get("session") if isinstance(body, dict) else None
        agent = self.agents.get(token) if isinstance(token, str) else None
        if agent is None:
            return 404, {"error": {"message": "no rollout of this session is running"}}
        try:
            message = await agent.turn(agent.conversation(body.get("messages") or []), body.get("tools") or [])
        except SessionError as exc:
            return 409, {"error": {"message": str(exc)}}
        finish = "tool_calls" if message.tool_calls else "stop"
        return 200, {"object": "chat.completion", "model": AGENT, "usage": {}, "choices": [
            {"index": 0, "message": message.to_openai(), "finish_reason": finish}]}


Handler = Callable[[Any], Awaitable[tuple[int, dict[str, Any]]]]
"""Answers a request's JSON body with a status and a JSON body."""
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 409: "Conflict", 500: "Internal Server Error"}
ROUTE = b"/v1/chat/completions"


class Relay(asyncio.Protocol):
    """One connection of the relay: HTTP/1.1 requests (`POST /v1/chat/completions` with a JSON body; anything else
    404), each answered by `handler` in one write, in the order they came, on a connection kept alive."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url, self.body = b"", bytearray()
        self.last: asyncio.Task[None] | None = None
        """The latest request's answer, which the next one waits for before it writes."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._write(400, {"error": {"message": "not an HTTP/1.1 request"}}, close=True)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        url, body, self.url, self.body = self.url, bytes(self.body), b"", bytearray()
        keep = self.parser.should_keep_alive()
        wrong = self.parser.get_method() != b"POST" or url.split(b"?", 1)[0] != ROUTE
        self.last = asyncio.get_running_loop().create_task(self._answer(wrong, body, keep, self.last))

    async def _answer(self, wrong: bool, body: bytes, keep: bool, before: asyncio.Task[None] | None) -> None:
        if wrong:
            status, reply = 404, {"error": {"message": f"the relay answers POST {ROUTE.decode()} only"}}
        else:
            try:
                status, reply = await self.handler(json.loads(body))
            except ValueError:
                status, reply = 400, {"error": {"message": "the body is not JSON"}}
            except Exception as exc:  # a bug here must still answer the worker, which would wait forever
                status, reply = 500, {"error": {"message": f"{type(exc).__name__}: {exc}"}}
        if before is not None:
            await before
        self._write(status, reply, close=not keep)

    def _write(self, status: int, reply: dict[str, Any], close: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        data = json.dumps(reply).encode()
        transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
            status, REASONS.get(status, "Error").encode(), len(data), b"connection: close\r\n" if close else b"",
            data))
        if close:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
