"""run_group: the rollouts of one task run concurrently; traces come back in rollout-index order."""

import tracegym as tg
from tracegym.testing import Fail, ScriptedModel, Stall


@tg.reward
def said_yes(task, trace):
    return float(trace.last_reply == "yes")


TASKSET = tg.Taskset(id="group", data=[{"prompt": "q"}], rewards=[said_yes])
SEEDED = tg.Sampling(seed=0)
"""Rollout i samples with seed i, so a scripted rule can tell the rollouts apart."""


async def test_traces_come_in_rollout_index_order_even_when_later_rollouts_finish_first():
    finished = []

    def rule(request):
        index = request.sampling.seed
        return Stall(0.03 * (3 - index), lambda r: finished.append(index) or "yes")

    [data] = list(TASKSET)
    traces = await tg.run_group(TASKSET, data, ScriptedModel(rule=rule), rollouts=3, sampling=SEEDED)
    assert finished == [2, 1, 0]
    assert [t.rollout_index for t in traces] == [0, 1, 2] and all(t.ok for t in traces)


async def test_one_failed_rollout_leaves_the_others_of_its_group_scored():
    model = ScriptedModel(rule=lambda request: Fail(400, "bad") if request.sampling.seed == 1 else "yes")
    [data] = list(TASKSET)
    traces = await tg.run_group(TASKSET, data, model, rollouts=3, sampling=SEEDED)
    assert [t.stop_reason for t in traces] == [tg.StopReason.COMPLETED, tg.StopReason.ERROR,
                                               tg.StopReason.COMPLETED]
    assert [t.reward for t in traces] == [1.0, None, 1.0]
    assert traces[1].errors[0].kind == tg.ErrorKind.MODEL


async def test_the_rollouts_of_a_group_run_at_the_same_time():
    model = ScriptedModel(rule=lambda request: Stall(0.02, "yes"))
    [data] = list(TASKSET)
    await tg.run_group(TASKSET, data, model, rollouts=4)
    assert model.most_in_flight == 4


async def test_options_reach_every_rollout_of_the_group():
    [data] = list(TASKSET)
    traces = await tg.run_group(TASKSET, data, ScriptedModel([Stall(None)]), rollouts=2,
                                timeouts=tg.Timeouts(model=0.05))
    assert [t.stop_reason for t in traces] == [tg.StopReason.TIMEOUT] * 2
