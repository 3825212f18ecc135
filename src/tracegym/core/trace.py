"""Trace: the record of one rollout (task, message graph, rewards, metrics, errors, judgments, timing, usage, stop)."""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, SerializeAsAny, field_validator

from tracegym.core.errors import ErrorKind, FailureKind, StageTimeout, TraceError
from tracegym.core.graph import MessageGraph
from tracegym.core.judgment import Judgment
from tracegym.core.messages import Message, ToolCall
from tracegym.core.record import Record
from tracegym.core.task_data import TaskData
from tracegym.core.timing import Span
from tracegym.core.tool_spec import ToolSpec

SCHEMA_VERSION = 1
REPLIES_CUT = "replies_cut"
"""The metric counting replies cut at `max_tokens` that did not end the rollout (an episode member's move)."""


class StopReason(StrEnum):
    """Why a rollout ended."""

    COMPLETED = "completed"
    """The model answered with no tool call and the task had no response."""
    STOP_CONDITION = "stop_condition"
    """A stop function returned true (its name is in `stopped_by`)."""
    MAX_TURNS = "max_turns"
    TRUNCATED = "truncated"
    """The context window or the completion budget ran out."""
    TIMEOUT = "timeout"
    ERROR = "error"
    CANCELLED = "cancelled"

    @property
    def is_normal_end(self) -> bool:
        """True for the ends a rollout reaches on its own terms: the model's output (completed, truncated), a stop
        function, or the turn budget. An error, a timeout or a cancel cut it short. The one list of them:
        everything else asks `Trace.ended_normally`, `Trace.ok` or `Trace.failure`."""
        return self in (StopReason.COMPLETED, StopReason.STOP_CONDITION, StopReason.MAX_TURNS, StopReason.TRUNCATED)

    @classmethod
    def after(cls, failure: BaseException | TraceError) -> StopReason:
        """How a rollout that `failure` ended stops: `timeout` for a stage past its timeout, else `error`."""
        timed_out = failure.kind == ErrorKind.TIMEOUT if isinstance(failure, TraceError) else isinstance(
            failure, StageTimeout)
        return cls.TIMEOUT if timed_out else cls.ERROR


class Cut(StrEnum):
    """How a rollout went wrong on the model's side without failing (`Trace.cut`): three different things, each
    with its own reward or mask (`core.cut_policy.CutPolicy`)."""

    OVERLONG = "overlong"
    """The prompt (the conversation so far) no longer fit the model's context: a context-length error ended it."""
    LENGTH = "length"
    """A reply ran into the completion budget (`max_tokens`) and was cut there: a rollout ends on it; an episode
    member's cut reply is still its move, and the episode goes on (`REPLIES_CUT` counts it)."""
    UNPARSABLE = "unparsable"
    """A reply could not be parsed into what it meant to be: a tool call whose JSON is not an object with a name
    (the model was told so and went on), or a member's move whose markup did not parse (`Node.parse_error`)."""


class RewardScore(Record):
    """One reward's score (None = failed or never ran) and its weight in the total."""

    model_config = ConfigDict(frozen=True)
    score: float | None
    weight: float = 1.0


