"""Rollout errors and multi-turn: failures are classified on the trace, siblings go on, concurrency is bounded."""

import asyncio
import sys
import time

import pytest

import tracegym as tg
from tracegym.envs.rollout import rollout
from tracegym.testing import Fail, ScriptedModel, Stall, reply, tool_call


@tg.reward
def said_yes(task, trace):
    return float(trace.last_reply == "yes")


def taskset(task_class=tg.Task, rows=1):
    class Errors(tg.Taskset):
        id = "errors"

    Errors.task_class = task_class
    return Errors(data=[{"prompt": f"q{i}"} for i in range(rows)], rewards=[said_yes])


def fail_first(n, failure):
    """A rule whose first `n` calls fail with `failure`; it counts its calls in `.calls`."""

    def rule(request):
        rule.calls += 1
        return failure if rule.calls <= n else "yes"

    rule.calls = 0
    return rule


# --- model errors ----------------------------------------------------------------------------------------
async def test_model_error_ends_only_that_rollout_and_siblings_finish():
    model = ScriptedModel(rule=fail_first(1, Fail(400, "bad request")))
    traces = await tg.evaluate(taskset(), model, rollouts=3)
    failed = [t for t in traces if t.stop_reason == tg.StopReason.ERROR]
    assert len(failed) == 1 and failed[0].errors[0].kind == tg.ErrorKind.MODEL
    assert failed[0].errors[0].stage == "model" and "bad request" in failed[0].errors[0].message
    assert [t.reward for t in traces if t is not failed[0]] == [1.0, 1.0]


async def test_model_error_leaves_the_rewards_unscored():
    [trace] = await tg.evaluate(taskset(), ScriptedModel([Fail(400)]))
    assert trace.rewards["said_yes"].score is None and trace.reward is None and not trace.ok


async def test_model_error_is_not_retried():
    rule = fail_first(1, Fail(400))
    await tg.evaluate(taskset(), ScriptedModel(rule=rule), infra_retries=3)
    assert rule.calls == 1


async def test_infrastructure_error_is_retried_infra_retries_times():
    rule = fail_first(100, Fail(503))
    [trace] = await tg.evaluate(taskset(), ScriptedModel(rule=rule), infra_retries=2)
    assert rule.calls == 3
    assert trace.has_error(tg.ErrorKind.INFRASTRUCTURE) and trace.stop_reason == tg.StopReason.ERROR


async def test_infrastructure_error_then_success_gives_a_clean_trace():
    rule = fail_first(1, Fail(503))
    [trace] = await tg.evaluate(taskset(), ScriptedModel(rule=rule), infra_retries=1)
    assert rule.calls == 2 and trace.ok and trace.errors == [] and trace.reward == 1.0


# --- task errors -----------------------------------------------------------------------------------------
class BrokenSetup(tg.Task):
    setups = 0

    async def setup(self):
        BrokenSetup.setups += 1
        raise RuntimeError("no sandbox")


async def test_setup_that_raises_is_a_task_error_and_the_model_is_never_called():
    model = ScriptedModel(["yes"])
    [trace] = await tg.evaluate(taskset(BrokenSetup), model)
    assert trace.stop_reason == tg.StopReason.ERROR and model.requests == []
    assert [(e.kind, e.stage, e.message) for e in trace.errors] == [
        (tg.ErrorKind.TASK, "setup", "RuntimeError: no sandbox")]
    assert trace.rewards["said_yes"].score is None


async def test_task_error_is_not_retried():
    BrokenSetup.setups = 0
    await tg.evaluate(taskset(BrokenSetup), ScriptedModel(["yes"]), infra_retries=3)
    assert BrokenSetup.setups == 1


class BrokenResponse(tg.Task):
    async def env_response(self, trace):
        raise KeyError("board")


async def test_env_response_that_raises_is_a_task_error():
    [trace] = await tg.evaluate(taskset(BrokenResponse), ScriptedModel(["yes"]))
    assert trace.stop_reason == tg.StopReason.ERROR
    assert [(e.kind, e.stage) for e in trace.errors] == [(tg.ErrorKind.TASK, "env_response")]
    assert trace.num_turns == 1


