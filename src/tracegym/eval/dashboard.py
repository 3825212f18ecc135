"""Dashboard: live progress of an eval: a rich display, or plain log lines (`--no-rich`) for CI and files.

Both read the same running tally, updated once per finished trace: progress with ETA, mean reward, errors,
throughput, and the latest completions.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import IO, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from tracegym.core.trace import Trace


class Tally:
    """Running figures of an eval, updated per finished trace."""

    def __init__(self, total: int, done_before: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # seconds from a fixed point; injectable so tests run the dashboard on a fake clock
        self.total = total
        self.done = done_before
        self.new = 0
        self.reward_sum = 0.0
        self.scored = 0
        self.errors: Counter[str] = Counter()
        self.truncated = 0
        self.completion_tokens = 0
        self.latest: deque[Trace] = deque(maxlen=4)
        self.started = clock()

    def add(self, trace: Trace) -> None:
        self.done += 1
        self.new += 1
        if trace.reward is not None:
            self.reward_sum += trace.reward
            self.scored += 1
        for kind in {e.kind.value for e in trace.errors}:
            self.errors[kind] += 1
        self.truncated += trace.is_truncated
        self.completion_tokens += trace.usage.completion_tokens
        self.latest.append(trace)

    def restart_clock(self) -> None:
        """Measure rates from now (the model is up and rollouts start)."""
        self.started = self.clock()

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.scored if self.scored else math.nan

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def rates(self) -> tuple[float, float]:
        """(rollouts/s, completion tokens/s) of this session."""
        seconds = max(self.elapsed, 1e-9)
        return self.new / seconds, self.completion_tokens / seconds

    def line(self) -> str:
        """One plain status line."""
        per_s, tok_s = self.rates()
        errors = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())) or "none"
        return (f"{self.done}/{self.total} rollouts  reward {self.mean_reward:.3f}  errors {errors}  "
                f"truncated {self.truncated}  {per_s:.2f} rollouts/s  {tok_s:.0f} tok/s")


class Dashboard(Protocol):
    """Shows a Tally as it changes; the caller adds each trace to the tally, then calls `update`."""

    def __enter__(self) -> Dashboard: ...
    def __exit__(self, *exc: object) -> None: ...
    def update(self, trace: Trace) -> None: ...
    def warn(self, line: str) -> None:
        """Show a watchdog warning (a stage silent past its soft budget); called from the watchdog's thread."""


class PlainDashboard:
    """A status line every `every` traces and at the end (once, if the last trace already printed one), plus one
    line per errored trace."""

    def __init__(self, tally: Tally, out: IO[str], every: int = 10) -> None:
        self.tally, self.out, self.every = tally, out, every
        self._status_at: int | None = None

    def __enter__(self) -> PlainDashboard:
        print(f"eval: {self.tally.total - self.tally.done} rollouts to run", file=self.out, flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status_at != self.tally.new:
            self._status()

    def update(self, trace: Trace) -> None:
        if not trace.ended_normally:
            for error in trace.errors:
                print(f"eval: {trace.task_key}#{trace.rollout_index} {error.kind.value} error in {error.stage}: "
                      f"{error.message[:200]}", file=self.out, flush=True)
        if self.tally.new % self.every == 0:
            self._status()

    def warn(self, line: str) -> None:
        print(f"eval: watchdog: {line}", file=self.out, flush=True)

    def _status(self) -> None:
        print(f"eval: {self.tally.line()}", file=self.out, flush=True)
        self._status_at = self.tally.new


class RichDashboard:
    """A live panel: progress bar with ETA, running figures, the latest completions."""

    def __init__(self, tally: Tally, title: str, console: Console | None = None) -> None:
        self.tally, self.title = tally, title
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), get_time=tally.clock)
        self._bar = self.progress.add_task("rollouts", total=tally.total, completed=tally.done)
        self.warning = ""
        """The watchdog's latest warning, shown under the figures."""
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> RichDashboard:
        self.progress.reset(self._bar, total=self.tally.total, completed=self.tally.done)  # clock from now
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.update(self._render())
        self.live.__exit__(None, None, None)

    def update(self, trace: Trace) -> None:
        self.progress.update(self._bar, completed=self.tally.done)
        self.live.update(self._render())

    def warn(self, line: str) -> None:
        self.warning = line
        self.live.update(self._render())

    def _render(self) -> Panel:
        t = self.tally
        per_s, tok_s = t.rates()
        errors = " ".join(f"{k}={v}" for k, v in sorted(t.errors.items()))
        figures = Text.from_markup(
            f"mean reward [bold]{t.mean_reward:.3f}[/]   scored {t.scored}   errors [red]{sum(t.errors.values())}[/]"
            f"{' (' + errors + ')' if errors else ''}   truncated {t.truncated}   {per_s:.2f} rollouts/s   "
            f"{tok_s:.0f} tok/s")
        latest = Table(show_header=True, header_style="dim", expand=True, box=None)
        latest.add_column("task", no_wrap=True, max_width=22)
        latest.add_column("reward", justify="right", width=7)
        latest.add_column("stop", width=10)
        latest.add_column("completion", ratio=1, no_wrap=True)
        for trace in reversed(t.latest):
            reward = "-" if trace.reward is None else f"{trace.reward:.3f}"
            text = trace.last_reply.replace("\n", " ⏎ ")[:200]
            latest.add_row(f"{trace.task_key[:16]}#{trace.rollout_index}", reward, str(trace.stop_reason), text)
        warning = [Text(f"watchdog: {self.warning}", style="bold yellow")] if self.warning else []
        return Panel(Group(self.progress, figures, *warning, latest), title=self.title, border_style="blue")
