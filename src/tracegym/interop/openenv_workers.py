"""OpenEnv workers: the env-server worker pool that runs an OpenEnv server's rollouts out of its process, and the
relay that carries each rollout's model calls back to its session.

A session's rollout is an ordinary `run` request to a tracegym env server (`serve.env_server`, in a thread of this
process, its workers separate processes) whose model endpoint is this relay: a loopback-only HTTP server answering
`POST /v1/chat/completions` with the agent's next step (`AgentTurns.turn`) of the session its body names (`session`:
an unguessable token per session, sent through the run's `Sampling.extra`; one endpoint for every session, so a
worker keeps one HTTP client for them all). So task code that ends its process (`os._exit`) or crashes it costs
its own session only: the env server reruns the dead worker's other rollouts, which the relay answers from their
agents' earlier turns, and answers the poison one with an error once it has killed a worker on its own.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tracegym.core.messages import Message
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
        self.relay = Starlette(routes=[Route("/v1/chat/completions", self._complete, methods=["POST"])])
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
        relay = uvicorn.Server(uvicorn.Config(self.relay, log_level="warning", lifespan="off"))
        relay.config.load()
        relay.lifespan = relay.config.lifespan_class(relay.config)  # what `serve` sets before `startup`
        await relay.startup(sockets=[sock])
        self.endpoint = Endpoint(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", model=AGENT,
                                 api_key_env=None, max_retries=0, timeout=WAIT_S, tokens="off")
        self.client = EnvClient(address)
        try:
            yield self
        finally:
            await self.client.aclose()
            relay.should_exit = True
            await relay.shutdown(sockets=[sock])
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

    async def _complete(self, request: Request) -> JSONResponse:
        """A worker's model call: the agent's answer to the turn it asks for."""
        body = await request.json()
        token = body.get("session") if isinstance(body, dict) else None
        agent = self.agents.get(token) if isinstance(token, str) else None
        if agent is None:
            return JSONResponse({"error": {"message": "no rollout of this session is running"}}, 404)
        messages = [Message.from_openai(m) for m in body.get("messages") or []]
        try:
            message = await agent.turn(messages, body.get("tools") or [])
        except SessionError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, 409)
        finish = "tool_calls" if message.tool_calls else "stop"
        return JSONResponse({"object": "chat.completion", "model": AGENT, "usage": {}, "choices": [
            {"index": 0, "message": message.to_openai(), "finish_reason": finish}]})
