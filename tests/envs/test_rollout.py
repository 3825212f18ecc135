"""The rollout loop: semantics pinned on scripted rollouts."""

import asyncio

import tracegym as tg
from tracegym.testing import ScriptedModel, Stall, reply, tool_call


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def hang(x: int) -> int:
    """Never returns in time.

    Args:
        x: Ignored.
    """
    import time

    time.sleep(2)
    return x


@tg.reward
def correct(task, trace):
    return float(trace.last_reply.strip() == str(task.data.answer))


def _taskset(**kw):
    return tg.Taskset(id="t", data=[{"prompt": "1+2?", "answer": 3}], rewards=[correct], tools=[add, hang], **kw)


async def test_scripted_tool_rollout_produces_the_pinned_trace():
    model = ScriptedModel([reply(None, tool_call("add", {"a": 1, "b": 2}, id="c1")), "3"], tokens=True)
    [trace] = await tg.evaluate(_taskset(), model)
    assert [(m.role, m.text) for m in trace.messages] == [
        ("user", "1+2?"), ("assistant", ""), ("tool", "3"), ("assistant", "3")]
    assert trace.messages[2].tool_call_id == "c1"
    assert trace.stop_reason == tg.StopReason.COMPLETED
    assert trace.reward == 1.0 and trace.metrics == {"tool_calls": 1}
    assert trace.num_turns == 2 and trace.errors == []


async def test_malformed_tool_arguments_become_a_tool_error_message():
    model = ScriptedModel([reply(None, tool_call("add", "{not json")), "3"])
    [trace] = await tg.evaluate(_taskset(), model)
    assert trace.messages[2].text.startswith("Error: ValueError")
    assert trace.metrics["tool_errors"] == 1 and trace.errors[0].kind == tg.ErrorKind.TOOL
    assert trace.ok


async def test_hanging_tool_is_cut_at_its_timeout():
    model = ScriptedModel([reply(None, tool_call("hang", {"x": 1})), "3"])
    [trace] = await tg.evaluate(_taskset(), model, timeouts=tg.Timeouts(tool=0.1))
    assert "timed out" in trace.messages[2].text
    assert trace.errors[0].kind == tg.ErrorKind.TIMEOUT


async def test_reward_that_raises_is_recorded_with_score_none():
    def broken(task, trace):
        raise RuntimeError("boom")

    ts = tg.Taskset(id="t", data=[{"prompt": "x"}], rewards=[broken])
    [trace] = await tg.evaluate(ts, ScriptedModel(["y"]))
    assert trace.rewards["broken"].score is None and trace.reward is None
    assert trace.errors[0].stage == "scoring:broken"


async def test_stalled_model_times_out_without_hurting_siblings():
    calls = {"n": 0}

    def rule(request):
        calls["n"] += 1
        return Stall(None) if calls["n"] == 1 else "3"

    model = ScriptedModel(rule=rule)
    traces = await tg.evaluate(_taskset(), model, rollouts=3, timeouts=tg.Timeouts(model=0.2))
    reasons = sorted(t.stop_reason for t in traces)
    assert reasons.count(tg.StopReason.COMPLETED) == 2 and tg.StopReason.TIMEOUT in reasons


async def test_max_turns_ends_an_endless_tool_loop():
    model = ScriptedModel(rule=lambda r: reply(None, tool_call("add", {"a": 1, "b": 1})))
    [trace] = await tg.evaluate(_taskset(max_turns=3), model)
    assert trace.stop_reason == tg.StopReason.MAX_TURNS and trace.num_turns == 3


def test_unknown_taskset_lists_known_ones():
    import pytest

    with pytest.raises(tg.UsageError, match=r"Known: .*reverse-text"):
        tg.load_taskset("reverse-txet")


def test_tool_without_args_doc_fails_at_load():
    import pytest

    def bad(x: int) -> int:
        """No args section."""
        return x

    with pytest.raises(tg.UsageError, match="'x' is not described"):
        tg.Taskset(id="t", data=[], tools=[bad])


async def test_infinite_taskset_refuses_unbounded_shuffle():
    import itertools

    import pytest

    class Counting(tg.Taskset):
        id = "counting"
        infinite = True

        def load(self):
            return ({"prompt": str(i)} for i in itertools.count())

    with pytest.raises(tg.UsageError, match="infinite"):
        Counting().shuffle(1)
    assert [d.prompt for d in Counting().shuffle(1, bound=3)] != []
    assert len(Counting().head(5)) == 5
    await asyncio.sleep(0)


async def test_a_sampling_seed_gives_each_rollout_of_a_task_its_own_seed():
    model = ScriptedModel(rule=lambda request: "3")
    traces = await tg.evaluate(_taskset(), model, rollouts=3, sampling=tg.Sampling(seed=7))
    assert sorted(r.sampling.seed for r in model.requests) == [7, 8, 9]
    assert [t.sampling["seed"] for t in traces] == [7, 8, 9]
