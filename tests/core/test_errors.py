"""Errors: one mapping of exceptions to error records, a failure kind on every record, the cause chain kept."""

import pytest

from tracegym.core.errors import (
    ContextLengthError,
    ErrorKind,
    FailureKind,
    InfrastructureError,
    ModelError,
    StageTimeout,
    TaskError,
    TraceError,
    classify,
    failure_of,
    stage_head,
)
from tracegym.core.trace import StopReason


@pytest.mark.parametrize(("exc", "stage", "kind", "failure"), [
    (StageTimeout("late"), "model", ErrorKind.TIMEOUT, FailureKind.MODEL_TIMEOUT),
    (StageTimeout("late"), "tool:search", ErrorKind.TIMEOUT, FailureKind.TOOL_TIMEOUT),
    (StageTimeout("late"), "scoring:lcs", ErrorKind.TIMEOUT, FailureKind.SCORING_TIMEOUT),
    (StageTimeout("late"), "env_response", ErrorKind.TIMEOUT, FailureKind.TASK_TIMEOUT),
    (InfrastructureError("refused"), "model", ErrorKind.INFRASTRUCTURE, FailureKind.MODEL_UNAVAILABLE),
    (InfrastructureError("refused"), "env_server", ErrorKind.INFRASTRUCTURE, FailureKind.ENV_SERVER_ERROR),
    (ModelError("400"), "model", ErrorKind.MODEL, FailureKind.MODEL_ERROR),
    (ContextLengthError("too long"), "model", ErrorKind.MODEL, FailureKind.CONTEXT_OVERFLOW),
    (ValueError("bad json"), "model", ErrorKind.MODEL, FailureKind.MODEL_ERROR),
    (KeyError("x"), "setup", ErrorKind.TASK, FailureKind.TASK_ERROR),
    (KeyError("x"), "tool:add", ErrorKind.TOOL, FailureKind.TOOL_ERROR),
    (TaskError("no number"), "scoring:lcs", ErrorKind.TASK, FailureKind.SCORING_ERROR),
    (RuntimeError("boom"), "player_1:env_response", ErrorKind.TASK, FailureKind.TASK_ERROR),
])
def test_classify_gives_each_exception_its_kind_and_failure(exc, stage, kind, failure):
    error = classify(exc, stage)
    assert (error.kind, error.failure, error.stage) == (kind, failure, stage)


def test_a_plain_exception_is_recorded_with_its_type_and_a_tracegym_one_with_its_message():
    assert classify(KeyError("x"), "setup").message == "KeyError: 'x'"
    assert classify(TaskError("the board is full"), "setup").message == "the board is full"


def test_the_kind_given_applies_to_exceptions_that_are_not_tracegyms_own():
    assert classify(OSError("gone"), "env_server", kind=ErrorKind.INFRASTRUCTURE).failure == \
        FailureKind.ENV_SERVER_ERROR
    assert classify(TaskError("bad row"), "env_server", kind=ErrorKind.INFRASTRUCTURE).kind == ErrorKind.TASK


def test_the_cause_chain_is_kept_outermost_first():
    try:
        try:
            try:
                raise ConnectionRefusedError("port 8000")
            except OSError as exc:
                raise OSError("connect failed") from exc
        except OSError as exc:
            raise InfrastructureError("endpoint down") from exc
    except InfrastructureError as exc:
        error = classify(exc, "model")
    assert error.cause == ["OSError: connect failed", "ConnectionRefusedError: port 8000"]


def test_a_record_without_a_failure_kind_gets_one_from_its_kind_and_stage():
    """Traces written before failure kinds existed read back with one."""
    old = TraceError.model_validate({"kind": "timeout", "stage": "tool:add", "message": "timed out"})
    assert old.failure == FailureKind.TOOL_TIMEOUT and old.cause == []


def test_a_record_round_trips_with_its_failure_and_cause():
    error = classify(StageTimeout("late"), "model", turn=2)
    assert TraceError.model_validate_json(error.model_dump_json()) == error


def test_the_stage_head_drops_a_member_and_a_detail():
    assert [stage_head(s) for s in ("player_0:tool:move", "scoring:lcs", "setup", "judge:model")] == [
        "tool", "scoring", "setup", "model"]


def test_every_failure_kind_names_who_is_at_fault():
    assert {k.fault for k in FailureKind} <= set(ErrorKind)
    assert failure_of(ErrorKind.TOOL, "tool:x").fault == ErrorKind.TOOL


def test_a_stage_timeout_stops_a_rollout_as_timeout_and_anything_else_as_error():
    assert StopReason.after(StageTimeout("late")) == StopReason.TIMEOUT
    assert StopReason.after(ValueError("x")) == StopReason.ERROR
    assert StopReason.after(classify(StageTimeout("late"), "setup")) == StopReason.TIMEOUT
