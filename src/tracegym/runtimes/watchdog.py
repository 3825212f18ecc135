"""Watchdog: the one place a run's stages report progress to, and that names a stage silent past its budget.

Every stage of an eval or RL run (`Stage`: model call, tool, scoring, env server, batch assembly, trainer step,
weight sync, checkpoint, eval drain, shutdown) runs inside `watch(stage, detail)`, which reports to the watchdog of
the current context (none: nothing happens, so library code hooks in unconditionally). A stage is *busy* while at
least one `watch` of it is open; it makes *progress* when one closes or `beat` says so. A busy stage silent for its
soft budget is a warning ("no progress in trainer step 41 for 120 s: last event ..."); silent for its hard budget,
the run stops with a one-line cause. Idle stages are never stalled: waiting is the busy stage's business.

    watchdog = build_watchdog(WatchdogConfig(weight_sync=600))
    with watchdog.using(), Watcher(watchdog, warn=print, stop=cancel_the_run):
        with watch(Stage.WEIGHT_SYNC, "step 3"):
            publish()

In one process a `Watcher` thread checks; across processes (an RL run) each role's watchdog writes its snapshot to
a progress file on every change (`ProgressFile`), and the launcher judges the snapshots (`stalls`) against the
budgets. Times are wall-clock seconds (`time.time`) so that snapshots compare across processes; tests inject a
clock. A Watcher whose stop does not end the run within the shutdown budget kills every process this one started
and exits (`last_resort`): a run can never outlive its last step.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import InfrastructureError
from tracegym.runtimes.processes import descendants

T = TypeVar("T")
Clock = Callable[[], float]

STALLED_EXIT = 5
"""Exit code of a run stopped because a stage made no progress within its hard budget."""
DRAIN_CANCELLED_EXIT = 6
"""Exit code of an RL run whose every step trained but whose evaluation after the last step was cancelled (it made
no progress within the eval drain budget); 0 when that evaluation drained."""


class Stage(StrEnum):
    """The stages a run reports; the value is how the log names one."""

    MODEL_CALL = "model call"
    TOOL = "tool"
    SCORING = "scoring"
    ENV_SERVER = "env server"
    BATCH_ASSEMBLY = "batch assembly"
    TRAINER_STEP = "trainer step"
    WEIGHT_SYNC = "weight sync"
    CHECKPOINT = "checkpoint"
    EVAL_DRAIN = "eval drain"
    SHUTDOWN = "shutdown"


class WatchdogConfig(BaseModel):
    """Hard budgets, in seconds of no progress, of each stage (`--watchdog.weight-sync 600`); past one the run
    stops with a non-zero exit naming the stage. A busy stage silent for `warn_after` (or its hard budget, if
    less) is named in the log and the dashboard. The defaults leave room for slow CPU runs: the rollout's own
    timeouts (`--timeouts.*`) end a slow model call, tool or score long before its watchdog budget does; these
    catch what no timeout does (a blocked loop, a reply that never comes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    enabled: bool = True
    """`--no-watchdog.enabled`: never stop a run for lack of progress (warnings still show)."""
    warn_after: float = Field(default=120.0, gt=0)
    """Seconds of silence in a busy stage before it is named as a warning."""
    model_call: float = Field(default=900.0, gt=0)
    """One model call (in this process; the env server's workers bound theirs by `--timeouts.model`)."""
    tool: float = Field(default=300.0, gt=0)
    """One tool call."""
    scoring: float = Field(default=300.0, gt=0)
    """Reward, metric and stop functions."""
    env_server: float = Field(default=3600.0, gt=0)
    """Requests to the env servers, while none of them answers (a rollout's own timeout is 1800 s)."""
    batch_assembly: float = Field(default=1800.0, gt=0)
    """Turning a step's groups into its training batch (advantages, a teacher's logprobs, filters)."""
    trainer_step: float = Field(default=3600.0, gt=0)
    """One optimizer step of the trainer."""
    weight_sync: float = Field(default=900.0, gt=0)
    """Handing new weights to vLLM."""
    checkpoint: float = Field(default=900.0, gt=0)
    """Writing a checkpoint."""
    eval_drain: float = Field(default=3600.0, gt=0)
    """The held-out evaluation after the last step (RL); past it the evaluation is cancelled and the run exits
    with `DRAIN_CANCELLED_EXIT` (6)."""
    shutdown: float = Field(default=120.0, gt=0)
    """Stopping every process of the run once it ends or stops; past it they are killed."""

    def budget(self, stage: Stage) -> Budget:
        hard = getattr(self, stage.name.lower())
        return Budget(soft=min(self.warn_after, hard), hard=hard if self.enabled else float("inf"))


@dataclass(frozen=True)
class Budget:
    """Seconds of silence before a busy stage is warned about (`soft`) and before the run stops (`hard`)."""

    soft: float
    hard: float


@dataclass(frozen=True)
class Stall:
    """A busy stage silent past a budget: which, doing what, for how long, and the last thing its process did."""

    stage: str
    detail: str
    silent_s: float
    last: str
    budget: Budget

    @property
    def hard(self) -> bool:
        return self.silent_s >= self.budget.hard

    @property
    def key(self) -> tuple[str, str]:
        return self.stage, self.detail

    def line(self) -> str:
        """One line: "no progress in trainer step 41 for 120 s: last event ..." (with the hard budget once past
        it)."""
        what = f"{self.stage} {self.detail}".strip()
        past = f" (hard budget {self.budget.hard:g} s)" if self.hard else ""
        return f"no progress in {what} for {self.silent_s:.0f} s{past}: last event {self.last or 'none'}"


@dataclass
class StageState:
    """One stage's open watches (by token, oldest first), and since when it has been silent."""

    busy: dict[int, str] = field(default_factory=dict)
    since: float = 0.0


class Watchdog:
    """The progress of one process's stages. Thread-safe: stages report from any thread or task."""

    def __init__(self, budgets: Callable[[Stage], Budget] | None = None, clock: Clock = time.time,
                 on_change: Callable[[dict[str, Any]], None] | None = None) -> None:
        """`budgets`: each stage's (None: every stage unbudgeted, as a role's whose launcher judges);
        `on_change(snapshot)`: hears of every change (a role writes it to its progress file)."""
        self.budgets, self.clock, self.on_change = budgets, clock, on_change
        self.stages: dict[str, StageState] = {}
        self.last = ""
        """The latest event of any stage, with its time of day."""
        self._lock = threading.Lock()
        self._reporting = threading.Lock()
        """Held while a snapshot is taken and handed on: what `on_change` hears last is the newest."""
        self._tokens = itertools.count()

    @contextlib.contextmanager
    def watch(self, stage: Stage, detail: str = "") -> Iterator[None]:
        """The stage is busy until the block ends; its end is progress."""
        token = self._enter(stage, detail)
        try:
            yield
        finally:
            self._event(stage, f"{stage.value} {detail} ended".replace("  ", " "), token)

    def beat(self, stage: Stage, event: str) -> None:
        """Progress within a busy stage (one of a step's requests answered, say); ignored when it is idle."""
        if stage.value in self.stages and self.stages[stage.value].busy:
            self._event(stage, event)

    def stalls(self) -> list[Stall]:
        """Busy stages silent past their soft budget, now (hard ones first)."""
        if self.budgets is None:
            return []
        return stalls(self.snapshot(), self.budgets, self.clock())

    def snapshot(self) -> dict[str, Any]:
        """Every stage's state as plain data: `{"last": event, "stages": {stage: {"busy": [detail, ...],
        "since": t}}}`."""
        with self._lock:
            stages = {name: {"busy": list(s.busy.values()), "since": s.since} for name, s in self.stages.items()}
            return {"last": self.last, "stages": stages}

    @contextlib.contextmanager
    def using(self) -> Iterator[Watchdog]:
        """Make this the watchdog `watch` and `beat` report to, in this context (tasks and threads started in it
        with a copy of it included)."""
        token = CURRENT.set(self)
        try:
            yield self
        finally:
            CURRENT.reset(token)

    def _enter(self, stage: Stage, detail: str) -> int:
        token = next(self._tokens)
        with self._lock:
            state = self.stages.setdefault(stage.value, StageState())
            if not state.busy:  # silence counts from when it became busy
                state.since = self.clock()
            state.busy[token] = detail
        self._changed()
        return token

    def _event(self, stage: Stage, event: str, leaving: int | None = None) -> None:
        with self._lock:
            state = self.stages.setdefault(stage.value, StageState())
            if leaving is not None:
                state.busy.pop(leaving, None)
            state.since, self.last = self.clock(), f"{event} at {time.strftime('%H:%M:%S')}"
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            with self._reporting:
                self.on_change(self.snapshot())


CURRENT: contextvars.ContextVar[Watchdog | None] = contextvars.ContextVar("watchdog", default=None)


def watch(stage: Stage, detail: str = "") -> contextlib.AbstractContextManager[None]:
    """`Watchdog.watch` on the current context's watchdog; nothing without one."""
    watchdog = CURRENT.get()
    return watchdog.watch(stage, detail) if watchdog is not None else contextlib.nullcontext()


ROLLOUT_STAGES = {"model": Stage.MODEL_CALL, "tool": Stage.TOOL, "scoring": Stage.SCORING, "stop": Stage.SCORING}
"""The rollout loop's stage names (`model`, `tool:NAME`, `scoring:NAME`, `stop:NAME`) the watchdog watches."""


def watch_named(name: str) -> contextlib.AbstractContextManager[None]:
    """`watch` of a rollout loop's stage by its name there (`tool:search` is the tool stage, doing `search`);
    nothing for a stage the watchdog leaves to the rollout's own timeouts (setup, environment responses)."""
    kind, _, detail = name.partition(":")
    stage = ROLLOUT_STAGES.get(kind)
    return watch(stage, detail) if stage is not None else contextlib.nullcontext()


def beat(stage: Stage, event: str) -> None:
    """`Watchdog.beat` on the current context's watchdog; nothing without one."""
    watchdog = CURRENT.get()
    if watchdog is not None:
        watchdog.beat(stage, event)


def stalls(snapshot: dict[str, Any], budgets: Callable[[Stage], Budget], now: float) -> list[Stall]:
    """The busy stages of a snapshot silent past their soft budget at `now`, hard ones first, then longest silent;
    each named by its oldest open watch."""
    found = []
    for name, state in snapshot.get("stages", {}).items():
        if not state["busy"] or name not in Stage._value2member_map_:
            continue
        budget = budgets(Stage(name))
        silent = now - state["since"]
        if silent >= budget.soft:
            found.append(Stall(name, state["busy"][0], silent, snapshot["last"], budget))
    return sorted(found, key=lambda s: (not s.hard, -s.silent_s))


def build_watchdog(config: WatchdogConfig, clock: Clock = time.time) -> Watchdog:
    """The watchdog of one process, judging its own stages by `config`'s budgets."""
    return Watchdog(config.budget, clock)


class Stalled(InfrastructureError):
    """A stage made no progress within its hard budget; the message is the one-line cause."""


class Watcher:
    """Checks a watchdog every `every` seconds on a daemon thread: `warn(stall)` once per stall past its soft
    budget, and `stop(stall)` at the first past its hard budget. After a stop the run has the shutdown budget to
    end (leave the `with` block) before `last_resort` ends it. `check()` is the one look, callable directly."""

    def __init__(self, watchdog: Watchdog, warn: Callable[[Stall], None], stop: Callable[[Stall], None], *,
                 every: float = 1.0, shutdown: float = 120.0) -> None:
        self.watchdog, self.warn, self.stop, self.every, self.shutdown = watchdog, warn, stop, every, shutdown
        self.stopped: Stall | None = None
        self.warned: set[tuple[str, str, float]] = set()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ended.set()

    def check(self) -> Stall | None:
        """Warn of new stalls; stop at the first hard one (returned)."""
        for stall in self.watchdog.stalls():
            if stall.hard:
                self.stopped = stall
                self.stop(stall)
                return stall
            key = (*stall.key, self.watchdog.snapshot()["stages"][stall.stage]["since"])
            if key not in self.warned:
                self.warned.add(key)
                self.warn(stall)
        return None

    def _run(self) -> None:
        while not self._ended.wait(self.every):
            stall = self.check()
            if stall is not None:
                if not self._ended.wait(self.shutdown):
                    last_resort(f"{stall.line()}; then stopping took longer than the shutdown budget "
                                f"({self.shutdown:g} s)")
                return


def last_resort(cause: str, code: int = STALLED_EXIT) -> None:
    """Kill every process this one started (their children too), say why in one line, and exit now."""
    print(f"tracegym: {cause}; killed every process the run started", file=sys.stderr, flush=True)
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    os._exit(code)


async def until_stalled(aw: Awaitable[T], watchdog: Watchdog, warn: Callable[[Stall], None], *,
                        shutdown: float = 120.0) -> T:
    """Await `aw` with `watchdog` current and watched: a hard stall cancels it and raises `Stalled` with the
    one-line cause (what `aw`'s `finally` and `with` blocks started is stopped as it unwinds)."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None
    soft = min(watchdog.budgets(s).soft for s in Stage) if watchdog.budgets else 1.0

    def stop(stall: Stall) -> None:
        loop.call_soon_threadsafe(task.cancel)

    watcher = Watcher(watchdog, warn, stop, every=min(1.0, max(0.01, soft / 4)), shutdown=shutdown)
    with watchdog.using(), watcher:
        try:
            return await aw
        except asyncio.CancelledError:
            if watcher.stopped is None:
                raise
            task.uncancel()
            raise Stalled(watcher.stopped.line()) from None


class ProgressFile:
    """A role's watchdog snapshot on disk, rewritten whole (atomically) for the launcher to read. `write` hands the
    snapshot to a writer thread, which writes the newest one it has: a burst of changes costs one write, and the
    stage that reported (the orchestrator's event loop, say) never waits for the disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._newest: dict[str, Any] | None = None
        self._pending = threading.Event()
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None

    def write(self, snapshot: dict[str, Any]) -> None:
        with self._lock:
            self._newest = snapshot
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_newest, name="progress-file", daemon=True)
                self._writer.start()
        self._pending.set()

    def read(self) -> dict[str, Any]:
        """The last snapshot written; empty before the first (or when unreadable, mid-replace on odd filesystems)."""
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _write_newest(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        while self._pending.wait():
            self._pending.clear()
            with self._lock:
                snapshot = self._newest
            temporary.write_text(json.dumps(snapshot))
            temporary.replace(self.path)


def progress_file(logs: Path, role: str) -> ProgressFile:
    """Where the role `role` of a run with log folder `logs` reports its progress."""
    return ProgressFile(logs / f"progress-{role}.json")


@contextlib.contextmanager
def reporting(logs: Path, role: str) -> Iterator[Watchdog]:
    """A role's watchdog, current while the block runs, that writes each change to the role's progress file (the
    launcher judges it)."""
    sink = progress_file(logs, role)
    with Watchdog(on_change=sink.write).using() as watchdog:
        yield watchdog


class ProgressFiles:
    """The launcher's watchdog over its roles: reads every role's progress file (`reporting`) in a log folder
    and judges each snapshot against the budgets; each stall past its soft budget is news once."""

    def __init__(self, logs: Path, config: WatchdogConfig, clock: Clock = time.time) -> None:
        self.logs, self.config, self.clock = logs, config, clock
        self.warned: set[tuple[str, str, str, float]] = set()

    def check(self) -> tuple[list[str], tuple[str, Stall] | None]:
        """The new warnings (one line each, naming the role), and the first (role, stall) past its hard budget."""
        news: list[str] = []
        now = self.clock()
        for path in sorted(self.logs.glob("progress-*.json")):
            role = path.stem.removeprefix("progress-")
            snapshot = ProgressFile(path).read()
            for stall in stalls(snapshot, self.config.budget, now):
                if stall.hard:
                    return news, (role, stall)
                key = (role, *stall.key, snapshot["stages"][stall.stage]["since"])
                if key not in self.warned:
                    self.warned.add(key)
                    news.append(f"watchdog: {role}: {stall.line()}")
        return news, None


class ShutdownDeadline:
    """Bounds the stopping of a run: once `start`ed, the block must end within `seconds` or `last_resort` kills
    every process the run started and exits."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._done = threading.Event()

    def __enter__(self) -> ShutdownDeadline:
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def start(self) -> None:
        def wait() -> None:
            if not self._done.wait(self.seconds):
                last_resort(f"stopping the run's processes took longer than the shutdown budget ({self.seconds:g} s)")

        threading.Thread(target=wait, name="shutdown-deadline", daemon=True).start()