class Cleaned(tg.Task):
    cleaned = 0

    async def setup(self):
        raise RuntimeError("no sandbox")

    async def cleanup(self):
        Cleaned.cleaned += 1


async def test_cleanup_runs_after_an_error():
    Cleaned.cleaned = 0
    await tg.evaluate(taskset(Cleaned), ScriptedModel(["yes"]))
    assert Cleaned.cleaned == 1


class Quit(BaseException):
    """What task code may raise that is not an Exception (like SystemExit, it would pass `except Exception`)."""


def leave(how: str) -> str:
    """Raises SystemExit(3) or Quit.

    Args:
        how: `exit` for SystemExit(3), else Quit.
    """
    if how == "exit":
        sys.exit(3)
    raise Quit("bye")


class Leaves(tg.Task):
    """Row q1's task code raises at `stage` (`how`: `exit` for SystemExit, else Quit); the other rows' work."""

    stage = ""
    how = "exit"
    tools = [leave]

    def maybe_leave(self, stage):
        if self.data.prompt == "q1" and stage == self.stage:
            leave(self.how)

    async def setup(self):
        self.maybe_leave("setup")

    def prompt(self):
        self.maybe_leave("prompt")
        return super().prompt()

    async def env_response(self, trace):
        self.maybe_leave("env_response")
        return "sure?" if trace.num_turns == 1 else None  # a second turn, so stops run

    @tg.reward
    def replied(self, trace):  # sync: runs on a thread of the task-code lane
        self.maybe_leave("reward")
        return float(trace.last_reply == "yes")

    @tg.stop
    async def never(self, trace):
        self.maybe_leave("stop")
        return False


@pytest.mark.parametrize("how", ["exit", "quit"])
@pytest.mark.parametrize(("stage", "recorded", "kind"), [
    ("setup", "setup", tg.ErrorKind.TASK), ("prompt", "setup", tg.ErrorKind.TASK),
    ("env_response", "env_response", tg.ErrorKind.TASK),
    ("stop", "stop:never", tg.ErrorKind.TASK), ("reward", "scoring:replied", tg.ErrorKind.TASK),
    ("tool", "tool:leave", tg.ErrorKind.TOOL)])
async def test_a_base_exception_from_task_code_ends_that_rollout_only(stage, recorded, kind, how):
    calls_tool = lambda r: len(r.messages) == 1 and r.messages[0].text == "q1" and stage == "tool"  # noqa: E731
    model = ScriptedModel(rule=lambda r: reply(None, tool_call("leave", {"how": how})) if calls_tool(r) else "yes")
    task_class = type("Leaves", (Leaves,), {"stage": stage, "how": how})
    ts = type("LeavesSet", (tg.Taskset,), {"id": "leaves", "task_class": task_class})
    traces = await tg.evaluate(ts(data=[{"prompt": f"q{i}"} for i in range(3)]), model)
    [failed] = [t for t in traces if t.task.prompt == "q1"]
    assert [t.reward for t in traces if t is not failed] == [1.0, 1.0]
    assert [(e.stage, e.kind) for e in failed.errors] == [(recorded, kind)]
    assert ("SystemExit: 3" if how == "exit" else "Quit: bye") in failed.errors[0].message


async def test_cancelling_a_rollout_in_task_code_still_cancels_it():
    started = asyncio.Event()

    class Slow(tg.Task):
        async def setup(self):
            started.set()
            await asyncio.Event().wait()

    job = asyncio.create_task(rollout(Slow(tg.TaskData(prompt="q")), ScriptedModel(["yes"])))
    await started.wait()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job


# --- environment responses -------------------------------------------------------------------------------
class AskTwice(tg.Task):
    """Answers the first assistant turn with a follow-up, then ends."""

    async def env_response(self, trace):
        return "are you sure?" if trace.num_turns == 1 else None


async def test_env_response_string_continues_the_conversation_and_none_ends_it():
    model = ScriptedModel(["no", "yes"])
    [trace] = await tg.evaluate(taskset(AskTwice), model)
    assert [(m.role, m.text) for m in trace.messages] == [
        ("user", "q0"), ("assistant", "no"), ("user", "are you sure?"), ("assistant", "yes")]
    assert trace.stop_reason == tg.StopReason.COMPLETED and trace.num_turns == 2 and trace.reward == 1.0


