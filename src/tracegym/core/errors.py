"""Errors: the classified exceptions of a rollout and the record each leaves on a trace."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class ErrorKind(StrEnum):
    """Who is at fault; decides whether a retry can help (only `infrastructure` is retried)."""

    MODEL = "model"
    TOOL = "tool"
    TASK = "task"
    TIMEOUT = "timeout"
    INFRASTRUCTURE = "infrastructure"


class TraceError(BaseModel):
    """One error recorded on a trace: its kind, the stage it happened in, and what was said."""

    model_config = ConfigDict(frozen=True)
    kind: ErrorKind
    stage: str
    message: str
    turn: int | None = None


class TracegymError(Exception):
    """Base of every error tracegym raises on purpose; `kind` classifies it."""

    kind: ErrorKind = ErrorKind.TASK


class ModelError(TracegymError):
    """The model endpoint answered, but not usefully (4xx, unparseable reply, context overflow)."""

    kind = ErrorKind.MODEL


class ContextLengthError(ModelError):
    """The prompt no longer fits the model's context window; the rollout ends as truncated."""


class ToolError(TracegymError):
    """A tool failed; the model is told, and the rollout goes on."""

    kind = ErrorKind.TOOL


class TaskError(TracegymError):
    """The task's own code (setup, environment response, reward) failed."""

    kind = ErrorKind.TASK


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


class UsageError(TracegymError):
    """The user asked for something that cannot be done (unknown taskset, bad field); the message says what."""
