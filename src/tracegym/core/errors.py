"""Errors: the classified exceptions of a rollout, the closed list of failure kinds, and the record each error
leaves on a trace.

Two words classify an error. Its `ErrorKind` says who is at fault and decides whether a retry can help. Its
`FailureKind` says what went wrong, from a closed, low-cardinality list that summaries and training logs count
(`failed/<kind>`). `classify` is the one function that turns an exception into a trace's error record; an error
recorded without one (older traces, a record made by hand) gets its failure kind from its `ErrorKind` and stage
(`failure_of`), so every record carries exactly one.

    TracegymError (kind: failure kind, by stage where the error has none of its own)
    +-- ModelError                model: model_error
    |   +-- ContextLengthError    model: context_overflow
    +-- ToolError                 tool: tool_error
    +-- TaskError                 task: task_error, scoring_error at `scoring:*`
    |   +-- TaskExit              task: task_error
    |   +-- ImageRefused          task: image_refused
    +-- StageTimeout              timeout: model_timeout, tool_timeout, scoring_timeout, rollout_timeout at
    |                             `rollout` or `episode`, task_timeout elsewhere
    +-- InfrastructureError       infrastructure: model_unavailable at `model`, env_server_error at `env_server`,
    |                             env_unavailable elsewhere
    +-- JudgeError                judge: judge_error
    any other exception           model at `model` (model_error), tool at `tool:*` (tool_error), else task
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from tracegym.core.record import Record


class ErrorKind(StrEnum):
    """Who is at fault; decides whether a retry can help (only `infrastructure` is retried)."""

    MODEL = "model"
    TOOL = "tool"
    TASK = "task"
    TIMEOUT = "timeout"
    INFRASTRUCTURE = "infrastructure"
    JUDGE = "judge"
    """A judge reward's model call failed or its verdict could not be read (`envs.judge`): the rollout is
    unscored, not retried (its own model calls went well)."""


class FailureKind(StrEnum):
    """What went wrong, from a closed list: one per failed trace (`Trace.failure`), counted in summaries and
    training logs. A trace with a failure is left out of training and of its group's advantage statistics."""

    MODEL_TIMEOUT = "model_timeout"
    """A model call ran past its timeout."""
    MODEL_UNAVAILABLE = "model_unavailable"
    """The model endpoint could not be reached or answered with a server error."""
    MODEL_ERROR = "model_error"
    """The model endpoint answered, but not usefully (a refused request, an unparseable reply)."""
    CONTEXT_OVERFLOW = "context_overflow"
    """The prompt no longer fit the model's context (the rollout itself ends as truncated, and trains)."""
    TOOL_ERROR = "tool_error"
    """A tool raised (the model is told and goes on; the rollout trains)."""
    TOOL_TIMEOUT = "tool_timeout"
    """A tool ran past its timeout (even one the model recovered from: its score then measures our infrastructure)."""
    TASK_ERROR = "task_error"
    """The task's own code (setup, environment response, stop, an episode's hooks, an agent program) failed."""
    TASK_TIMEOUT = "task_timeout"
    """The task's own code ran past its timeout."""
    SCORING_ERROR = "scoring_error"
    """A reward or metric raised or returned no number: the rollout is unscored."""
    SCORING_TIMEOUT = "scoring_timeout"
    """A reward or metric ran past its timeout."""
    IMAGE_REFUSED = "image_refused"
    """An image the model could not be given, refused before the model call: the model takes text only, or the
    image is unreadable, oversized or of a format its processor does not take (`models.image_support`)."""
    JUDGE_ERROR = "judge_error"
    """A judge could not give a verdict: a judge reward's model call failed or its reply did not parse
    (`envs.judge`), or a multi-agent episode's referee gave none that could be read."""
    ROLLOUT_TIMEOUT = "rollout_timeout"
    """The whole rollout (or episode) ran past its timeout."""
    SANDBOX_ERROR = "sandbox_error"
    """The runtime that runs task code or an agent program could not start or failed."""
    ENV_UNAVAILABLE = "env_unavailable"
    """A service the environment needs (an OpenEnv server, say) could not be reached or refused the session."""
    WORKER_DIED = "worker_died"
    """The env server's worker running the rollout died (the rollout was re-run until it killed a worker alone)."""
    ENV_SERVER_ERROR = "env_server_error"
    """The request to the env server failed (server gone, refused, timed out)."""
    CANCELLED = "cancelled"
    """The rollout was cancelled (the run was stopped)."""
    UNFINISHED = "unfinished"
    """No end is recorded (a writer killed mid-rollout)."""

    @property
    def fault(self) -> ErrorKind:
        """Who is at fault for a failure of this kind (decides whether a retry can help)."""
        return _FAULT.get(self, ErrorKind.TASK)


