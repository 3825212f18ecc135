"""arithmetic: an endless seeded stream, operator precedence, reading the last integer, bounded evaluation."""

import pytest

import tracegym as tg
from tracegym.tasksets.arithmetic import last_integer, value_of
from tracegym.testing import ScriptedModel


def solves(request) -> str:
    expression = request.messages[-1].text.removeprefix("What is ").removesuffix("?")
    return f"Working it out... the answer is {eval(expression)}."  # a generated expression: digits and + - *


def test_tasks_are_deterministic_for_a_seed():
    first = [d.prompt for d in tg.load_taskset("arithmetic").head(5)]
    assert first == [d.prompt for d in tg.load_taskset("arithmetic").head(5)]
    assert first != [d.prompt for d in tg.load_taskset("arithmetic", {"seed": 1}).head(5)]


def test_difficulty_sets_the_number_of_ops_and_digits():
    [data] = tg.load_taskset("arithmetic", {"num_ops": 4, "max_digits": 3}).head(1)
    tokens = data.expression.split()
    assert len(tokens) == 9 and all(len(t) <= 3 for t in tokens[::2])


def test_answer_follows_operator_precedence():
    for data in tg.load_taskset("arithmetic", {"num_ops": 3}).head(50):
        assert data.answer == eval(data.expression)


def test_value_of_multiplies_before_adding():
    assert value_of([2, 3, 4, 5], ["+", "*", "-"]) == 2 + 3 * 4 - 5


def test_taskset_is_infinite_until_bounded():
    ts = tg.load_taskset("arithmetic")
    assert not ts.bounded and ts.head(3).bounded
    with pytest.raises(tg.UsageError, match="infinite"):
        len(ts)


def test_shuffle_without_a_bound_raises():
    with pytest.raises(tg.UsageError, match="infinite"):
        tg.load_taskset("arithmetic").shuffle(1)


def test_head_gives_the_first_tasks():
    ts = tg.load_taskset("arithmetic")
    assert len(ts.head(7)) == 7
    assert [d.id for d in ts.head(3)] == ["arithmetic-0-0", "arithmetic-0-1", "arithmetic-0-2"]


async def test_evaluate_without_num_tasks_raises():
    with pytest.raises(tg.UsageError, match="infinite"):
        await tg.evaluate("arithmetic", ScriptedModel(rule=solves))


async def test_correct_final_number_scores_one_on_a_head():
    ts = tg.load_taskset("arithmetic").head(4)
    traces = await tg.evaluate(ts, ScriptedModel(rule=solves), rollouts=2)
    assert [t.reward for t in traces] == [1.0] * 8


async def test_wrong_final_number_scores_zero():
    model = ScriptedModel(rule=lambda r: f"{solves(r)} No wait, it is 123456789.")
    traces = await tg.evaluate("arithmetic", model, num_tasks=3)
    assert [t.reward for t in traces] == [0.0] * 3
    assert all(t.metrics["has_number"] == 1.0 for t in traces)


async def test_reply_without_a_number_scores_zero():
    [trace] = await tg.evaluate("arithmetic", ScriptedModel(rule=lambda r: "I cannot say."), num_tasks=1)
    assert trace.reward == 0.0 and trace.metrics["has_number"] == 0.0


@pytest.mark.parametrize(
    ("text", "value"),
    [("The answer is 42.", 42), ("7-3", 3), ("x = -12", -12), ("1,234", 1234), ("= 12.0", 12),
     ("12.5", None), ("nothing", None), ("3 * 4 = 12", 12)],
)
def test_last_integer_reads_the_final_number(text, value):
    assert last_integer(text) == value
