"""Router: the model client that spreads one endpoint's requests over its servers (`base_url` and `replicas`).

Session affinity: every request with the same `ModelRequest.session` (a rollout's turns, an episode's members) goes
to the server the session started on, so that server's prefix cache holds its prompt; a new session goes to the
server with the fewest requests in flight (ties broken by a hash of the session, so routers in separate worker
processes spread their first sessions instead of all picking the first server; requests without a session take
turns). A server that gives no usable answer (no reply, a timeout, HTTP 5xx: the transport's `Unavailable`) is taken
out, and so is one that fails a probe (`GET /models` within `Endpoint.probe_timeout`, asked every
`Endpoint.health_every` seconds of a server with requests in flight): its requests in flight are cancelled and
retried on the others. A server taken out is probed on the same clock and put back once it answers; its sessions
stay where they moved. Retries are bounded: at most `max(max_retries + 1, number of servers)` attempts per request,
each one HTTP attempt (the per-server clients do not retry: the router does, elsewhere first); only when every
server is out does a retry wait out the transport's backoff, on the server taken out longest ago. HTTP 429 is
retried after the backoff without taking the server out. A streamed request is not retried once part of its reply
was shown (the transport's `StreamCut`: it cannot be taken back).

>>> endpoint = Endpoint(base_url="http://a:8000/v1", model="m", replicas=("http://b:8000/v1",))
>>> router = make_client(endpoint)  # doctest: +SKIP   (connect.make_client: a Router over both servers)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tracegym.core.errors import InfrastructureError, TracegymError
from tracegym.models.client import ModelClient, ModelRequest, ModelResponse
from tracegym.models.endpoint import Endpoint
from tracegym.models.endpoint_client import EndpointClient
from tracegym.models.transport import StreamCut, Unavailable, backoff_delay, served_models

log = logging.getLogger(__name__)

SESSIONS_KEPT = 65536
"""Most sessions whose server a router remembers (the least recently used are forgotten: a session that has
ended sends no more turns, and one that has not merely starts over on the least-loaded server)."""


class ServerLost(InfrastructureError):
    """A request's server was taken out (a failed probe) while the request was in flight there."""


@dataclass
class Server:
    """One server behind a router: its own client, its requests in flight and whether it is in service."""

    url: str
    client: ModelClient
    inflight: set[asyncio.Task[ModelResponse]] = field(default_factory=set)
    sent: int = 0
    """Requests sent to it (the tie-break for requests without a session: between idle servers, they take turns)."""
    up: bool = True
    out_since: float = 0.0
    """`time.monotonic()` when it was last taken out, or last failed while out."""


@dataclass
class RouterStats:
    """What a router did, counted from its start."""

    requests: int = 0
    """Requests answered (after any retries)."""
    new_sessions: int = 0
    """Requests whose session had no server yet (or that named none)."""
    affinity_hits: int = 0
    """Requests that went to the server their session was already on."""
    sessions_moved: int = 0
    """Requests whose session's server was out, so the session moved to another."""
    retries: int = 0
    """Attempts after a failed one (elsewhere when another server was in service)."""
    taken_out: int = 0
    put_back: int = 0
    per_server: collections.Counter[str] = field(default_factory=collections.Counter)
    """Requests answered, by server."""

    def affinity_rate(self) -> float | None:
        """Of the requests that continued a session, the share served where the session already was."""
        continued = self.affinity_hits + self.sessions_moved
        return self.affinity_hits / continued if continued else None


