"""Loop socket: a ZMQ socket driven by an asyncio event loop through its file descriptor, with no future per message.

pyzmq's asyncio sockets make a future for every send and receive and look at the socket's events again after
each; on the env server's hot path (a worker's replies, a client's requests) that bookkeeping cost more than the
rollout's own model call. Here every message that arrives is handed to a callback as it is read, and a send goes
out at once, without waiting: only while ZMQ would block (a full queue, no peer yet) is it kept, in order, and sent
when the socket can take it. ZMQ's descriptor signals edges, not levels, so the socket's events are read again
after every batch and after a send (once per loop turn, however many sends there were).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

import zmq

log = logging.getLogger(__name__)

BATCH = 256
"""Most messages handed over in one loop turn; more waiting are read on the next turn, so others get the loop."""


class LoopSocket:
    """`link = LoopSocket(socket, on_message)` (inside a running loop); `link.send(frames)`; `link.close()`."""

    def __init__(self, socket: zmq.Socket, on_message: Callable[[list[bytes]], None]) -> None:
        self.socket, self.on_message = socket, on_message
        self._loop = asyncio.get_running_loop()
        self._fd = int(socket.getsockopt(zmq.FD))
        self._outbox: collections.deque[tuple[list[bytes], bool]] = collections.deque()
        self._checking = False
        self._loop.add_reader(self._fd, self._check)
        self._check_soon()  # messages that came before the reader was added raised no edge

    @property
    def queued(self) -> int:
        """Messages kept because ZMQ would have blocked (sent once it can take them)."""
        return len(self._outbox)

    def send(self, frames: list[bytes], copy: bool = True) -> None:
        """Send one message now, or (ZMQ would block) as soon as the socket can take it, after any kept before."""
        if not self._outbox and self._try(frames, copy):
            self._check_soon()  # the send may have taken the descriptor's edge for a message that arrived meanwhile
            return
        self._outbox.append((frames, copy))
        self._check_soon()

    def _try(self, frames: list[bytes], copy: bool) -> bool:
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return False
        return True

    def _check_soon(self) -> None:
        if not self._checking:
            self._checking = True
            self._loop.call_soon(self._check)

    def _check(self) -> None:
        """Send what was kept while the socket takes it, then hand over what has arrived (a batch at most)."""
        self._checking = False
        if self.socket.closed:
            return
        for _ in range(BATCH):
            events = int(self.socket.getsockopt(zmq.EVENTS))
            while self._outbox and events & zmq.POLLOUT and self._try(*self._outbox[0]):
                self._outbox.popleft()
                events = int(self.socket.getsockopt(zmq.EVENTS))
            if not events & zmq.POLLIN:
                return
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self.on_message(frames)
            except Exception:  # one message its handler fails on must not leave the rest unread
                log.exception("handling a message failed")
            if self.socket.closed:  # the callback closed it
                return
        self._check_soon()

    def close(self) -> None:
        """Stop watching the socket and close it (what was kept unsent is dropped, as LINGER 0 drops it)."""
        if not self.socket.closed:
            self._loop.remove_reader(self._fd)
            self.socket.close(0)
        self._outbox.clear()
