"""Warm pool: sandboxes of one runtime opened ahead of need, so that a rollout's sandbox is taken, not made.

`open()` is the slow, host-side part of a sandbox's start (its working directory and tmpfs, its cgroup where the
runtime makes one); the pool does it in the background, one sandbox at a time, up to its size, and `take` hands
out a ready one in microseconds (None when none is ready: the caller opens one itself). Each pooled sandbox is
handed out once, never given back: a rollout closes its sandbox as always, and the next rollout gets another that
no program ever ran in (siblings share nothing). `close` closes what was never handed out; sandboxes still pooled
when the process exits are closed then, and those of a process that died are removed by the next one's first
sandbox (`process_sandbox.remove_abandoned_workdirs`: their working directories carry the owner's pid).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
from collections import deque
from collections.abc import Hashable

from tracegym.runtimes.sandbox import Runtime, Sandbox

log = logging.getLogger(__name__)


def pool_key(runtime: Runtime) -> Hashable | None:
    """What makes two runtimes' sandboxes interchangeable: the runtime's class and its settings (its attributes:
    limits, isolation, image); None when a setting cannot be compared (not hashable), and such a runtime is not
    pooled."""
    try:
        key = (type(runtime), tuple(sorted(vars(runtime).items())))
        hash(key)
    except TypeError:
        return None
    return key


class WarmPool:
    """Up to `size` sandboxes of `runtime`, opened ahead in the background (see the module docstring)."""

    def __init__(self, runtime: Runtime, size: int) -> None:
        self.runtime, self.size = runtime, size
        self._ready: deque[Sandbox] = deque()
        self._refill: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._closed = False
        self.failed: str | None = None
        """Why the last background open failed (the pool then stops refilling; takers open cold and see why)."""
        atexit.register(self._close_at_exit)

    @property
    def ready(self) -> int:
        """Sandboxes ready to take now."""
        return len(self._ready)

    def take(self) -> Sandbox | None:
        """A ready sandbox, never handed out before (None when none is ready); the pool refills behind it."""
        sandbox = self._ready.popleft() if self._ready else None
        self.fill()
        return sandbox

    def fill(self) -> None:
        """Start refilling in the background up to `size` (nothing when it is refilling already or closed)."""
        if not self._closed and self.failed is None and (self._refill is None or self._refill.done()):
            self._refill = asyncio.ensure_future(self._open_ahead())

    async def full(self) -> None:
        """Wait until `size` sandboxes are ready (or the pool stopped refilling: closed, or an open failed)."""
        while len(self._ready) < self.size and not self._closed and self.failed is None:
            self._changed.clear()
            await self._changed.wait()

    async def _open_ahead(self) -> None:
        while len(self._ready) < self.size and not self._closed:
            try:
                sandbox = await self.runtime.open()
            except Exception as exc:  # a runtime this host lacks, a full disk: the takers' own opens say so
                self.failed = f"{type(exc).__name__}: {exc}"
                log.warning("warm pool of runtime %r stopped refilling: %s", self.runtime.name, self.failed)
                break
            if self._closed:
                await sandbox.close()
                break
            self._ready.append(sandbox)
            self._changed.set()
        self._changed.set()

    async def close(self) -> None:
        """Stop refilling and close every sandbox never handed out."""
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refill
        while self._ready:
            await self._ready.popleft().close()
        self._changed.set()
        atexit.unregister(self._close_at_exit)

    def _close_at_exit(self) -> None:
        """At interpreter exit: close what is still pooled (its loop is gone; a new one does it)."""
        if self._ready:
            with contextlib.suppress(Exception):
                asyncio.run(self._close_ready())

    async def _close_ready(self) -> None:
        while self._ready:
            await self._ready.popleft().close()