async def test_model_sees_the_env_response_on_the_next_turn():
    model = ScriptedModel(["no", "yes"])
    await tg.evaluate(taskset(AskTwice), model)
    assert model.requests[1].messages[-1] == tg.Message(role="user", content="are you sure?")


async def test_env_response_message_list_is_appended_as_given():
    class Feedback(tg.Task):
        async def env_response(self, trace):
            if trace.num_turns > 1:
                return None
            return [tg.Message(role="user", content="hint"), tg.Message(role="user", content="try again")]

    [trace] = await tg.evaluate(taskset(Feedback), ScriptedModel(["no", "yes"]))
    assert [m.text for m in trace.messages] == ["q0", "no", "hint", "try again", "yes"]


# --- timeouts --------------------------------------------------------------------------------------------
async def test_rollout_timeout_ends_the_rollout_and_frees_its_slot():
    start = time.monotonic()
    [trace] = await tg.evaluate(taskset(), ScriptedModel([Stall(None)]), timeouts=tg.Timeouts(rollout=0.2))
    assert time.monotonic() - start < 30  # the model stalls forever: the deadline ended it
    assert trace.stop_reason == tg.StopReason.TIMEOUT
    assert [(e.kind, e.stage) for e in trace.errors] == [(tg.ErrorKind.TIMEOUT, "rollout")]
    assert trace.rewards["said_yes"].score is None


async def test_rollout_timeout_covers_a_multi_turn_conversation():
    class Endless(tg.Task):
        max_turns = 10**6

        async def env_response(self, trace):
            return "more"

    model = ScriptedModel(rule=lambda request: Stall(0.02, "again"))
    [trace] = await tg.evaluate(taskset(Endless), model, timeouts=tg.Timeouts(rollout=0.3))
    assert trace.stop_reason == tg.StopReason.TIMEOUT and trace.num_turns > 1


async def test_setup_timeout_is_a_timeout_error():
    class Hanging(tg.Task):
        async def setup(self):
            await asyncio.sleep(10)

    [trace] = await tg.evaluate(taskset(Hanging), ScriptedModel(["yes"]), timeouts=tg.Timeouts(setup=0.1))
    assert trace.stop_reason == tg.StopReason.TIMEOUT
    assert [(e.kind, e.stage) for e in trace.errors] == [(tg.ErrorKind.TIMEOUT, "setup")]


# --- bounded concurrency ---------------------------------------------------------------------------------
async def test_evaluate_never_runs_more_than_concurrency_model_calls_at_once():
    model = ScriptedModel(rule=lambda request: Stall(0.01, "yes"))
    traces = await tg.evaluate(taskset(rows=8), model, rollouts=2, concurrency=3)
    assert len(traces) == 16 and all(t.ok for t in traces)
    assert model.most_in_flight == 3


async def test_evaluate_returns_traces_in_task_then_rollout_order():
    traces = await tg.evaluate(taskset(rows=3), ScriptedModel(rule=lambda r: Stall(0.001, "yes")), rollouts=2,
                               concurrency=4)
    assert [(t.task.prompt, t.rollout_index) for t in traces] == [
        ("q0", 0), ("q0", 1), ("q1", 0), ("q1", 1), ("q2", 0), ("q2", 1)]


@pytest.mark.parametrize("how", ["exit", "quit"])
async def test_a_base_exception_while_building_a_task_fails_that_rollout_only(how):
    class Built(tg.Task):
        def __init__(self, data, *args, **kwargs):
            if data.prompt == "q1":
                leave(how)
            super().__init__(data, *args, **kwargs)

        @tg.reward
        def replied(self, trace):
            return float(trace.last_reply == "yes")

    ts = type("BuiltSet", (tg.Taskset,), {"id": "built", "task_class": Built})
    traces = await tg.evaluate(ts(data=[{"prompt": f"q{i}"} for i in range(3)]), ScriptedModel(rule=lambda r: "yes"))
    [failed] = [t for t in traces if t.task.prompt == "q1"]
    assert [t.reward for t in traces if t is not failed] == [1.0, 1.0]
    assert [(e.stage, e.kind) for e in failed.errors] == [("setup", tg.ErrorKind.TASK)]
