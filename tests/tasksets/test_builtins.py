"""Every built-in taskset loads by id, describes itself and runs a rollout without an error."""

import pytest

import tracegym as tg
from tracegym.envs.evaluate import evaluate_episodes
from tracegym.envs.multi_agent import is_multi_agent
from tracegym.envs.registry import BUILTINS
from tracegym.testing import ScriptedModel

MULTI_AGENT = sorted(i for i in BUILTINS if is_multi_agent(tg.load_taskset(i)))


@pytest.mark.parametrize("taskset_id", sorted(set(BUILTINS) - set(MULTI_AGENT)))
async def test_builtin_loads_and_runs_one_rollout_cleanly(taskset_id):
    ts = tg.load_taskset(taskset_id)
    assert ts.id == taskset_id and ts.description
    [trace] = await tg.evaluate(ts, ScriptedModel(rule=lambda r: "I am not sure."), num_tasks=1, rollouts=1)
    assert trace.errors == [] and trace.ok
    assert trace.rewards and trace.reward is not None


def sensible(request) -> str:
    """A reply every built-in game takes: a legal-looking move, or the first argued answer for a judge."""
    asked = request.messages[-1].text
    if "Which answer is correct" in asked:
        return f"VERDICT: {asked.split('(')[1][0]}"
    return "check 5"


@pytest.mark.parametrize("taskset_id", MULTI_AGENT)
async def test_multi_agent_builtin_loads_and_runs_one_episode_cleanly(taskset_id):
    ts = tg.load_taskset(taskset_id)
    assert ts.id == taskset_id and ts.description
    [episode] = await evaluate_episodes(ts, ScriptedModel(rule=sensible), num_tasks=1)
    assert episode.error is None and episode.ok
    assert all(t.errors == [] and t.reward is not None for t in episode.traces.values())
