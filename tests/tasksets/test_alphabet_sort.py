"""alphabet-sort: generated name lists, follow-up turns, the per-turn LCS reward and the exact-turn metric."""

import pytest

import tracegym as tg
from tracegym.tasksets.alphabet_sort import NAMES, AlphabetSort, reply_lines
from tracegym.testing import ScriptedModel

KNOWN = set(NAMES)


def names_shown(request) -> list[str]:
    """Every name the user has shown so far in the conversation."""
    return [line for m in request.messages if m.role == "user" for line in m.text.splitlines() if line in KNOWN]


def sorts_correctly(request) -> str:
    return "\n".join(sorted(names_shown(request)))


def test_tasks_are_deterministic_for_a_seed():
    first = [d.prompt for d in tg.load_taskset("alphabet-sort").head(5)]
    assert first == [d.prompt for d in tg.load_taskset("alphabet-sort").head(5)]
    assert first != [d.prompt for d in tg.load_taskset("alphabet-sort", {"seed": 1}).head(5)]


def test_each_turn_expects_every_name_so_far_sorted():
    [data] = tg.load_taskset("alphabet-sort", {"follow_up_turns": 3, "names_per_turn": 2}).head(1)
    assert len(data.batches) == len(data.expected) == 4
    assert data.expected[-1] == sorted(n for batch in data.batches for n in batch)
    assert len(set(data.expected[-1])) == len(data.expected[-1])


async def test_correct_sorting_on_every_turn_scores_one():
    traces = await tg.evaluate("alphabet-sort", ScriptedModel(rule=sorts_correctly), num_tasks=3, rollouts=2)
    assert [t.reward for t in traces] == [1.0] * 6
    assert all(t.metrics["turns_exact"] == 3 and t.stop_reason == tg.StopReason.COMPLETED for t in traces)


async def test_reverse_order_scores_low():
    model = ScriptedModel(rule=lambda r: "\n".join(sorted(names_shown(r), reverse=True)))
    [trace] = await tg.evaluate("alphabet-sort", model, num_tasks=1)
    assert 0 < trace.reward < 0.5 and trace.metrics["turns_exact"] == 0


async def test_environment_adds_names_each_follow_up_turn():
    config = {"follow_up_turns": 2, "names_per_turn": 3}
    [trace] = await tg.evaluate(tg.load_taskset("alphabet-sort", config), ScriptedModel(rule=sorts_correctly),
                                num_tasks=1)
    users = [m.text for m in trace.messages if m.role == "user"]
    assert len(users) == 3 and trace.num_turns == 3
    assert [line for line in users[1].splitlines() if line in KNOWN] == trace.task.batches[1]


async def test_one_wrong_turn_lowers_the_mean_and_the_exact_count():
    script = [sorts_correctly, lambda r: "\n".join(sorted(names_shown(r))[:-1]), sorts_correctly]
    [trace] = await tg.evaluate("alphabet-sort", ScriptedModel(script), num_tasks=1)
    assert trace.metrics["turns_exact"] == 2
    assert 2 / 3 < trace.reward < 1.0


async def test_turns_never_reached_score_zero():
    ts = AlphabetSort(max_turns=1)
    [trace] = await tg.evaluate(ts, ScriptedModel(rule=sorts_correctly), num_tasks=1)
    assert trace.stop_reason == tg.StopReason.MAX_TURNS
    assert trace.reward == pytest.approx(1 / 3)


def test_reply_lines_ignore_markers_and_blank_lines():
    assert reply_lines("1. Ana\n\n- Ben,\n* Cleo.\n  Dora  ") == ["Ana", "Ben", "Cleo", "Dora"]


def test_config_needing_more_names_than_shipped_is_refused():
    with pytest.raises(tg.UsageError, match="distinct names"):
        tg.load_taskset("alphabet-sort", {"follow_up_turns": 100, "names_per_turn": 10})


async def test_rewards_recompute_from_a_trace_read_back_from_json():
    [trace] = await tg.evaluate("alphabet-sort", ScriptedModel(rule=sorts_correctly), num_tasks=1)
    again = tg.Trace.model_validate_json(trace.model_dump_json())
    task = tg.load_taskset("alphabet-sort").task(again.task)
    [score] = task.scorers_of_kind("reward")
    assert await task.call_scorer(score, again) == 1.0


async def test_a_trace_round_trips_through_json_with_its_sort_data():
    [trace] = await tg.evaluate(AlphabetSort({"follow_up_turns": 1}).head(1), ScriptedModel(rule=sorts_correctly))
    back = tg.Trace.model_validate_json(trace.model_dump_json())
    assert back.task.batches == trace.task.batches and back.task_key == trace.task_key
    assert back.model_dump(mode="json") == trace.model_dump(mode="json") and back == trace
