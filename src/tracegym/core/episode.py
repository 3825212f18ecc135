"""Episode: the record of one run of a task: one Trace per member plus what belongs to the episode as a whole.

A single-agent rollout is an episode of one member (`Episode.solo`, member id `SOLO`): every path that stores,
reads or trains on runs handles this one shape. Each member's trace is an ordinary Trace (its own message graph
and exact tokens, `member` and `episode_id` set), so everything that reads traces (training samples, rescoring, the
run folder) reads a member's trace unchanged.
The episode adds what no single trace owns: the members in seat order, which of them train, each one's reward
and outcome, episode-wide metrics, and the error that ended the episode, if one did.
"""

from __future__ import annotations

import time
import uuid
from enum import StrEnum

from pydantic import Field, SerializeAsAny, field_validator, model_validator

from tracegym.core.errors import TraceError
from tracegym.core.record import Record
from tracegym.core.task_data import TaskData
from tracegym.core.trace import SCHEMA_VERSION, StopReason, Trace

SOLO = "agent"
"""The member id of a single-agent rollout's episode. Its trace keeps `member` and `episode_id` None, as the rollout
made it (`member_id` and `episode_of` read either shape)."""


def member_id(trace: Trace) -> str:
    """The member a trace is of in its episode: its `member`, or `SOLO` for a single-agent rollout's."""
    return trace.member if trace.member is not None else SOLO


def episode_of(trace: Trace) -> str:
    """The id of the episode a trace is of: its `episode_id`, or for a single-agent rollout its own id."""
    return trace.episode_id if trace.episode_id is not None else trace.id


class Outcome(StrEnum):
    """How a game ended for one member (None on the episode when the taskset is not a game)."""

    WIN = "win"
    LOSS = "loss"
    DRAW = "draw"
    FORFEIT = "forfeit"
    """Lost by breaking the rules (e.g. too many invalid moves)."""


class Episode(Record):
    """One episode's full record. `traces[m]` is member m's trace; rewards and metrics per member live on the
    episode (the member's own trace carries the same reward, so single-agent readers still see it)."""

    schema_version: int = SCHEMA_VERSION
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    taskset: str = ""
    task: SerializeAsAny[TaskData]
    task_key: str = ""
    episode_index: int = 0
    """Which episode of its task this is (the multi-agent counterpart of a rollout index)."""
    members: list[str]
    """Member ids in seat order."""
    trainable: dict[str, bool] = Field(default_factory=dict)
    """Which members' traces may be trained on (a pinned opponent or a judge is not, by default)."""
    models: dict[str, str] = Field(default_factory=dict)
    """The model name each member was bound to in this episode."""
    traces: dict[str, Trace] = Field(default_factory=dict)
    rewards: dict[str, float | None] = Field(default_factory=dict)
    """Each member's reward (None: it could not be decided, e.g. the judge's verdict did not parse)."""
    outcomes: dict[str, Outcome] = Field(default_factory=dict)
    metrics: dict[str, float | None] = Field(default_factory=dict)
    """Episode-wide metrics (turns, parse errors, forfeits, ...)."""
    member_metrics: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    error: TraceError | None = None
    """The error that ended the episode (a failed slot, an unparseable verdict, a member's endpoint down)."""
    stop_reason: StopReason | None = None
    started_at: float = Field(default_factory=time.time)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(f"episode schema version {value} is newer than this tracegym reads ({SCHEMA_VERSION})")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Episode:
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"episode members must be unique, got {self.members}")
        unknown = (set(self.traces) | set(self.rewards) | set(self.trainable)) - set(self.members)
        if unknown:
            raise ValueError(f"episode names members it does not have: {sorted(unknown)} (members: {self.members})")
        if not self.task_key:
            self.task_key = self.task.key
        return self

    @classmethod
    def solo(cls, trace: Trace) -> Episode:
        """A single-agent rollout as the episode of one trainable member, `SOLO`. The episode's id is the trace's
        own (`episode_of`), so the trace is left as the rollout made it; its rollout index is the episode index."""
        return cls(id=trace.id, taskset=trace.taskset, task=trace.task, task_key=trace.task_key,
                   episode_index=trace.rollout_index, members=[SOLO], trainable={SOLO: True},
                   models={SOLO: trace.model} if trace.model else {}, traces={SOLO: trace},
                   rewards={SOLO: trace.reward}, member_metrics={SOLO: dict(trace.metrics)},
                   error=None if trace.ended_normally else trace.failure_record, stop_reason=trace.stop_reason,
                   started_at=trace.started_at)

    @property
    def is_solo(self) -> bool:
        """True for a single-agent rollout's episode (one member, `SOLO`)."""
        return self.members == [SOLO]

    @property
    def ended_normally(self) -> bool:
        """True when the episode reached a normal end (`StopReason.is_normal_end`) with no episode error."""
        return self.error is None and self.stop_reason is not None and self.stop_reason.is_normal_end

    @property
    def ok(self) -> bool:
        """True when the episode ended normally and every member's reward was decided."""
        return self.ended_normally and all(self.rewards.get(m) is not None for m in self.members)

    @property
    def trainable_members(self) -> list[str]:
        """Members whose traces training may use, in seat order."""
        return [m for m in self.members if self.trainable.get(m, False)]
