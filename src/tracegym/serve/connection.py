"""Connection: the env client's link to one env server: a DEALER socket, replies matched to the requests waiting
for them, liveness pings, and what the socket's events say (a refused handshake, a link lost or back).

While requests wait, a quiet server is pinged (a `health` listing the pending ids) after a second; ids the server
has no record of (lost, e.g. to a restart) fail, and so does everything pending when it stays silent for
`liveness_timeout`. Those failures are `HostLost`, which a client with other servers answers by sending the request
to another. With `moves` set (the client has others), a dropped TCP link also fails every pending request at once:
the server routes replies by the connection's identity, so replies to requests sent before a reconnect can never
arrive. ZMQ reconnects by itself; the link counts as `up` again once a handshake succeeds or the server answers
anything (a server that went silent is pinged, idle or not, until it does).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from tracegym.core.errors import InfrastructureError, StageTimeout, UsageError
from tracegym.serve.curve import HANDSHAKE_FAILED, guard_client, refusal
from tracegym.serve.loop_socket import LoopSocket
from tracegym.serve.wire import MAX_PENDING_CHECK, ZERO_COPY_BYTES, decode_reply, encode_request

PING_AFTER = 1.0
"""Seconds of silence, with requests in flight, after which the client pings the server."""
INTERNAL = ("ping", "cancel-", "limit-")
"""How the ids of the connection's own requests (liveness pings, cancels of abandoned runs, asking the server's size
limit) begin."""
ASK_LIMIT_ABOVE = 64 * 1024
"""Bytes past which a request waits until the server has said its size limit (once per connection): a frame more
than 64 KiB past that limit is cut by the server's ZMQ unanswered, so it is refused here instead."""
LINK_EVENTS = HANDSHAKE_FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
"""The socket events a connection acts on."""


class HostLost(InfrastructureError):
    """The request was in flight on a server that went silent, dropped the link, or has no record of it: it will
    not be answered there, and another server may run it."""