class Usage(Record):
    """Tokens the endpoint reported, summed over the rollout's model calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


def _new_id() -> str:
    return uuid.uuid4().hex


class Trace(Record):
    """One rollout's full record. Derived values are properties, never stored twice."""

    model_config = ConfigDict(validate_assignment=False)

    schema_version: int = SCHEMA_VERSION
    id: str = Field(default_factory=_new_id)
    taskset: str = ""
    task: SerializeAsAny[TaskData]
    """The task row; a TaskData subclass's own fields are written too (they read back as extras)."""
    task_key: str = ""
    rollout_index: int = 0
    model: str = ""
    sampling: dict[str, Any] = Field(default_factory=dict)
    graph: MessageGraph = Field(default_factory=MessageGraph)
    prompt_length: int = 0
    """How many of the graph's first nodes are the prompt (the rest is the completion)."""
    tools: list[ToolSpec] = Field(default_factory=list)
    """The tools offered on the rollout's last model call (what its prompts were rendered with)."""
    rewards: dict[str, RewardScore] = Field(default_factory=dict)
    metrics: dict[str, float | None] = Field(default_factory=dict)
    errors: list[TraceError] = Field(default_factory=list)
    judgments: list[Judgment] = Field(default_factory=list)
    """The judge calls its judge rewards made (`envs.judge`), in the order they were made."""
    spans: list[Span] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    stop_reason: StopReason | None = None
    stopped_by: str | None = None
    started_at: float = Field(default_factory=time.time)
    member: str | None = None
    """The member (seat) id whose trace this is, in a multi-agent episode; None for a single-agent rollout."""
    episode_id: str | None = None
    """The episode this member trace belongs to (`core.episode.Episode.id`)."""

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(f"trace schema version {value} is newer than this tracegym reads ({SCHEMA_VERSION})")
        return value

    def model_post_init(self, _context: Any) -> None:
        if not self.task_key:
            self.task_key = self.task.key

    @property
    def reward(self) -> float | None:
        """Weighted sum of the rewards; None when any reward is missing or there are none."""
        if not self.rewards or any(r.score is None for r in self.rewards.values()):
            return None
        return sum(r.score * r.weight for r in self.rewards.values() if r.score is not None)

    @property
    def messages(self) -> list[Message]:
        """The conversation on the current branch."""
        return self.graph.messages()

    @property
    def prompt(self) -> list[Message]:
        """The messages the rollout started from."""
        return self.messages[: self.prompt_length]

    @property
    def completion(self) -> list[Message]:
        """Everything after the prompt on the current branch."""
        return self.messages[self.prompt_length :]

    @property
    def last_reply(self) -> str:
        """Text of the last assistant message ('' when the model never answered)."""
        for message in reversed(self.messages):
            if message.role == "assistant":
                return message.text
        return ""

    @property
    def branches(self) -> list[list[int]]:
        """Every root-to-leaf path of the message graph, as node ids."""
        return self.graph.branches()

    @property
    def policy_version(self) -> int | None:
        """The oldest policy version that sampled any of this rollout's turns (None when none was reported)."""
        return self.graph.oldest_version()

    @property
    def num_turns(self) -> int:
        """Model turns on the current branch (a fork's copies of earlier turns included)."""
        return sum(1 for n in self.graph.path() if self.graph.is_model_turn(n))

    @property
    def completion_length(self) -> int:
        """Sampled tokens over all model calls (from the endpoint's usage)."""
        return self.usage.completion_tokens

    @property
    def is_truncated(self) -> bool:
        """True when the rollout ran out of context or completion budget."""
        return self.stop_reason == StopReason.TRUNCATED

    @property
    def cut(self) -> Cut | None:
        """How the rollout was cut short or misread (`Cut`), the first that applies of: the prompt no longer fit
        (overlong), a reply ran into `max_tokens` (length), a reply did not parse (unparsable); None when none
        did. The way a rollout ended comes before a turn along the way."""
        if self.is_truncated:
            overflowed = any(e.failure == FailureKind.CONTEXT_OVERFLOW for e in self.errors)
            return Cut.OVERLONG if overflowed else Cut.LENGTH
        if self.metrics.get(REPLIES_CUT):  # a member's reply cut short was still its move: the episode went on
            return Cut.LENGTH
        return Cut.UNPARSABLE if self.unparsable_turns else None

    @property
    def unparsable_turns(self) -> int:
        """Model turns on the current branch whose reply did not parse (`Cut.UNPARSABLE`)."""
        return sum(1 for n in self.graph.path() if self.graph.is_model_turn(n) and (
            n.parse_error or any(not _parses(call) for call in n.message.tool_calls or [])))

    @property
    def ended_normally(self) -> bool:
        """True when the rollout reached a normal end (`StopReason.is_normal_end`); False when an error, a
        timeout or a cancel ended it, or no end is recorded. A resume reruns the others; rescoring and the
        rollout itself leave them unscored."""
        return self.stop_reason is not None and self.stop_reason.is_normal_end

    @property
    def ok(self) -> bool:
        """True when the rollout ended normally and every reward scored (the eval's notion of a good rollout).
        Tool errors the model recovered from do not count against it."""
        return self.ended_normally and all(r.score is not None for r in self.rewards.values())

    @property
    def failure(self) -> FailureKind | None:
        """What went wrong (`FailureKind`), or None when the rollout ended normally on the model's own output with
        every reward scored (training's notion). Training leaves a failed rollout out of its group's advantage
        statistics and out of the batch, and counts it by this kind (`failed/<kind>`). `failure_record` says
        where and how."""
        record = self.failure_record
        return record.failure if record is not None else None

    @property
    def failure_record(self) -> TraceError | None:
        """The error that made this rollout a failure, or None when it is none: no end recorded (`unfinished`),
        a cancel, the error that ended it, the one that left a reward unscored, or one it recovered from that
        makes its score measure our infrastructure rather than the model (any timeout, an infrastructure error)."""
        if self.stop_reason is None:
            return _noted(FailureKind.UNFINISHED, "no end is recorded")
        if self.stop_reason == StopReason.CANCELLED:
            return _noted(FailureKind.CANCELLED, "the rollout was cancelled")
        ending = [e for e in self.errors if e.kind != ErrorKind.TOOL and e.stage != "cleanup"]
        if not self.ended_normally:
            timed_out = self.stop_reason == StopReason.TIMEOUT
            unrecorded = FailureKind.ROLLOUT_TIMEOUT if timed_out else FailureKind.TASK_ERROR
            return ending[-1] if ending else _noted(unrecorded, f"ended on {self.stop_reason.value}, no error recorded")
        if not self.ok:
            return ending[-1] if ending else _noted(FailureKind.SCORING_ERROR, "a reward has no score")
        return next((e for e in self.errors if e.kind in (ErrorKind.TIMEOUT, ErrorKind.INFRASTRUCTURE)), None)

    def has_error(self, kind: ErrorKind) -> bool:
        """True when an error of this kind is recorded."""
        return any(e.kind == kind for e in self.errors)

    def duration(self, stage: str = "total") -> float:
        """Seconds spent in a stage, summed over its spans (`total`: the whole rollout)."""
        return sum(s.duration for s in self.spans if s.name == stage or s.name.startswith(stage + ":"))


def _parses(call: ToolCall) -> bool:
    """True when a tool call names a tool and its arguments are a JSON object."""
    try:
        call.parsed_arguments()
    except ValueError:
        return False
    return bool(call.name)


def _noted(failure: FailureKind, message: str) -> TraceError:
    """The record of a failure that no error carries (an unfinished or cancelled rollout)."""
    return TraceError(kind=failure.fault, stage="rollout", message=message, failure=failure)
