"""Every built-in taskset loads by id, describes itself and runs a rollout without an error."""

import pytest

import tracegym as tg
from tracegym.envs.registry import BUILTINS
from tracegym.testing import ScriptedModel


@pytest.mark.parametrize("taskset_id", sorted(BUILTINS))
async def test_builtin_loads_and_runs_one_rollout_cleanly(taskset_id):
    ts = tg.load_taskset(taskset_id)
    assert ts.id == taskset_id and ts.description
    [trace] = await tg.evaluate(ts, ScriptedModel(rule=lambda r: "I am not sure."), num_tasks=1, rollouts=1)
    assert trace.errors == [] and trace.ok
    assert trace.rewards and trace.reward is not None