class Connection:
    """One env server's link; `await connection.request(method, payload, request_id, timeout, limit)`."""

    def __init__(self, address: str, secret: str | None, liveness_timeout: float, *, moves: bool = False) -> None:
        """`moves`: the client can send requests elsewhere, so a dropped link fails them at once (see above)."""
        self.address, self.secret, self.liveness_timeout, self.moves = address, secret, liveness_timeout, moves
        self.waiting: dict[str, asyncio.Future[Any]] = {}
        self.up = True
        """False from a lost link (or a failed connection attempt) until a handshake succeeds again."""
        self.server_limit: int | None = None
        """The server's request size limit, once it said it (`info`)."""
        self._pings = itertools.count()
        self._ctx: zmq.Context | None = None
        self._socket: LoopSocket | None = None
        self._events: LoopSocket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._heard = time.monotonic()
        self._asking: asyncio.Future[Any] | None = None
        self._answered = asyncio.Event()
        """Set (and replaced) whenever a reply arrives while someone waits on it: what a request refused as over
        budget waits for."""
        self._answer_waiters = 0

    @property
    def load(self) -> int:
        """Requests waiting for this server's answer (our own pings and cancels not counted)."""
        return sum(not k.startswith(INTERNAL) for k in self.waiting)

    def connect(self) -> LoopSocket:
        """The socket, connected (and run by the event loop, with the liveness watch) on first use."""
        if self._socket is None:
            self._ctx = zmq.Context()
            socket = self._ctx.socket(zmq.DEALER)
            for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 100_000), (zmq.RCVHWM, 100_000)):
                socket.setsockopt(option, value)
            if self.secret:
                guard_client(socket, self.secret)
            events = socket.get_monitor_socket(LINK_EVENTS)
            socket.connect(self.address)
            self._heard = time.monotonic()
            self._socket = LoopSocket(socket, self._on_reply)
            self._events = LoopSocket(events, self._on_link_event)
            self._tasks = [asyncio.create_task(self._watch())]
        return self._socket

    async def aclose(self, why: str) -> None:
        """Fail whatever is still waiting (with `why`), stop the background tasks and close the socket."""
        self.fail_all(InfrastructureError(why))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._socket is not None:
            assert self._events is not None and self._ctx is not None
            self._socket.socket.disable_monitor()
            self._events.close()
            self._socket.close()
            self._ctx.term()
        self._socket = self._ctx = self._events = None

    # --- requests ----------------------------------------------------------------------------------------
    def send(self, method: str, payload: Any, request_id: str, limit: int) -> asyncio.Future[Any]:
        """Send one request; the future its reply (or failure) will settle."""
        frames = encode_request(request_id, method, payload)
        if sum(len(f) for f in frames) > limit:
            raise UsageError(f"{method} request is over the {limit}-byte limit")
        return self._send(frames, request_id)

    def _send(self, frames: list[bytes], request_id: str) -> asyncio.Future[Any]:
        socket = self.connect()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = future
        socket.send(frames, copy=len(frames[1]) < ZERO_COPY_BYTES)
        return future

    async def answered(self, timeout: float) -> None:
        """Return once a reply arrives (any request's), or after `timeout` seconds."""
        self._answer_waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), timeout)
        finally:
            self._answer_waiters -= 1

    async def request(self, method: str, payload: Any, request_id: str, timeout: float, limit: int) -> Any:
        """One request's result (an error reply is returned as its RemoteError); past `timeout` a StageTimeout;
        a cancelled caller abandons it (a `run` is cancelled on the server too). A request over `limit` or the
        server's own limit is a UsageError, before it is sent."""
        frames = encode_request(request_id, method, payload)
        size = sum(len(f) for f in frames)
        if size > ASK_LIMIT_ABOVE and self.server_limit is None:
            await self._ask_limit(timeout)
        limit = min(limit, self.server_limit or limit)
        if size > limit:
            raise UsageError(f"{method} request is over the {limit}-byte limit")
        future = self._send(frames, request_id)
        timer = asyncio.get_running_loop().call_later(timeout, self._expire, request_id, method, timeout)
        try:
            return await future
        except asyncio.CancelledError:
            self.abandon(request_id, method)
            raise
        except HostLost:
            self.abandon(request_id, method)  # should the server still hold it, it stops (its reply is unroutable)
            raise
        finally:
            timer.cancel()

    async def _ask_limit(self, timeout: float) -> None:
        """Learn the server's request size limit, asking once for every request that waits for it (left unknown
        when the server does not say)."""
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(
                self.request("info", None, f"limit-{next(self._pings)}", timeout, ASK_LIMIT_ABOVE))
        with contextlib.suppress(Exception):  # the request itself then meets whatever went wrong
            info = await asyncio.wait_for(asyncio.shield(self._asking), timeout)
            if isinstance(info, dict) and isinstance(info.get("max_request_bytes"), int):
                self.server_limit = info["max_request_bytes"]

    def _expire(self, request_id: str, method: str, timeout: float) -> None:
        future = self.waiting.get(request_id)
        self.abandon(request_id, method)
        if future is not None and not future.done():
            future.set_exception(StageTimeout(f"env server request {method} timed out after {timeout:g}s"))

    def abandon(self, request_id: str, method: str) -> None:
        """Forget a request the caller no longer waits for; a `run` is cancelled on the server too."""
        self.waiting.pop(request_id, None)
        if method == "run" and self._socket is not None:
            with contextlib.suppress(Exception):
                cancel = self.send("cancel", {"id": request_id}, f"cancel-{next(self._pings)}", 2**20)
                cancel.add_done_callback(_ignore)

    def fail_all(self, error: Exception) -> None:
        waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)

    # --- background ----------------------------------------------------------------------------------------
    def _on_reply(self, frames: list[bytes]) -> None:
        """A message from the server: whatever answers is there; it settles the request it answers."""
        self._heard, self.up = time.monotonic(), True
        self._resolve(frames)
        if self._answer_waiters:
            self._answered.set()
            self._answered = asyncio.Event()

    def _resolve(self, frames: list[bytes]) -> None:
        try:
            request_id, result = decode_reply(frames)
        except Exception:  # one unreadable frame must not end the receive loop: the request it answered times out
            return
        future = self.waiting.pop(request_id, None) if isinstance(request_id, str) else None
        if future is not None and not future.done():
            future.set_result(result)

    def _on_link_event(self, frames: list[bytes]) -> None:
        """Act on one of the socket's events. A refused handshake (no, or another, shared secret; or no env server
        at all) fails every waiting request: ZMQ would retry the connection forever, or not at all, and the user
        must hear why; a request sent on a refused connection is lost to libzmq even if the next handshake
        succeeds. A dropped link (with `moves`) fails them as lost; a failed attempt marks the link down; a
        handshake, up."""
        event = parse_monitor_message(frames)["event"]
        if event & HANDSHAKE_FAILED:
            self.fail_all(refusal(self.address, bool(self.secret)))
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.up = True
        elif event == zmq.EVENT_DISCONNECTED:
            self.up = False
            if self.moves:
                self.fail_all(HostLost(f"env server at {self.address} dropped the connection"))
        elif event == zmq.EVENT_CONNECT_RETRIED:
            self.up = False

    async def _watch(self) -> None:
        """Ping a quiet server while requests wait; fail them all as lost when it stays silent too long."""
        while True:
            await asyncio.sleep(min(PING_AFTER, self.liveness_timeout) / 2)
            pinging = any(k.startswith("ping") for k in self.waiting)
            if not self.load:
                self._heard = time.monotonic()
                if not self.up and not pinging and self._socket is not None:
                    self._ping()  # its answer, whenever it comes, says the server is back (see `_receive`)
                continue
            quiet = time.monotonic() - self._heard
            if quiet >= self.liveness_timeout:
                self.up = False
                self.fail_all(HostLost(f"env server at {self.address} did not answer for {quiet:.0f}s "
                                       "(is it running?)"))
            elif quiet >= PING_AFTER and not pinging:
                self._ping()

    def _ping(self) -> None:
        """Ask the server whether it is alive and which of our pending requests it has no record of (lost, e.g.
        to a server restart): those fail now instead of at their timeout. The server read them before the ping and
        answers in order, so a pending id it does not know has no reply on the way."""
        pending = [k for k in self.waiting if not k.startswith(INTERNAL)][:MAX_PENDING_CHECK]  # the oldest
        ping = self.send("health", {"pending": pending}, f"ping{next(self._pings)}", 2**30)
        ping.add_done_callback(lambda done: self._fail_unknown(done, set(pending)))

    def _fail_unknown(self, ping: asyncio.Future[Any], asked: set[str]) -> None:
        if ping.cancelled() or ping.exception() is not None or not isinstance(ping.result(), dict):
            return
        for request_id in ping.result().get("unknown") or []:
            future = self.waiting.pop(request_id, None) if request_id in asked else None
            if future is not None and not future.done():
                future.set_exception(HostLost(
                    f"env server at {self.address} has no record of request {request_id} (lost: it was restarted, "
                    "or it cut the connection, as it does a frame over its size limit)"))


def _ignore(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
