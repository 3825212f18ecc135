"""Tripwires fire on the signs of a reward hack and stay quiet on honest progress (issue 37, part 2)."""

import asyncio

import pytest

import tracegym as tg
from tracegym.core.trace import Usage
from tracegym.testing import make_trace
from tracegym.train.advantages import GroupAdvantages
from tracegym.train.orchestrator import Orchestrator, StepPlan
from tracegym.train.rl_folder import RLFolder
from tracegym.train.signal import RLSignal
from tracegym.train.staleness import StalenessControl
from tracegym.train.tripwire import PAUSED, Trip, TripwireConfig, Tripwires, TripwireStop, surprisal, view_of


def _group(reward: float, *, exact: float = 0.0, tokens: int = 20, replies: tuple[str, ...] = ("a", "b")) -> list:
    return [make_trace(reply=r, reward=reward, metrics={"exact": exact},
                       usage=Usage(completion_tokens=tokens)) for r in replies]


def _run(wires: Tripwires, steps: list[list[list]]) -> list[str]:
    return [trip.wire for step, groups in enumerate(steps) for trip in wires.observe(step, groups)]


def test_scorer_gap_fires_when_the_reward_rises_and_the_witness_does_not():
    wires = Tripwires(TripwireConfig(witness="exact", window=3))
    steps = [[_group(0.2)], [_group(0.4)], [_group(0.6)]]
    assert _run(wires, steps) == ["scorer_gap"]


def test_scorer_gap_is_quiet_when_the_witness_rises_with_the_reward():
    wires = Tripwires(TripwireConfig(witness="exact", window=3))
    steps = [[_group(0.2, exact=0.1)], [_group(0.4, exact=0.3)], [_group(0.6, exact=0.5)]]
    assert _run(wires, steps) == []


def test_scorer_gap_is_not_armed_without_a_witness():
    assert "scorer_gap" not in Tripwires(TripwireConfig()).armed()


def test_length_shift_fires_when_the_reward_rises_as_replies_shrink():
    wires = Tripwires(TripwireConfig(window=2))
    assert _run(wires, [[_group(0.1, tokens=40)], [_group(0.5, tokens=4)]]) == ["length_shift"]


def test_length_shift_is_quiet_while_the_reward_is_flat():
    wires = Tripwires(TripwireConfig(window=2))
    assert _run(wires, [[_group(0.3, tokens=40)], [_group(0.32, tokens=4)]]) == []


def test_diversity_collapse_fires_on_the_second_step_of_one_reply_per_group():
    wires = Tripwires(TripwireConfig())
    same = [_group(0.5, replies=("x", "x")), _group(0.5, replies=("y", "y"))]
    assert _run(wires, [same, same]) == ["diversity_collapse"]


def test_one_collapsed_step_alone_does_not_fire():
    wires = Tripwires(TripwireConfig())
    same, varied = [_group(0.5, replies=("x", "x"))], [_group(0.5)]
    assert _run(wires, [same, varied, same]) == []


def test_surprisal_is_the_mean_negative_logprob_of_sampled_tokens():
    trace = make_trace()
    node = trace.graph.nodes[-1].model_copy(update={"token_ids": [1, 2], "mask": [1, 1], "logprobs": [-1.0, -3.0]})
    trace.graph.nodes[-1] = node
    assert surprisal(trace) == 2.0


def test_unscored_rollouts_are_left_out_of_the_view():
    view = view_of(0, [[make_trace(reward=None), make_trace(reward=1.0)]], witness=None)
    assert view.reward == 1.0 and view.same_reply_share is None


def test_a_disabled_config_arms_and_fires_nothing():
    wires = Tripwires(TripwireConfig(enabled=False, window=2))
    assert wires.armed() == [] and _run(wires, [[_group(0.1, tokens=40)], [_group(0.9, tokens=4)]]) == []


def _orchestrator(tmp_path, action: str) -> Orchestrator:
    return Orchestrator(RLFolder(tmp_path), tg.Endpoint(base_url="http://127.0.0.1:9/v1", model="model"), [],
                        RLSignal(GroupAdvantages()), StalenessControl(1),
                        StepPlan(steps=1, tasks_per_step=1, group_size=2, concurrency=2),
                        tripwires=Tripwires(TripwireConfig(action=action)))


def test_a_stop_action_records_the_trip_and_ends_the_run_naming_the_wire(tmp_path):
    orch = _orchestrator(tmp_path, "stop")
    with pytest.raises(TripwireStop, match="length_shift"):
        asyncio.run(orch.trip([Trip("length_shift", 3, "reward rose")]))
    [record] = orch.folder.tripwires.read()
    assert record | {"time": 0} == {"tripwire": "length_shift", "step": 3, "message": "reward rose", "action": "stop",
                                    "time": 0}


def test_a_pause_action_waits_until_the_paused_file_is_removed(tmp_path):
    orch = _orchestrator(tmp_path, "pause")

    async def scenario() -> bool:
        task = asyncio.create_task(orch.trip([Trip("scorer_gap", 5, "witness flat")]))
        while not (tmp_path / PAUSED).exists():
            await asyncio.sleep(0)
        waiting = not task.done()
        (tmp_path / PAUSED).unlink()
        await asyncio.wait_for(task, timeout=30)
        return waiting

    assert asyncio.run(scenario())


def probed(refused: float | None, reply: str = "a") -> tg.Trace:
    return make_trace(reply=reply, reward=0.0,
                      metrics={} if refused is None else {"sandbox_refused_connections": refused})


def test_sandbox_probe_fires_when_a_sandboxed_rollout_reached_outside_its_task():
    groups = [[probed(0), probed(3, "b")], [probed(0), probed(0, "b")]]
    [trip] = Tripwires(TripwireConfig()).observe(2, groups)
    assert trip.wire == "sandbox_probe" and trip.message.startswith("1 of 4 sandboxed rollouts")


def test_sandbox_probe_is_quiet_when_no_sandbox_refused_anything():
    assert Tripwires(TripwireConfig()).observe(2, [[probed(0), probed(None, "b")]]) == []


def test_sandbox_probe_waits_for_more_than_its_share():
    wires = Tripwires(TripwireConfig(sandbox_probes=0.5))
    assert wires.observe(2, [[probed(1), probed(0, "b")]]) == []


def _paid(reward: float, exact: float, reply: str) -> tg.Trace:
    return make_trace(reply=reply, reward=reward, metrics={"exact": exact})


def test_witness_disagrees_fires_when_full_marks_the_witness_scores_zero_pass_the_share():
    wires = Tripwires(TripwireConfig(witness="exact", window=2))
    honest = [_paid(0.3, 0.0, "a"), _paid(1.0, 1.0, "b")]
    assert wires.observe(0, [honest * 5]) == []  # the window is not full yet
    [trip] = [t for t in wires.observe(1, [[_paid(1.0, 0.0, "c"), *honest * 4]]) if t.wire == "witness_disagrees"]
    assert trip.message.startswith("1 of 19 rollouts over 2 steps got full marks")


def test_witness_disagrees_is_quiet_while_full_marks_agree_with_the_witness():
    wires = Tripwires(TripwireConfig(witness="exact", window=2))
    steps = [[[_paid(1.0, 1.0, "a"), _paid(0.5, 0.0, "b")]] for _ in range(3)]
    assert "witness_disagrees" not in _run(wires, steps)


def test_witness_disagrees_is_not_armed_without_a_witness():
    assert "witness_disagrees" not in Tripwires(TripwireConfig()).armed()