_FAULT = {
    FailureKind.MODEL_TIMEOUT: ErrorKind.TIMEOUT, FailureKind.TOOL_TIMEOUT: ErrorKind.TIMEOUT,
    FailureKind.TASK_TIMEOUT: ErrorKind.TIMEOUT, FailureKind.SCORING_TIMEOUT: ErrorKind.TIMEOUT,
    FailureKind.ROLLOUT_TIMEOUT: ErrorKind.TIMEOUT, FailureKind.MODEL_UNAVAILABLE: ErrorKind.INFRASTRUCTURE,
    FailureKind.SANDBOX_ERROR: ErrorKind.INFRASTRUCTURE, FailureKind.ENV_UNAVAILABLE: ErrorKind.INFRASTRUCTURE,
    FailureKind.WORKER_DIED: ErrorKind.INFRASTRUCTURE, FailureKind.ENV_SERVER_ERROR: ErrorKind.INFRASTRUCTURE,
    FailureKind.MODEL_ERROR: ErrorKind.MODEL, FailureKind.CONTEXT_OVERFLOW: ErrorKind.MODEL,
    FailureKind.TOOL_ERROR: ErrorKind.TOOL, FailureKind.JUDGE_ERROR: ErrorKind.JUDGE,
}

_TIMEOUT_BY_STAGE = {"model": FailureKind.MODEL_TIMEOUT, "tool": FailureKind.TOOL_TIMEOUT,
                     "scoring": FailureKind.SCORING_TIMEOUT, "rescore": FailureKind.SCORING_TIMEOUT,
                     "rollout": FailureKind.ROLLOUT_TIMEOUT, "episode": FailureKind.ROLLOUT_TIMEOUT,
                     "env_server": FailureKind.ENV_SERVER_ERROR}
_STAGES = {"setup", "model", "tool", "env_response", "stop", "scoring", "rescore", "rollout", "episode", "cleanup",
           "program", "env_server", "slot"}
"""The stages a rollout records errors at (`tool:NAME`, `scoring:NAME`, `stop:NAME`; an episode's member errors
are prefixed with the member, `player_0:model`)."""


def stage_head(stage: str) -> str:
    """The stage an error happened in, without its detail or member: `player_0:tool:move` -> `tool`."""
    parts = stage.split(":")
    return next((p for p in parts if p in _STAGES), parts[-1] if len(parts) > 1 else stage)


def failure_of(kind: ErrorKind, stage: str) -> FailureKind:
    """The failure kind of an error of `kind` at `stage`, for an exception that names none of its own (and for
    records written before failure kinds existed)."""
    head = stage_head(stage)
    if kind == ErrorKind.TIMEOUT:
        return _TIMEOUT_BY_STAGE.get(head, FailureKind.TASK_TIMEOUT)
    if kind == ErrorKind.INFRASTRUCTURE:
        return {"model": FailureKind.MODEL_UNAVAILABLE, "env_server": FailureKind.ENV_SERVER_ERROR}.get(
            head, FailureKind.ENV_UNAVAILABLE)
    if kind == ErrorKind.MODEL:
        return FailureKind.MODEL_ERROR
    if kind == ErrorKind.TOOL:
        return FailureKind.TOOL_ERROR
    if kind == ErrorKind.JUDGE:
        return FailureKind.JUDGE_ERROR
    return FailureKind.SCORING_ERROR if head in ("scoring", "rescore") else FailureKind.TASK_ERROR


