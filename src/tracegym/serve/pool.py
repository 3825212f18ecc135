"""Worker pool: the env server's worker processes: started, picked by load, reaped when dead, grown and shrunk.

Static pools keep `min` workers alive (a dead one is replaced at once). Elastic pools keep between `min` and
`max`, growing by one whenever the load per worker passes `grow_at` and retiring a worker idle for `idle_s`.
Beside them the pool keeps `spares` warm workers (started once the others are ready, given no work): when a
worker dies, or the load calls for one more, a spare takes its place at once (a worker takes a second or more to
start) and a new spare starts behind it.
A worker that dies before saying ready, or is killed for not saying it within `start_timeout`, is a failed start:
it delays the next start (backoff), so a broken taskset cannot spin, and until a worker is ready again no request
waits for growth.
A worker the server reserves for suspects (`isolating`) gets no other work; `solo` names the request a worker
has run alone, so a death can name its cause. A worker left with more than `max_abandoned_threads` threads of
hung sync calls asks to be replaced: it retires (no new work), a replacement starts, and it stops once its
requests are answered.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracegym.runtimes import processes
from tracegym.runtimes.admission import AdmissionConfig

if TYPE_CHECKING:
    from tracegym.envs.harness_choice import HarnessChoice

START_TIMEOUT = 60.0
"""Default seconds a worker may take to say ready before it is killed as a failed start."""
MAX_ABANDONED_THREADS = 32
"""Threads of abandoned sync calls (a tool or scorer past its timeout, still running: Python cannot kill a thread)
a worker may hold before it is replaced; each holds its stack and whatever the hung call holds."""


class PoolSize(BaseModel):
    """How many workers: `PoolSize(min=4)` is a static pool of 4; `PoolSize.elastic()` grows and shrinks."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    min: int = Field(default=1, ge=1)
    """Workers always kept alive."""
    max: int | None = None
    """Most workers (elastic); None: the same as `min` (a static pool)."""
    grow_at: float = Field(default=64.0, gt=0)
    """In-flight requests per worker above which an elastic pool starts another worker."""
    idle_s: float = Field(default=10.0, ge=0)
    """Seconds a worker of an elastic pool stays idle before it is retired."""
    spares: int = Field(default=1, ge=0)
    """Warm workers kept ready beside the pool, given no work until one takes a dead worker's place (or a growing
    pool's next one) at once."""

    @model_validator(mode="after")
    def _max_not_below_min(self) -> PoolSize:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max workers {self.max} is below min {self.min}")
        return self

    @property
    def elastic(self) -> bool:
        return self.max is not None and self.max > self.min

    @property
    def most(self) -> int:
        """Worker processes that may run rollouts at once: the most workers and the spares (each admits its share
        of the server's sandboxes: `runtimes.admission`)."""
        return (self.max or self.min) + self.spares

    @classmethod
    def static(cls, workers: int | None = None, **options: Any) -> PoolSize:
        """`workers` workers; None: one per CPU core, at most 8."""
        return cls(min=workers or min(8, os.cpu_count() or 1), **options)

    @classmethod
    def elastic_up_to(cls, max_workers: int | None = None, **options: Any) -> PoolSize:
        """From one worker up to `max_workers` (None: one per CPU core, at least 2)."""
        return cls(min=1, max=max_workers or max(2, os.cpu_count() or 1), **options)


@dataclass
class WorkerHandle:
    """One worker process and the requests (by key) it is running."""

    name: bytes
    proc: subprocess.Popen
    started: float
    ready: bool = False
    retiring: bool = False
    jobs: set[bytes] = field(default_factory=set)
    idle_since: float = field(default_factory=time.monotonic)
    audit: set[bytes] | None = None
    """The jobs it had when last asked which it still runs (None: no question outstanding)."""
    asked_at: float = 0.0
    """When that question went out (monotonic seconds)."""
    hung: bool = False
    """Killed by the server for leaving a question unanswered (counted as hung, not as retired or died)."""
    isolating: bool = False
    """Reserved by the server for suspect requests (those of a worker that died): `pick()` never returns it."""
    solo: bytes | None = None
    """The job it has run with no other job beside it since that job was assigned (None: none such)."""
    spare: bool = False
    """A warm spare: ready, given no work (`pick()` never returns it) until it takes a place in the pool."""


