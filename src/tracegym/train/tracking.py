"""Tracking: the orchestrator's records (what `metrics.jsonl` holds) mirrored to Weights & Biases and TensorBoard,
with a table of a few traces per step.

The RL config's `[tracking]` section (`TrackingConfig`) turns each on; `build_tracking` makes what it asks for and
the run folder hands it every record as it is appended (`RLFolder.track`), so nothing is logged twice or missed.
A step's record logs its numbers under their own names (`reward`, `failed/timeout`, `difficulty/<env>/in_band`), a
held-out evaluation's under `eval/<env>/...` at its `eval_step`, an event record (one with a text field, e.g.
`invalid_trace`) its numbers under that field's name, and a record with no step of its own (an event between
steps) under its first field's name, at the latest step. The trainer's records (`trainer_metrics.jsonl`, written by
another process) are followed at each step and at the end, their numbers logged as `trainer/<name>` at their own
step (in W&B on the axis `trainer/step`: W&B drops a step earlier than one it has). Each tool is imported only when
enabled; enabled but not installed is a config error naming the key.

>>> scalars({"time": 1.0, "step": 3, "reward": 0.5, "failed/timeout": 1, "staleness": None})
(3, {'reward': 0.5, 'failed/timeout': 1.0})
>>> scalars({"eval_step": 5, "env": "wordle", "eval_reward": 0.25})
(5, {'eval/wordle/eval_reward': 0.25})
>>> scalars({"step": 2, "invalid_trace": "no logprobs", "problems": 3})
(2, {'invalid_trace/problems': 3.0})
>>> scalars({"empty_batch": 4, "attempt": 1, "rollouts": 8})
(None, {'empty_batch': 4.0, 'empty_batch/attempt': 1.0, 'empty_batch/rollouts': 8.0})
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tracegym.core.errors import UsageError
from tracegym.core.messages import Message
from tracegym.core.trace import Trace

SAMPLE_COLUMNS = ("step", "taskset", "task", "prompt", "completion", "reward")
"""The sample table's columns."""
TRAINER_STEP = "trainer/step"
"""The W&B axis of the trainer's numbers."""
TENSORBOARD_DIR = "tensorboard"
"""TensorBoard's event files, under the run folder."""


class WandbConfig(BaseModel):
    """Weights & Biases (`[tracking.wandb]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    project: str = "tracegym"
    """The W&B project."""
    entity: str | None = None
    """The W&B team or user; unset: your default entity."""
    name: str | None = None
    """The W&B run's name; unset: the run folder's name."""
    group: str | None = None
    """A W&B group to put the run in (e.g. the runs of one sweep)."""
    tags: list[str] = Field(default_factory=list)
    """W&B tags."""
    mode: Literal["online", "offline"] = "online"
    """`online` (uploads as it goes; needs `wandb login`) or `offline` (writes under the run folder's `wandb/`, no
    network; upload later with `wandb sync`)."""


class TrackingConfig(BaseModel):
    """Where the orchestrator's records go besides `metrics.jsonl` (`[tracking]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    wandb: WandbConfig | None = None
    """Log to Weights & Biases, e.g. `wandb = { project = "my-project", mode = "offline" }` (package `wandb`:
    `pip install 'tracegym[track]'`); unset: off. A resumed run starts a new W&B run."""
    tensorboard: bool = False
    """Write TensorBoard event files under the run folder's `tensorboard/` (package `tensorboard`)."""
    samples: int = Field(default=4, ge=0)
    """Traces per step in the sample table (prompt, completion, reward; the first rollout of each task first)."""

    @field_validator("wandb")
    @classmethod
    def _wandb_installed(cls, value: WandbConfig | None) -> WandbConfig | None:
        if value is not None:
            require("wandb", "tracking.wandb")
        return value

    @field_validator("tensorboard")
    @classmethod
    def _tensorboard_installed(cls, value: bool) -> bool:
        if value:
            require("tensorboard", "tracking.tensorboard")
        return value


def require(module: str, key: str) -> None:
    """Refuse a tracking key whose package is not installed, naming both."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules (imports of it fail)
        found = False
    if not found:
        raise ValueError(f"{key} needs the `{module}` package, which is not installed: pip install 'tracegym[track]' "
                         f"(or turn {key} off)")


class Tracker(Protocol):
    """One tracking tool: takes numbers and sample tables at a step."""

    def scalars(self, step: int, numbers: dict[str, float]) -> None: ...

    def table(self, step: int, rows: list[list[Any]]) -> None:
        """Sample rows under SAMPLE_COLUMNS."""

    def trainer_scalars(self, step: int, numbers: dict[str, float]) -> None:
        """The trainer's numbers of `step`, which may be earlier than a step already logged."""

    def close(self) -> None:
        """Flush and finish."""


