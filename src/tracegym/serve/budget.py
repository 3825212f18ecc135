"""Budget: the bytes of `run` requests an env server holds (received, not yet answered), per peer and in all.

A request is counted when it is received and released when it is answered (or refused); one that would take its
peer (a ZMQ routing identity: one client connection) or the whole server past its budget is refused at once, so
the server never holds more than the budget plus the one request it is looking at. Who counts as a peer depends
on the shared secret: with one, every peer the server hears from has proved it in the handshake (the others are
refused before they can send a byte of payload) and gets `max_peer_bytes`, all of them together `max_server_bytes`;
without one, any process on the host is a peer and can open as many connections as it likes, so one much smaller
budget, `max_open_bytes`, bounds each connection and all of them together.

>>> budget = Budget.for_server(secret=False, open_bytes=100, peer_bytes=1000, server_bytes=4000)
>>> budget.take(b"a", 60), budget.refusal(b"a", 60) is not None, budget.refusal(b"b", 40)
(None, True, None)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracegym.core.errors import UsageError

MIB = 1024 * 1024
MAX_OPEN_BYTES = 128 * MIB
"""Default budget of a server without a shared secret, per connection and in all: a local eval's requests (a few
KB each; a few MB with images) fit thousands at a time."""
MAX_PEER_BYTES = 1024 * MIB
"""Default budget of one connection that proved the shared secret."""
MAX_SERVER_BYTES = 4096 * MIB
"""Default budget of all connections together, on a server with a shared secret."""


@dataclass
class Budget:
    """Bytes held per peer and in all, against the limits in force (`for_server`)."""

    per_peer: int
    total: int
    peer_flag: str
    """The option that sets `per_peer` (named in a refusal)."""
    total_flag: str
    held: dict[bytes, int] = field(default_factory=dict)
    held_total: int = 0

    @classmethod
    def for_server(cls, *, secret: bool, open_bytes: int, peer_bytes: int, server_bytes: int) -> Budget:
        """The budget of a server with (or without) a shared secret."""
        if secret:
            return cls(peer_bytes, server_bytes, "--max-peer-bytes", "--max-server-bytes")
        return cls(open_bytes, open_bytes, "--max-open-bytes", "--max-open-bytes")

    def check_fits(self, request_bytes: int) -> None:
        """A UsageError unless one request of the largest size taken fits both budgets (it would always be
        refused)."""
        for limit, flag in ((self.per_peer, self.peer_flag), (self.total, self.total_flag)):
            if limit < request_bytes:
                raise UsageError(f"{flag} ({limit} bytes) is below the request size limit ({request_bytes} bytes, "
                                 "--max-request-bytes): the largest request would never fit; raise it")

    def refusal(self, peer: bytes, size: int) -> str | None:
        """Why a request of `size` bytes from `peer` does not fit (None: it does)."""
        mine = self.held.get(peer, 0)
        if mine + size > self.per_peer:
            return (f"this connection has {mine} bytes of requests not yet answered and this one is {size}: the "
                    f"server holds at most {self.per_peer} bytes per connection ({self.peer_flag}); send it again "
                    "once some are answered")
        if self.held_total + size > self.total:
            return (f"the server holds {self.held_total} bytes of requests not yet answered and this one is {size}: "
                    f"it holds at most {self.total} bytes in all ({self.total_flag}); send it again later")
        return None

    def take(self, peer: bytes, size: int) -> None:
        """Count a request the server now holds."""
        self.held[peer] = self.held.get(peer, 0) + size
        self.held_total += size

    def release(self, peer: bytes, size: int) -> None:
        """Forget a request answered (a peer holding nothing is forgotten too)."""
        left = self.held.get(peer, 0) - size
        if left > 0:
            self.held[peer] = left
        else:
            self.held.pop(peer, None)
        self.held_total -= size