class WorkerPool:
    """Starts and tracks worker processes; the server asks it whom to send work to and who has died."""

    def __init__(self, taskset_id: str, options: dict[str, Any], backend: str, size: PoolSize,
                 log_dir: Path | None = None, max_abandoned_threads: int = MAX_ABANDONED_THREADS,
                 start_timeout: float = START_TIMEOUT, sandbox: AdmissionConfig | None = None,
                 runtime: str | None = None, harness: HarnessChoice | None = None) -> None:
        self.taskset_id, self.options, self.backend, self.size = taskset_id, options, backend, size
        self.runtime = runtime
        """The runtime every task's sandbox opens in (`Taskset.with_runtime`); None: each task class's choice."""
        self.harness = harness
        """The program that drives every rollout (`Taskset.with_harness`); None: each task class's harness."""
        self.sandbox = sandbox
        """How the workers admit sandboxes, together (each its `size.most`-th share); None: the host's defaults."""
        self.log_dir, self.max_abandoned_threads, self.start_timeout = log_dir, max_abandoned_threads, start_timeout
        self.workers: dict[bytes, WorkerHandle] = {}
        self.promoted = 0
        """Spares that took a place in the pool."""
        self._wanted = size.min
        self._count = 0
        self._failed_starts = 0
        self._next_start = 0.0

    # --- starting and stopping ---------------------------------------------------------------------------
    def spawn(self) -> WorkerHandle:
        """Start one worker process (in the server's process group, so a group signal reaches it)."""
        self._count += 1
        name = f"w{self._count}"
        command = [sys.executable, "-m", "tracegym.serve.worker", "--backend", self.backend, "--name", name,
                   "--taskset", self.taskset_id, "--options", json.dumps(self.options),
                   "--max-abandoned-threads", str(self.max_abandoned_threads),
                   "--sandbox", (self.sandbox or AdmissionConfig()).model_dump_json(), "--sandbox-share",
                   str(self.size.most), *(["--runtime", self.runtime] if self.runtime else []),
                   *(["--harness", self.harness.model_dump_json()] if self.harness else [])]
        out = self._log_file(name)
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out or subprocess.DEVNULL,
                                stderr=out or None)
        if out is not None:
            out.close()
        handle = WorkerHandle(name=name.encode(), proc=proc, started=time.monotonic())
        self.workers[handle.name] = handle
        return handle

    def _log_file(self, name: str) -> IO[bytes] | None:
        if self.log_dir is None:
            return None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return open(self.log_dir / f"worker-{name}.log", "ab")

    def mark_ready(self, name: bytes) -> bool:
        """Record a worker's `ready`; False for a name this pool does not know (a stale worker)."""
        handle = self.workers.get(name)
        if handle is None:
            return False
        handle.ready = True
        handle.spare = len(self._serving()) > self._wanted and len(self._spares()) < self.size.spares
        self._failed_starts = 0
        return True

    def _serving(self) -> list[WorkerHandle]:
        """Workers that serve or are about to (ready or starting, not spares), neither retiring."""
        return [h for h in self.workers.values() if not h.spare and not h.retiring]

    def _spares(self) -> list[WorkerHandle]:
        return [h for h in self.workers.values() if h.spare and not h.retiring]

    def stop_all(self, grace: float = 3.0) -> None:
        """SIGTERM every worker, wait up to `grace` seconds, then SIGKILL the rest and reap them all."""
        processes.stop_all([handle.proc for handle in self.workers.values()], grace)
        self.workers.clear()

    # --- routing -----------------------------------------------------------------------------------------
    def pick(self) -> WorkerHandle | None:
        """The ready worker with the fewest requests, neither retiring nor reserved for suspects; or None. While an
        elastic pool can still grow, a worker with `grow_at` requests takes no more: the rest wait for the worker
        their load starts (sent to a busy one, they would stay there once it is ready)."""
        best = None
        for handle in self.workers.values():
            if handle.ready and not handle.retiring and not handle.isolating and not handle.spare and (
                    best is None or len(handle.jobs) < len(best.jobs)):
                best = handle
        if best is not None and len(best.jobs) >= self.size.grow_at and self._can_grow():
            return None
        return best

    def _can_grow(self) -> bool:
        """Whether an elastic pool has fewer ready workers than its max and another one is sure to come (one
        starting, which says ready or is killed within `start_timeout`, or one to start): no start has failed since
        a worker was last ready. After a failed start nothing waits for growth: the busy workers take the load."""
        ready = sum(1 for h in self._serving() if h.ready)
        return self.size.elastic and ready < (self.size.max or 0) and not self._failed_starts

    def take_spare(self) -> WorkerHandle | None:
        """A ready spare, now one of the pool (a new spare starts behind it); None: none is ready."""
        spare = next((h for h in self._spares() if h.ready), None)
        if spare is not None:
            spare.spare = False
            self.promoted += 1
        return spare

    def assign(self, handle: WorkerHandle, key: bytes) -> None:
        handle.solo = None if handle.jobs else key
        handle.jobs.add(key)

    def release(self, name: bytes, key: bytes) -> None:
        handle = self.workers.get(name)
        if handle is not None:
            handle.jobs.discard(key)
            if handle.solo == key:
                handle.solo = None
            if not handle.jobs:
                handle.idle_since = time.monotonic()

    # --- supervision -------------------------------------------------------------------------------------
    def reap(self) -> list[WorkerHandle]:
        """Workers whose process has exited (removed from the pool), retired ones included; a worker not ready
        within `start_timeout` is killed first (a failed start, like one that exited)."""
        self._kill_overdue_starts()
        dead = [h for h in self.workers.values() if h.proc.poll() is not None]
        for handle in dead:
            del self.workers[handle.name]
            if not handle.ready and not handle.retiring:
                self._failed_starts += 1
                self._next_start = time.monotonic() + min(5.0, 0.1 * 2**self._failed_starts)
        return dead

    def _kill_overdue_starts(self) -> None:
        now = time.monotonic()
        for handle in self.workers.values():
            if not handle.ready and not handle.retiring and now - handle.started > self.start_timeout:
                handle.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL: gone at once, reaped next tick if not
                    handle.proc.wait(1.0)

    def scale(self, load: int) -> list[WorkerHandle]:
        """Fill the places the load calls for (or dead workers left) from the spares, start workers for the rest,
        then the spares behind them; returns idle workers to retire."""
        wanted = self.size.min
        if self.size.elastic:
            assert self.size.max is not None
            wanted = max(self.size.min, min(self.size.max, math.ceil(load / self.size.grow_at)))
        self._wanted = wanted
        self._balance(wanted)
        serving = self._serving()
        starting = sum(1 for h in serving if not h.ready)
        missing = wanted - len(serving)
        if missing <= 0 and not starting:  # the pool is whole: spares start behind it
            missing = self.size.spares - len(self._spares())
        if missing > 0 and time.monotonic() >= self._next_start:
            if self._failed_starts or (self.size.elastic and len(serving) >= self.size.min):
                missing = 1 if starting == 0 else 0  # grow (or retry a failing start) one worker at a time
            for _ in range(missing):
                self.spawn()
            return []
        return self._idle_to_retire(serving, wanted) if self.size.elastic else []

    def _balance(self, wanted: int) -> None:
        """Give places the pool lacks ready workers for to ready spares; an idle worker past them (a spare that
        took suspects, its place since filled) becomes a spare again while spares are lacking."""
        serving = [h for h in self._serving() if h.ready]
        for _ in range(wanted - len(serving)):
            spare = self.take_spare()
            if spare is None:
                return
            spare.idle_since = time.monotonic()
        extra = [h for h in serving if not h.jobs and not h.isolating][:max(0, len(serving) - wanted)]
        for handle in extra[:max(0, self.size.spares - len(self._spares()))]:
            handle.spare = True

    def _idle_to_retire(self, live: list[WorkerHandle], wanted: int) -> list[WorkerHandle]:
        now = time.monotonic()
        idle = [h for h in live if h.ready and not h.jobs and now - h.idle_since >= self.size.idle_s]
        retire = idle[: max(0, len(live) - wanted)]
        for handle in retire:
            handle.retiring = True
        return retire

    @property
    def failing(self) -> bool:
        """True when workers keep dying before they are ready (a broken taskset or environment)."""
        return self._failed_starts >= 3

    def counts(self) -> dict[str, int]:
        """Workers by state (`ready`: serving, spares apart)."""
        ready = sum(1 for h in self._serving() if h.ready)
        return {"ready": ready, "starting": sum(1 for h in self.workers.values() if not h.ready),
                "retiring": sum(1 for h in self.workers.values() if h.retiring),
                "isolating": sum(1 for h in self.workers.values() if h.isolating and not h.retiring),
                "spare": sum(1 for h in self._spares() if h.ready)}

    def pids(self) -> list[int]:
        """Process ids of every worker (starting, ready, spare or retiring)."""
        return [h.proc.pid for h in self.workers.values()]

    def spare_pids(self) -> list[int]:
        """Process ids of the ready spares."""
        return [h.proc.pid for h in self._spares() if h.ready]