class Tracking:
    """What the run folder hands records and traces to: each tool on, fed the same numbers and sample rows. A
    record with no step of its own is logged at the latest step seen."""

    def __init__(self, trackers: list[Tracker], samples: int) -> None:
        self.trackers, self.samples, self.step = trackers, samples, 0

    def log(self, record: dict[str, Any]) -> None:
        """One record of `metrics.jsonl`."""
        step, numbers = scalars(record)
        self.step = self.step if step is None else step
        if numbers:
            for tracker in self.trackers:
                tracker.scalars(self.step, numbers)

    def log_trainer(self, record: dict[str, Any]) -> None:
        """One record of the trainer's `trainer_metrics.jsonl`: its numbers as `trainer/<name>` at its own step
        (which trails the orchestrator's: the trainer is behind by up to `max_async_steps`)."""
        step = record.get("step")
        if not isinstance(step, int):
            return
        numbers = {f"trainer/{k}": float(v) for k, v in record.items()
                   if k not in ("step", "time") and isinstance(v, int | float) and not isinstance(v, bool)}
        if numbers:
            for tracker in self.trackers:
                tracker.trainer_scalars(step, numbers)

    def log_traces(self, step: int, traces: Sequence[Trace]) -> None:
        """A few of the traces of one step, as a sample table."""
        rows = sample_rows(step, traces, self.samples)
        if rows:
            for tracker in self.trackers:
                tracker.table(step, rows)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def scalars(record: dict[str, Any]) -> tuple[int | None, dict[str, float]]:
    """The step a record belongs to (None: it has none of its own) and its numbers, named as the module docstring
    says."""
    fields = {k: v for k, v in record.items() if k != "time"}
    if "eval_step" in fields:
        step, kind, skip = fields["eval_step"], f"eval/{fields.get('env', '')}", {"eval_step", "env"}
    elif "step" in fields:
        step, skip = fields["step"], {"step"}
        kind = next((k for k, v in fields.items() if isinstance(v, str)), "")
    else:  # an event between steps (e.g. an attempt at a batch that came out empty): named by its first field
        step, kind, skip = None, next(iter(fields), ""), set()
    return step, {(k if k == kind else f"{kind}/{k}" if kind else k): float(v) for k, v in fields.items()
                  if k not in skip and isinstance(v, int | float)}


def sample_rows(step: int, traces: Sequence[Trace], n: int) -> list[list[Any]]:
    """Up to `n` traces as table rows (SAMPLE_COLUMNS): the first rollout of each task before any second one."""
    chosen = sorted(traces, key=lambda t: t.rollout_index)[:n]
    return [[step, t.taskset, t.task_key, transcript(t.prompt), transcript(t.completion), t.reward] for t in chosen]


def transcript(messages: Sequence[Message]) -> str:
    """Messages as `role: text` paragraphs (a lone message: its text alone)."""
    if len(messages) == 1:
        return messages[0].text
    return "\n\n".join(f"{m.role}: {m.text}" for m in messages)


class WandbTracker:
    """Logs to a W&B run (started here, finished by `close`)."""

    def __init__(self, config: WandbConfig, run_dir: Path, run_config: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=config.project, entity=config.entity, name=config.name or run_dir.name,
                              group=config.group, tags=config.tags, mode=config.mode, dir=str(run_dir),
                              config=run_config)
        self.run.define_metric(TRAINER_STEP)
        self.run.define_metric("trainer/*", step_metric=TRAINER_STEP)

    def scalars(self, step: int, numbers: dict[str, float]) -> None:
        self.run.log(numbers, step=step)

    def trainer_scalars(self, step: int, numbers: dict[str, float]) -> None:
        """W&B drops a record at a step before one already logged: the trainer's numbers go on their own axis,
        `trainer/step` (`define_metric` at the start), logged at W&B's current step."""
        self.run.log({**numbers, TRAINER_STEP: step})

    def table(self, step: int, rows: list[list[Any]]) -> None:
        self.run.log({"samples": self.wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()  # finish() returns before W&B's service has written the run's files; this waits


class TensorBoardTracker:
    """Writes TensorBoard event files (scalars, and the sample table as text) with tensorboard's own writer."""

    def __init__(self, log_dir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(log_dir))

    def scalars(self, step: int, numbers: dict[str, float]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.write(step, Summary(value=[Summary.Value(tag=name, simple_value=v) for name, v in numbers.items()]))

    def table(self, step: int, rows: list[list[Any]]) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb

        self.write(step, text_pb("samples", markdown_table(rows)))

    def trainer_scalars(self, step: int, numbers: dict[str, float]) -> None:
        self.scalars(step, numbers)  # an event file takes steps in any order

    def write(self, step: int, summary: Any) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
        self.writer.flush()  # a live TensorBoard sees each step as it ends

    def close(self) -> None:
        self.writer.close()


def markdown_table(rows: list[list[Any]]) -> str:
    """Rows under SAMPLE_COLUMNS as a Markdown table (TensorBoard's text plugin renders it)."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = [SAMPLE_COLUMNS, ["---"] * len(SAMPLE_COLUMNS), *rows]
    return "\n".join("| " + " | ".join(map(cell, line)) + " |" for line in lines)


def build_tracking(config: TrackingConfig, run_dir: Path, run_config: dict[str, Any]) -> Tracking | None:
    """The tools `config` turns on, writing under `run_dir` (None: none is on). `run_config` is the resolved
    config W&B records with the run."""
    trackers: list[Tracker] = []
    if config.wandb is not None:
        require_at_start("wandb", "tracking.wandb")
        trackers.append(WandbTracker(config.wandb, run_dir, run_config))
    if config.tensorboard:
        require_at_start("tensorboard", "tracking.tensorboard")
        trackers.append(TensorBoardTracker(run_dir / TENSORBOARD_DIR))
    return Tracking(trackers, config.samples) if trackers else None


def require_at_start(module: str, key: str) -> None:
    """`require` for a process that reads a config validated elsewhere (where the package may be missing)."""
    try:
        require(module, key)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