class Router(EndpointClient):
    """A ModelClient over several servers of one model; `Router(endpoint, make)` with `make` building one server's
    client from an Endpoint naming that server alone. Close with `await router.aclose()`."""

    def __init__(self, endpoint: Endpoint, make: Callable[[Endpoint], ModelClient], *,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """`sleep` waits out each backoff (tests pass one that records the delays)."""
        super().__init__(endpoint)
        one = {"replicas": (), "max_retries": 0}
        self.servers = [Server(url, make(endpoint.model_copy(update={"base_url": url, **one})))
                        for url in endpoint.servers()]
        self.stats = RouterStats()
        self._sleep = sleep
        self._sessions: collections.OrderedDict[str, Server] = collections.OrderedDict()
        self._lost: set[asyncio.Task[ModelResponse]] = set()
        self._watcher: asyncio.Task[None] | None = None

    async def aclose(self) -> None:
        """Stop probing and close every server's client."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done() and watcher.get_loop() is asyncio.get_running_loop():
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        for server in self.servers:
            with contextlib.suppress(Exception):  # a client that fails to close has nothing left to give back
                await server.client.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One answer from the session's server, or from another when that one fails; raises the last failure
        once the attempts are spent."""
        self._watch()
        attempts = max(self.endpoint.max_retries + 1, len(self.servers))
        failure: TracegymError | None = None
        for attempt in range(attempts):
            server = self._pick(request.session, counted=attempt == 0)
            if attempt:
                self.stats.retries += 1
                if not server.up:  # every server is out: wait before asking one again, as a single client would
                    await self._sleep(backoff_delay(self.endpoint.backoff, attempt - 1))
            try:
                response = await self._attempt(server, request)
            except (Unavailable, ServerLost) as exc:
                failure = exc
                if getattr(exc, "status", None) == 429:  # "too many requests" is load, not a failure: wait
                    await self._sleep(backoff_delay(self.endpoint.backoff, attempt))
                else:
                    self._take_out(server, str(exc))
                continue
            self._serve(server)
            return response
        assert failure is not None
        raise failure.after(attempts) if isinstance(failure, Unavailable) else failure

    # --- routing -----------------------------------------------------------------------------------------
    def _pick(self, session: str | None, *, counted: bool) -> Server:
        """The session's server while it is in service; else the least-loaded server in service (any server,
        the one out longest, when none is), remembered as the session's."""
        kept = self._sessions.get(session) if session is not None else None
        if session is not None and kept is not None and kept.up:
            self._sessions.move_to_end(session)
            self.stats.affinity_hits += counted
            return kept
        if kept is not None:
            self.stats.sessions_moved += 1
        else:
            self.stats.new_sessions += counted
        live = [s for s in self.servers if s.up]
        if live:
            server = min(live, key=lambda s: (len(s.inflight), s.sent if session is None else 0,
                                              _spread(session or "", s.url)))
        else:
            server = min(self.servers, key=lambda s: s.out_since)
        if session is not None:
            self._sessions[session] = server
            self._sessions.move_to_end(session)
            while len(self._sessions) > SESSIONS_KEPT:
                self._sessions.popitem(last=False)
        return server

    async def _attempt(self, server: Server, request: ModelRequest) -> ModelResponse:
        """One request on `server`, as a task the watcher can cancel when it takes the server out (then a
        ServerLost); a cancellation of our own caller stays a cancellation."""
        task = asyncio.ensure_future(server.client.complete(request))
        server.inflight.add(task)
        server.sent += 1
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task in self._lost and not (current is not None and current.cancelling()):
                what = "was taken out (it stopped answering) with this request in flight"
                if request.stream is not None and request.stream.shown:  # a retry's reply could not be shown
                    raise StreamCut(server.url, what) from None
                raise ServerLost(f"{server.url} {what}") from None
            raise
        finally:
            server.inflight.discard(task)
            self._lost.discard(task)

    def _serve(self, server: Server) -> None:
        """Count an answer; a server out that answered (tried because every server was out) is back."""
        self.stats.requests += 1
        self.stats.per_server[server.url] += 1
        if not server.up:
            self._put_back(server)

    def _take_out(self, server: Server, why: str) -> None:
        """Out of service: no new requests, and its requests in flight retried elsewhere."""
        if server.up:
            self.stats.taken_out += 1
            log.warning("model server %s taken out: %s", server.url, why)
        server.up, server.out_since = False, time.monotonic()  # failing again while out: tried last next time
        for task in server.inflight:
            if not task.done():
                self._lost.add(task)
                task.cancel()

    def _put_back(self, server: Server) -> None:
        server.up = True
        self.stats.put_back += 1
        log.warning("model server %s is answering again; back in service", server.url)

    # --- health --------------------------------------------------------------------------------------------
    def _watch(self) -> None:
        """Start this event loop's watcher (once; again after the loop that ran the last one is gone)."""
        watcher = self._watcher
        if watcher is None or watcher.done() or watcher.get_loop() is not asyncio.get_running_loop():
            self._watcher = asyncio.get_running_loop().create_task(self._probe_forever())

    async def _probe_forever(self) -> None:
        """Every `health_every` seconds, probe each server out (put it back when it answers) and each with
        requests in flight (take it out when it does not)."""
        while True:
            await asyncio.sleep(self.endpoint.health_every)
            due = [s for s in self.servers if not s.up or s.inflight]
            answers = await asyncio.gather(*(self._answers(s) for s in due))
            for server, answered in zip(due, answers, strict=True):
                if answered and not server.up:
                    self._put_back(server)
                elif not answered and server.up:
                    self._take_out(server, f"no answer to GET /models within {self.endpoint.probe_timeout:g} s")

    async def _answers(self, server: Server) -> bool:
        try:
            await asyncio.to_thread(served_models, server.url, self.endpoint.api_key(), self.endpoint.probe_timeout)
        except TracegymError:
            return False
        return True


def _spread(session: str, url: str) -> bytes:
    """A tie-break that differs per session (rendezvous hashing): equal loads go to different servers."""
    return hashlib.blake2b(f"{session}|{url}".encode(), digest_size=8).digest()
