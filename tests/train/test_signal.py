"""Signal: the one interface through which a training mode makes samples; the orchestrator runs any signal alike."""

import asyncio
from dataclasses import dataclass, field

from test_orchestrator_failures import tokened

import tracegym as tg
from tracegym.core.episode import Episode
from tracegym.core.sample import Sample
from tracegym.core.trace import Trace
from tracegym.train.advantages import GroupAdvantages
from tracegym.train.orchestrator import Orchestrator, StepPlan
from tracegym.train.rl_folder import RLFolder
from tracegym.train.signal import RLSignal, StepGroups
from tracegym.train.staleness import StalenessControl

POLICY = tg.Endpoint(base_url="http://127.0.0.1:9/v1", model="policy")


@dataclass
class Recording(RLSignal):
    """RL's samples, remembering what reached `finish` and marking each sample finished."""

    finished: list[list[Sample]] = field(default_factory=list)

    async def finish(self, samples: list[Sample]) -> tuple[list[Sample], dict[str, float]]:
        self.finished.append(samples)
        return [s.model_copy(update={"meta": {"finished": True}}) for s in samples], {"finished": len(samples)}


def rollouts(*traces: Trace) -> list[Episode]:
    """A group of rollouts as the env server returns it: each the solo episode of its trace."""
    return [Episode.solo(t) for t in traces]


def orchestrator(tmp_path, signal, max_async_steps: int = 0) -> Orchestrator:
    return Orchestrator(RLFolder(tmp_path), POLICY, [], signal, StalenessControl(max_async_steps),
                        StepPlan(steps=1, tasks_per_step=1, group_size=2, concurrency=2))


def test_the_orchestrator_finishes_only_the_samples_fresh_enough_for_the_step(tmp_path):
    signal = Recording(GroupAdvantages())
    groups = StepGroups(3, [rollouts(tokened(1.0, (3,)), tokened(0.0, (2,)))])  # one sampled by a policy too old
    samples, metrics = asyncio.run(orchestrator(tmp_path, signal).train_on(groups, version=3))
    assert [s.policy_version for s in signal.finished[0]] == [3]
    assert [s.meta for s in samples] == [{"finished": True}] and metrics["finished"] == 1


def test_the_rl_signal_trains_only_what_the_filters_keep_but_keeps_every_reward_in_the_baseline():
    kept, caught = tokened(1.0), tokened(0.0)
    samples, metrics = asyncio.run(RLSignal(GroupAdvantages()).samples(
        StepGroups(0, [rollouts(kept, caught)], keeps=lambda trace: trace is kept), version=0))
    assert [(s.trace_id, s.advantage) for s in samples] == [(kept.id, 0.5)] and metrics["groups_without_signal"] == 0


def test_the_rl_signal_counts_groups_without_signal_and_explains_an_empty_step():
    signal = RLSignal(GroupAdvantages())
    samples, metrics = asyncio.run(signal.samples(StepGroups(0, [rollouts(tokened(1.0), tokened(1.0))]), version=0))
    assert samples == [] and metrics["groups_without_signal"] == 1
    why = signal.why_empty([{"rollouts": 2, "rollouts_failed": 0, "rollouts_filtered": 0, **metrics}])
    assert "(1 groups had every reward the same)" in why


def test_a_step_of_rollouts_has_no_multi_agent_figures():
    _, metrics = asyncio.run(RLSignal(GroupAdvantages()).samples(
        StepGroups(0, [rollouts(tokened(1.0), tokened(0.0), tokened(None))]), version=0))
    assert metrics == {"groups_without_signal": 0}


def test_the_rl_signal_rolls_out_against_the_policy():
    assert RLSignal(GroupAdvantages()).rollout_endpoint(POLICY) is POLICY
