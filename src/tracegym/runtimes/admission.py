"""Admission: the gate every rollout's sandbox passes through on its way open; it caps the sandboxes starting at
once, spreads a burst of starts, bounds how long a start may wait and take, and refuses what the host's memory
cannot hold.

A sandbox's start is its `Runtime.open()` (working directory, tmpfs, cgroup) and its first program's launch (the
runtime's wrapper, namespaces or container, the program init): at most `starting` of these run at once; the rest
queue in arrival order. A start that arrives while others start or queue first waits a random delay up to
`jitter_s`, so a burst of hundreds does not reach the kernel or the container engine in one instant. The first
program keeps its start slot until it returns or `start_hold_s` passed (an agent program that runs for minutes
gives it back then: its launch is long done).

Each admitted sandbox commits its `Limits.memory_mb` (its cap) until it closes. A new one is admitted when the
committed caps and its own fit the host's MemAvailable (read from /proc/meminfo when none of ours was admitted)
less `memory_reserve_mb`, and it alone fits what is available now (other processes use memory too); else it waits
its turn. One that could not fit even on an empty host (its cap above MemTotal less the reserve) is refused at once,
naming `memory_mb` and what the host has. `memory_overcommit` counts each cap at a fraction of itself, for
sandboxes known to use less than their cap.

Waiting for memory, for a start slot and the open itself share one budget, `setup_budget_s`: past it the open fails
with a SandboxSetupTimeout naming the runtime, the budget and what it was waiting for (an infrastructure error: the
rollout is recorded as failed, its siblings go on; an open that finishes late is closed, never leaked).

With `warm_pool` > 0, sandboxes are opened ahead per runtime (`runtimes.warm_pool`) and a start takes one at once
(no jitter, no start slot: its first program's launch still takes one); the first open of a runtime is cold and
starts its pool. A runtime without `Limits` states no memory cap: its sandboxes are not counted (said once in the
log).

The defaults come from the host (`AdmissionConfig`): 8 x CPU cores starting at once (8 to 64), a reserve of a
tenth of the memory (512 MB to 8 GB). The state is per event loop and process (`admission()`, set up by
`configure_admission`). An env server holds its `sandbox` config for all its worker processes together by
splitting it: each of its `n` processes that may run rollouts at once (its most workers plus its spares) admits
`max_starting // n` starts at once and commits at most an `n`-th of the host's memory for sandboxes (a sandbox
above that share is refused, naming it); the live MemAvailable check sees every process's use. A split wastes
what an idle worker leaves unused (the remainder of `max_starting // n` too), but needs no state shared between
processes: the cap holds whatever the workers do, die or restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import FailureKind, InfrastructureError, UsageError
from tracegym.runtimes.sandbox import Forward, Limits, ProgramResult, Runtime, Sandbox
from tracegym.runtimes.warm_pool import WarmPool, pool_key
from tracegym.runtimes.workdir import READ_CAP_BYTES

T = TypeVar("T")
log = logging.getLogger(__name__)
MEMORY_POLL_S = 0.25
"""How often a start waiting for memory reads /proc/meminfo again (other processes free memory without telling)."""
_CLOSING: set[asyncio.Future[None]] = set()
"""Closes of sandboxes whose open finished past its budget (kept until done)."""
MAX_POOLS = 8
"""Runtimes (by settings) that get a warm pool at most; others open cold."""


class AdmissionConfig(BaseModel):
    """How sandboxes are admitted; the defaults are derived from this host (see each field). An env server takes
    it as its `sandbox` section (`tracegym serve --sandbox.max-starting 16`, `tracegym eval
    --env.sandbox.warm-pool 4`) and splits it over its worker processes (see `Admission`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_starting: int = Field(default_factory=lambda: default_starting(os.cpu_count() or 1), gt=0)
    """Sandboxes starting at once (open and first program launch): 8 x CPU cores, at least 8, at most 64 (16 on a
    2-core machine, 64 from 8 cores): a start mostly waits (on the kernel, an engine, the program's interpreter
    loading), so a few per core keep the cores busy without a burst reaching the kernel or an engine at once."""
    jitter_s: float = Field(0.05, ge=0)
    """Longest random delay before a start that arrives while others start or queue (0: none)."""
    start_hold_s: float = Field(1.0, ge=0)
    """Longest a sandbox's first program keeps its start slot (it gives it back when it returns, if sooner)."""
    setup_budget_s: float = Field(120.0, gt=0)
    """Longest an open may wait for memory and a start slot and take, in all, before it fails."""
    memory_reserve_mb: int = Field(default_factory=lambda: default_reserve_mb(host_memory().total_mb), ge=0)
    """Host memory kept free of sandboxes: a tenth of MemTotal, at least 512 MB, at most 8 GB."""
    memory_overcommit: float = Field(1.0, gt=0)
    """How many times the host's memory the admitted sandboxes' `memory_mb` may add up to (1: every sandbox may
    fill its cap at once and the host still holds them)."""
    warm_pool: int = Field(0, ge=0)
    """Sandboxes kept opened ahead per runtime (0: none; each holds a working directory, a tmpfs, a cgroup), in each
    process that admits sandboxes: an env server's worker processes each keep their own (a sandbox is handed out by
    the process that opened it)."""


def default_starting(cores: int) -> int:
    """Sandboxes starting at once on a host with `cores` CPU cores."""
    return max(8, min(64, 8 * cores))


def default_reserve_mb(total_mb: int) -> int:
    """Memory kept free of sandboxes on a host of `total_mb`."""
    return max(512, min(8192, total_mb // 10))


@dataclass(frozen=True)
class HostMemory:
    """The host's memory, in MB, from /proc/meminfo."""

    total_mb: int
    available_mb: int


def host_memory(meminfo: Path = Path("/proc/meminfo")) -> HostMemory:
    """MemTotal and MemAvailable now (without /proc, the physical memory as both)."""
    try:
        text = meminfo.read_text()
    except OSError:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
        return HostMemory(total, total)
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields[name] = int(value.split()[0]) >> 10  # kB
    return HostMemory(fields["MemTotal"], fields["MemAvailable"])


class SandboxRefused(InfrastructureError):
    """A sandbox this host cannot hold: its memory cap is above what the host has for sandboxes."""

    failure = FailureKind.SANDBOX_ERROR


class SandboxSetupTimeout(InfrastructureError):
    """A sandbox's open waited or took longer than its setup budget."""

    failure = FailureKind.SANDBOX_ERROR


class Admission:
    """The gate sandboxes open through (see the module docstring); `memory` reads the host's memory (a fake in
    tests), `rng` draws the jitter. `share`: the processes admitting under `config` together (an env server's
    worker processes): this one admits `max_starting // share` starts at once and a `share`-th of the memory for
    sandboxes, so that all of them together keep within `config`."""

    def __init__(self, config: AdmissionConfig | None = None, *, share: int = 1,
                 memory: Callable[[], HostMemory] = host_memory, rng: random.Random | None = None) -> None:
        self.config = config or AdmissionConfig()
        self.share = share
        self.slots = per_process_starts(self.config, share)
        """Sandboxes this process starts at once (its part of `max_starting`)."""
        self._memory, self._rng = memory, rng or random.Random()
        self._slots = asyncio.Semaphore(self.slots)
        self._memory_freed = asyncio.Event()
        self.starting = 0
        """Starts holding a slot now."""
        self.queued = 0
        """Opens waiting (jitter, memory or a slot) now."""
        self.committed_mb = 0.0
        """The admitted sandboxes' memory caps (each over `memory_overcommit`), until they close."""
        self._baseline_mb: int | None = None
        self._uncounted: set[str] = set()
        self._pools: dict[object, WarmPool] = {}

    async def open(self, runtime: Runtime) -> AdmittedSandbox:
        """A new sandbox of `runtime`, admitted: SandboxRefused when this host could never hold it,
        SandboxSetupTimeout when it waited or took past the setup budget; a runtime's own error as it raised it."""
        need = self._need_mb(runtime)
        deadline = asyncio.get_running_loop().time() + self.config.setup_budget_s
        self.queued += 1
        try:
            await self._within(deadline, runtime, self._reserve(need), "waiting for host memory")
        finally:
            self.queued -= 1
        try:
            sandbox = await self._start(runtime, deadline)
        except BaseException:
            self.release(need)
            raise
        return AdmittedSandbox(sandbox, self, need)

    def _need_mb(self, runtime: Runtime) -> float:
        """What a sandbox of `runtime` commits; SandboxRefused when not even an empty host could hold it."""
        limits = getattr(runtime, "limits", None)
        if not isinstance(limits, Limits):
            if runtime.name not in self._uncounted:
                self._uncounted.add(runtime.name)
                log.warning("runtime %r states no Limits: its sandboxes are not counted against the host's memory",
                            runtime.name)
            return 0.0
        need = limits.memory_mb / self.config.memory_overcommit
        host = self._memory()
        room = (host.total_mb - self.config.memory_reserve_mb) / self.share
        if need > room:
            shared = f", {room:.0f} MB of it this process's (one of {self.share} sharing it)" if self.share > 1 else ""
            raise SandboxRefused(
                f"runtime {runtime.name!r}: a sandbox with Limits.memory_mb={limits.memory_mb} can never start on "
                f"this host: it has {host.total_mb} MB (MemTotal), {host.available_mb} MB available now, less the "
                f"reserve of {self.config.memory_reserve_mb} MB (memory_reserve_mb): "
                f"{host.total_mb - self.config.memory_reserve_mb} MB for sandboxes{shared}; lower memory_mb or the "
                f"reserve")
        return need

    async def _reserve(self, need: float) -> None:
        """Wait until `need` MB fit beside the committed caps and in what is available now; commit them."""
        while not self._fits(need):
            self._memory_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._memory_freed.wait(), MEMORY_POLL_S)
        self.committed_mb += need

    def _fits(self, need: float) -> bool:
        if need == 0:
            return True
        host = self._memory()
        if self.committed_mb == 0:
            self._baseline_mb = host.available_mb  # none of ours runs: what the host has for them
        free_now = host.available_mb - self.config.memory_reserve_mb
        budget = ((self._baseline_mb or host.available_mb) - self.config.memory_reserve_mb) / self.share
        return need <= free_now and self.committed_mb + need <= budget

    def release(self, need: float) -> None:
        """A sandbox's commitment ends (it closed, or never opened); starts waiting for memory look again."""
        self.committed_mb = max(0.0, self.committed_mb - need)
        self._memory_freed.set()

    async def _start(self, runtime: Runtime, deadline: float) -> Sandbox:
        """A pooled sandbox, taken at once; else jitter when others start, a start slot and a new one, within the
        budget."""
        pool = self.pool(runtime)
        taken = pool.take() if pool is not None else None
        if taken is not None:
            return taken
        if self.starting or self.queued:
            self.queued += 1
            try:
                await self._within(deadline, runtime, asyncio.sleep(self._rng.uniform(0, self.config.jitter_s)),
                                   "waiting out its start jitter")
            finally:
                self.queued -= 1
        async with self._slot(runtime, deadline):
            return await self._open_in_time(runtime, deadline)

    @contextlib.asynccontextmanager
    async def _slot(self, runtime: Runtime | None = None, deadline: float | None = None) -> AsyncIterator[None]:
        """Hold one of the `starting` slots, waiting for it at most until `deadline` (when given, with `runtime`
        named in the error)."""
        self.queued += 1
        try:
            if runtime is None or deadline is None:
                await self._slots.acquire()
            else:
                await self._within(deadline, runtime, self._slots.acquire(), "waiting for a start slot")
        finally:
            self.queued -= 1
        self.starting += 1
        try:
            yield
        finally:
            self.starting -= 1
            self._slots.release()

    async def _open_in_time(self, runtime: Runtime, deadline: float) -> Sandbox:
        """`runtime.open()` within the budget; one that finishes past it is closed when it does."""
        opening = asyncio.ensure_future(runtime.open())
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            done, _ = await asyncio.wait({opening}, timeout=max(remaining, 0))
        except BaseException:
            _abandon(opening)
            raise
        if not done:
            _abandon(opening)
            raise self._timeout(runtime, "opening it")
        return opening.result()

    async def _within(self, deadline: float, runtime: Runtime, step: Awaitable[T], doing: str) -> T:
        """Await `step` until `deadline`; past it, SandboxSetupTimeout saying it was `doing`."""
        try:
            async with asyncio.timeout_at(deadline):
                return await step
        except TimeoutError:
            raise self._timeout(runtime, doing) from None

    def _timeout(self, runtime: Runtime, doing: str) -> SandboxSetupTimeout:
        return SandboxSetupTimeout(
            f"runtime {runtime.name!r}: the sandbox's setup ran past its budget of {self.config.setup_budget_s:g} s "
            f"(setup_budget_s) while {doing} ({self.starting} starting of {self.slots} at once, "
            f"{self.queued} queued, {self.committed_mb:.0f} MB of memory caps committed)")

    def pool(self, runtime: Runtime) -> WarmPool | None:
        """The warm pool of sandboxes like `runtime`'s (made, and filling, on its first use); None when pooling is
        off or the runtime cannot be pooled."""
        if not self.config.warm_pool:
            return None
        key = pool_key(runtime)
        if key is None:
            return None
        pool = self._pools.get(key)
        if pool is None and len(self._pools) < MAX_POOLS:
            pool = self._pools[key] = WarmPool(runtime, self.config.warm_pool)
        return pool

    async def first_run(self, start: Callable[[], Awaitable[ProgramResult]]) -> ProgramResult:
        """A sandbox's first program (`start()` runs it), launched holding a start slot that it keeps until it
        returns or `start_hold_s` passed."""
        async with self._slot():
            running = asyncio.ensure_future(start())
            try:
                await asyncio.wait({running}, timeout=self.config.start_hold_s)
            except BaseException:
                running.cancel()
                raise
        return await running

    async def close(self) -> None:
        """Close the warm pools (the sandboxes handed out are their rollouts' to close)."""
        for pool in self._pools.values():
            await pool.close()
        self._pools.clear()


def _abandon(opening: asyncio.Future[Sandbox]) -> None:
    """Stop waiting for an open: cancel it, and close the sandbox should it finish anyway."""
    opening.cancel()

    def close_late(done: asyncio.Future[Sandbox]) -> None:
        if not done.cancelled() and done.exception() is None:
            closing = asyncio.ensure_future(done.result().close())
            _CLOSING.add(closing)
            closing.add_done_callback(_CLOSING.discard)

    opening.add_done_callback(close_late)


class AdmittedSandbox:
    """A sandbox that came through admission: the runtime's own (`inner`), whose first program launches under a
    start slot and whose close ends its memory commitment."""

    def __init__(self, inner: Sandbox, admission: Admission, committed_mb: float) -> None:
        self.inner = inner
        self._admission, self._committed_mb = admission, committed_mb
        self._launched = self._closed = False

    @property
    def workdir(self) -> Path:
        return self.inner.workdir

    def write_file(self, name: str, content: str | bytes) -> None:
        self.inner.write_file(name, content)

    def read_file(self, name: str, cap: int = READ_CAP_BYTES) -> bytes | None:
        return self.inner.read_file(name, cap)

    def cannot_forward(self) -> str | None:
        return self.inner.cannot_forward()

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                  limits: Limits | None = None, forward: Forward | None = None) -> ProgramResult:
        def start() -> Awaitable[ProgramResult]:
            return self.inner.run(argv, env=env, stdin=stdin, limits=limits, forward=forward)

        if self._launched:
            return await start()
        self._launched = True
        return await self._admission.first_run(start)

    async def close(self) -> None:
        try:
            await self.inner.close()
        finally:
            if not self._closed:
                self._closed = True
                self._admission.release(self._committed_mb)


def per_process_starts(config: AdmissionConfig, share: int) -> int:
    """The starts at once of each of `share` processes admitting under `config` together; UsageError naming
    `max_starting` when it cannot give each one start."""
    if why := split_refusal(config, share):
        raise UsageError(why)
    return config.max_starting // share


def split_refusal(config: AdmissionConfig, share: int) -> str | None:
    """Why `config` cannot be split over `share` processes (each needs one start at once), or None."""
    if config.max_starting >= share:
        return None
    return (f"sandbox.max_starting={config.max_starting} is below the {share} worker processes (workers and "
            f"spares) that admit sandboxes under it, each starting at least one at once: raise it to {share} or "
            "more, or run fewer workers")


_ADMISSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Admission] = weakref.WeakKeyDictionary()
_CONFIG: list[tuple[AdmissionConfig | None, int]] = []


def configure_admission(config: AdmissionConfig | None, share: int = 1) -> None:
    """Admit this process's sandboxes under `config` (None: the host's defaults) from now on, as one of `share`
    processes admitting under it together (see Admission): each event loop gets a new gate; sandboxes opened
    before count against the old one until they close."""
    per_process_starts(config or AdmissionConfig(), share)  # a cap too small to split fails here, not at a start
    _CONFIG[:] = [(config, share)]
    _ADMISSIONS.clear()


def admission() -> Admission:
    """The running event loop's admission, made on first use under the configured AdmissionConfig and share
    (else the host's defaults, this process alone)."""
    loop = asyncio.get_running_loop()
    found = _ADMISSIONS.get(loop)
    if found is None:
        config, share = _CONFIG[0] if _CONFIG else (None, 1)
        found = _ADMISSIONS[loop] = Admission(config, share=share)
    return found
