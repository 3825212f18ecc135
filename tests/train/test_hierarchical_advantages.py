"""Hierarchical groups (`[orchestrator.advantage] per_episode`): a proposer-solver episode's solvers are grouped
by the task proposed in it, the proposer by its prompt across the prompt's episodes; each level its own baseline."""

import itertools

import pytest
from pydantic import ValidationError

from tracegym.envs.evaluate import run_episode
from tracegym.envs.proposer_solver import PROPOSER
from tracegym.envs.registry import load_taskset
from tracegym.models.endpoint import Endpoint
from tracegym.tasksets.propose_arithmetic import PROPOSER_SYSTEM, ProposerPrompt
from tracegym.testing import ScriptedModel, make_episode
from tracegym.train.advantages import AdvantageConfig, GroupAdvantages, group_mean
from tracegym.train.fan_out import episode_units
from tracegym.train.modes import build_signal
from tracegym.train.rl_folder import Endpoints
from tracegym.train.signal import RLSignal

SOLVERS = [f"solver_{i}" for i in range(4)]


def players(proposal: str, solver_replies: list[str]) -> ScriptedModel:
    replies = itertools.cycle(solver_replies)
    return ScriptedModel(rule=lambda r: proposal if r.messages[0].text == PROPOSER_SYSTEM else next(replies))


async def prompt_group():
    """Three episodes of one proposer prompt: a proposal half the solvers pass (proposer 1.0), one all pass
    (proposer 0.0), and an invalid one (proposer -1.0, solvers skipped)."""
    taskset = load_taskset("propose-arithmetic", {"num_tasks": 1})
    row = ProposerPrompt(id="asked", prompt="Write one problem with 2 numbers; one of them must be 3.", numbers=2,
                         largest=50, include=3)
    plays = [("3 * 4 = 12", ["12", "12", "13", "20"]),
             ("3 + 5 = 8", ["8"]),
             ("3 + 5 = 9", ["8"])]
    return [await run_episode(taskset, row, players(p, s), episode_index=i) for i, (p, s) in enumerate(plays)]


def advantages_of(pairs) -> list[tuple[int, str, float]]:
    return [(u.trace.rollout_index, u.member, a) for u, a in pairs]


async def test_solvers_are_grouped_per_proposed_task_and_the_proposer_per_prompt():
    group = await prompt_group()
    pairs, dropped = RLSignal(GroupAdvantages(group_mean), per_episode=("solver_*",)).advantaged([group])
    by_unit = advantages_of(pairs)
    # the proposer's group: rewards 1.0, 0.0, -1.0 over the prompt's three episodes, mean 0.0
    assert [(i, a) for i, m, a in by_unit if m == PROPOSER] == [(0, 1.0), (1, 0.0), (2, -1.0)]
    # episode 0's solvers: rewards 1, 1, 0, 0 against their own mean 0.5; episode 1's (all passed): no signal
    assert [(i, a) for i, m, a in by_unit if m != PROPOSER] == [(0, 0.5), (0, 0.5), (0, -0.5), (0, -0.5)]
    assert dropped == {"no_turns": 4}  # episode 2's solvers: skipped, never trained


async def test_without_per_episode_a_solver_seat_is_grouped_across_episodes_instead():
    group = await prompt_group()
    pairs, _ = RLSignal(GroupAdvantages(group_mean)).advantaged([group])
    solver_0 = [(i, a) for i, m, a in advantages_of(pairs) if m == "solver_0"]
    assert solver_0 == []  # solver_0 passed in episodes 0 and 1: the seat's group has no signal


def test_per_episode_keys_name_the_episode_and_the_pattern():
    episodes = [make_episode({"proposer": 1.0, "solver_0": 1.0, "solver_1": 0.0}, taskset="ps") for _ in range(2)]
    units, _ = episode_units(episodes, per_episode=("solver_*",))
    keys = [u.key for u in units]
    task = episodes[0].task_key
    assert keys[0] == keys[3] == f"ps/{task}/proposer"
    assert keys[1] == keys[2] == f"ps/{task}/episode-{episodes[0].id}/solver_*"
    assert keys[4] == keys[5] == f"ps/{task}/episode-{episodes[1].id}/solver_*"


def test_per_episode_is_refused_with_rae_whose_baseline_would_never_repeat():
    with pytest.raises(ValidationError, match="per_episode does not apply to advantage 'rae'"):
        AdvantageConfig(name="rae", per_episode=("solver_*",))


def test_per_episode_is_read_from_the_advantage_section():
    config = AdvantageConfig.model_validate({"per_episode": ["solver_*"]})
    assert config.per_episode == ("solver_*",) and AdvantageConfig().per_episode == ()


def test_an_rl_runs_signal_gets_the_sections_per_episode():
    signal = build_signal("rl", AdvantageConfig(per_episode=("solver_*",)),
                          student=Endpoint(base_url="http://127.0.0.1:9/v1", model="m"),
                          endpoints=Endpoints(base_url="http://127.0.0.1:9/v1", base_model="m", envs={}))
    assert isinstance(signal, RLSignal) and signal.per_episode == ("solver_*",)