class TraceError(Record):
    """One error recorded on a trace: who is at fault (`kind`), what went wrong (`failure`), the stage it happened
    in, what was said, and the chain of exceptions that caused it (`cause`, outermost first)."""

    model_config = ConfigDict(frozen=True)
    kind: ErrorKind
    stage: str
    message: str
    turn: int | None = None
    failure: FailureKind = FailureKind.TASK_ERROR
    """Decided by `classify`; from `kind` and `stage` (`failure_of`) when not given."""
    cause: list[str] = Field(default_factory=list)
    """`Type: message` of each exception behind this one (`__cause__`, else `__context__`), outermost first."""

    @model_validator(mode="before")
    @classmethod
    def _failure_from_kind(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("failure") is None and "kind" in data and "stage" in data:
            return {**data, "failure": failure_of(ErrorKind(data["kind"]), str(data["stage"]))}
        return data


class TracegymError(Exception):
    """Base of every error tracegym raises on purpose; `kind` classifies it, and `failure` when the error is of a
    failure kind of its own (None: decided by its kind and the stage it happened at)."""

    kind: ErrorKind = ErrorKind.TASK
    failure: FailureKind | None = None


class ModelError(TracegymError):
    """The model endpoint answered, but not usefully (4xx, unparseable reply, context overflow)."""

    kind = ErrorKind.MODEL


class ContextLengthError(ModelError):
    """The prompt no longer fits the model's context window; the rollout ends as truncated."""

    failure = FailureKind.CONTEXT_OVERFLOW


class ToolError(TracegymError):
    """A tool failed; the model is told, and the rollout goes on."""

    kind = ErrorKind.TOOL


class TaskError(TracegymError):
    """The task's own code (setup, environment response, reward) failed."""

    kind = ErrorKind.TASK


class ImageRefused(TaskError):
    """A message's image that the model cannot be given (see FailureKind.IMAGE_REFUSED); never retried."""

    failure = FailureKind.IMAGE_REFUSED


class TaskExit(TaskError):
    """Task code raised a BaseException that is not an Exception (`SystemExit`, a custom subclass): carried as an
    ordinary task error, so it ends that rollout (or, from a tool, that call) and never the process."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(f"{type(raised).__name__}: {raised}")


class StageTimeout(TracegymError):
    """A stage ran past its timeout."""

    kind = ErrorKind.TIMEOUT


class InfrastructureError(TracegymError):
    """Something outside the task broke (endpoint down, worker died); may be retried a bounded number of times."""

    kind = ErrorKind.INFRASTRUCTURE


class JudgeError(TracegymError):
    """A judge reward could not give a verdict: its model call failed, or its reply (`reply`, when it gave one) did
    not parse."""

    kind = ErrorKind.JUDGE
    failure = FailureKind.JUDGE_ERROR

    def __init__(self, message: str, reply: str | None = None) -> None:
        super().__init__(message)
        self.reply = reply


class UsageError(TracegymError):
    """The user asked for something that cannot be done (unknown taskset, bad field); the message says what."""


CAUSE_DEPTH = 5
"""Exceptions of a cause chain kept on a record (the rest are dropped: the outermost say the most)."""


def message_of(exc: BaseException) -> str:
    """What a record says of `exc`: a tracegym error's own message, else its type and message."""
    return str(exc) if isinstance(exc, TracegymError) else f"{type(exc).__name__}: {exc}"


def cause_chain(exc: BaseException) -> list[str]:
    """`Type: message` of each exception behind `exc`, outermost first, at most `CAUSE_DEPTH`."""
    chain: list[str] = []
    seen = {id(exc)}
    below = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    while below is not None and id(below) not in seen and len(chain) < CAUSE_DEPTH:
        seen.add(id(below))
        chain.append(f"{type(below).__name__}: {below}")
        below = below.__cause__ or (None if below.__suppress_context__ else below.__context__)
    return chain


def classify(exc: BaseException, stage: str, turn: int | None = None, *,
             kind: ErrorKind | None = None) -> TraceError:
    """The one mapping of an exception to a trace's error record: a tracegym error's own kind (and failure kind,
    when it has one); another exception is a model error at the `model` stage, a tool error at a tool's and a task
    error elsewhere, unless `kind` says whose it is (e.g. infrastructure for whatever ended an env-server
    request)."""
    if isinstance(exc, TracegymError):
        kind = exc.kind
    elif kind is None:
        kind = {"model": ErrorKind.MODEL, "tool": ErrorKind.TOOL}.get(stage_head(stage), ErrorKind.TASK)
    failure = exc.failure if isinstance(exc, TracegymError) and exc.failure else failure_of(kind, stage)
    return TraceError(kind=kind, stage=stage, message=message_of(exc), turn=turn, failure=failure,
                      cause=cause_chain(exc))
