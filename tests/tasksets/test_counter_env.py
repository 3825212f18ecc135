"""counter-env: the factory and its config, seeded rows, the TRL-shaped reward and the distance metric."""

import re

import pytest

import tracegym as tg
from tracegym.testing import ScriptedModel, reply, tool_call

_RULES = re.compile(r"starts at (\d+) and the target is (\d+)\. Each call moves it by 1 to (\d+)")
_COUNT = re.compile(r"The counter is (?:now|at) (-?\d+)")


def drives_to_target(request):
    """Step toward the target by the largest allowed amount, then say done."""
    start, target, step = map(int, _RULES.search(request.messages[0].text).groups())
    counts = [int(n) for m in request.messages if m.role == "tool" for n in _COUNT.findall(m.text)]
    count = counts[-1] if counts else start
    if count == target:
        return "done"
    name = "increment" if target > count else "decrement"
    return reply(None, tool_call(name, {"amount": min(step, abs(target - count))}))


def test_rows_are_deterministic_for_a_seed():
    first = [(d.start, d.target) for d in tg.load_taskset("counter-env")]
    assert first == [(d.start, d.target) for d in tg.load_taskset("counter-env")]
    assert first != [(d.start, d.target) for d in tg.load_taskset("counter-env", {"seed": 1})]
    assert all(start != target for start, target in first)


def test_factory_takes_its_config_through_the_registry():
    ts = tg.load_taskset("counter-env", {"num_tasks": 7, "max_step": 2})
    assert ts.id == "counter-env" and len(ts) == 7
    assert ts.config.max_step == 2 and {d.max_step for d in ts} == {2}


def test_factory_rejects_a_misspelt_config_field():
    with pytest.raises(tg.UsageError, match=r"did you mean 'max_step'\?"):
        tg.load_taskset("counter-env", {"max_stpe": 2})


async def test_reaching_the_target_scores_one():
    traces = await tg.evaluate("counter-env", ScriptedModel(rule=drives_to_target), num_tasks=3, rollouts=2)
    assert [t.reward for t in traces] == [1.0] * 6
    assert all(t.metrics["distance"] == 0.0 and t.errors == [] for t in traces)


async def test_stopping_off_target_scores_zero_and_reports_the_distance():
    [trace] = await tg.evaluate("counter-env", ScriptedModel(["done"]), num_tasks=1)
    assert trace.reward == 0.0
    assert trace.metrics["distance"] == abs(trace.task.target - trace.task.start)
