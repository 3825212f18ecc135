"""The orchestrator's training policy on failed rollouts and stale samples, on hand-built traces: a rollout that
failed outside the model is neither in its group's statistics nor trained; samples carry the oldest policy
version that sampled them, and ones older than `max_async_steps` are dropped."""

import asyncio

import tracegym as tg
from tracegym.core.episode import Episode
from tracegym.core.errors import ErrorKind, TraceError
from tracegym.core.messages import assistant, user
from tracegym.core.sample import Sample
from tracegym.core.trace import RewardScore, StopReason, Trace
from tracegym.testing import make_trace
from tracegym.train.advantages import GroupAdvantages
from tracegym.train.orchestrator import Orchestrator, StepPlan, step_metrics
from tracegym.train.rl_folder import RLFolder
from tracegym.train.signal import RLSignal, StepGroups
from tracegym.train.staleness import StalenessControl


def orchestrator(tmp_path, max_async_steps: int = 1) -> Orchestrator:
    """Only the parts that turn groups into samples: no environments, no endpoint to call."""
    return Orchestrator(RLFolder(tmp_path), tg.Endpoint(base_url="http://127.0.0.1:9/v1", model="model"), [],
                        RLSignal(GroupAdvantages()), StalenessControl(max_async_steps),
                        StepPlan(steps=1, tasks_per_step=1, group_size=2, concurrency=2))


def to_samples(orch: Orchestrator, groups: list[list[Trace]], version: int, step: int) -> list[Sample]:
    """What the orchestrator trains on from groups of rollouts (each its solo episode, as the env server returns
    it) at `step`, the policy `version` served when it started."""
    episodes = [[Episode.solo(t) for t in group] for group in groups]
    return asyncio.run(orch.train_on(StepGroups(step, episodes), version))[0]


def tokened(reward: float | None, versions: tuple[int | None, ...] = (None,), **fields) -> Trace:
    """A trace with one sampled, tokenized turn per version (reported by the endpoint, or None)."""
    trace = Trace(task=make_trace().task, stop_reason=StopReason.COMPLETED, **fields)
    trace.graph.add(user("q"))
    trace.prompt_length = 1
    prompt = [1, 2]
    for version in versions:
        trace.graph.add_model_turn(assistant("a"), prompt_ids=list(prompt), completion_ids=[7, 8],
                                   completion_logprobs=[-0.1, -0.2], temperature=1.0, policy_version=version)
        prompt += [7, 8, 3]
        trace.graph.add(user("again"))
    trace.rewards["reward"] = RewardScore(score=reward)
    return trace


def env_timed_out() -> Trace:
    trace = tokened(None)
    trace.stop_reason = StopReason.TIMEOUT
    trace.errors.append(TraceError(kind=ErrorKind.TIMEOUT, stage="env_response", message="timed out after 60s"))
    return trace


def test_a_rollout_that_failed_outside_the_model_is_left_out_of_its_groups_advantages(tmp_path):
    """Three 1.0 rewards plus one env timeout: no signal among the rollouts that count, so nothing is trained
    (the timed-out rollout used to be trained with advantage -0.75)."""
    orch = orchestrator(tmp_path)
    samples = to_samples(orch, [[tokened(1.0), tokened(1.0), tokened(1.0), env_timed_out()]], version=0, step=0)
    assert samples == [] and orch.signal.advantages.filtered == 1


def test_the_failed_rollout_is_not_trained_and_the_others_get_advantages_among_themselves(tmp_path):
    failed = env_timed_out()
    samples = to_samples(orchestrator(tmp_path), [[tokened(1.0), tokened(0.0), failed]], version=0, step=0)
    assert sorted(s.advantage for s in samples) == [-0.5, 0.5]
    assert failed.id not in {s.trace_id for s in samples}


def test_a_tool_timeout_the_model_recovered_from_still_keeps_the_rollout_out_of_training(tmp_path):
    slow_tool = tokened(1.0)
    slow_tool.errors.append(TraceError(kind=ErrorKind.TIMEOUT, stage="tool:search", message="timed out after 60s"))
    samples = to_samples(orchestrator(tmp_path), [[tokened(1.0), tokened(0.0), slow_tool]], version=0, step=0)
    assert slow_tool.id not in {s.trace_id for s in samples} and len(samples) == 2


def test_rollouts_that_ended_on_the_models_output_are_trained(tmp_path):
    truncated, capped = tokened(0.0), tokened(1.0)
    truncated.stop_reason, capped.stop_reason = StopReason.TRUNCATED, StopReason.MAX_TURNS
    samples = to_samples(orchestrator(tmp_path), [[truncated, capped]], version=0, step=0)
    assert {s.trace_id for s in samples} == {truncated.id, capped.id}


def test_step_metrics_count_failed_rollouts_by_reason_and_average_only_trainable_rewards():
    crashed = tokened(None)
    crashed.stop_reason = StopReason.ERROR
    crashed.errors.append(TraceError(kind=ErrorKind.INFRASTRUCTURE, stage="model", message="worker died"))
    metrics = step_metrics([[tokened(1.0), tokened(0.0), env_timed_out(), crashed]], [], 1.0)
    assert metrics["reward"] == 0.5
    assert metrics["rollouts_failed"] == 2
    assert (metrics["failed/task_timeout"], metrics["failed/model_unavailable"]) == (1, 1)


def test_a_sample_is_stamped_with_the_oldest_version_that_sampled_its_branch(tmp_path):
    """The policy moved on mid-rollout (3 -> 4): the sample is as old as its oldest turn."""
    samples = to_samples(orchestrator(tmp_path, max_async_steps=2),
                         [[tokened(1.0, (3, 4)), tokened(0.0, (4, 4))]], version=3, step=4)
    assert sorted(s.policy_version for s in samples) == [3, 4]


def test_samples_older_than_max_async_steps_are_dropped_and_counted(tmp_path):
    """At step 5 with max_async_steps 1, a rollout that began on version 3 is too stale even though the policy
    served when the step started (4) is fresh enough."""
    orch = orchestrator(tmp_path, max_async_steps=1)
    samples = to_samples(orch, [[tokened(1.0, (3, 4)), tokened(0.0, (4, 4))]], version=4, step=5)
    assert [s.policy_version for s in samples] == [4]
    assert orch.staleness.dropped == 1


def test_an_endpoint_that_reports_no_version_gets_the_version_served_when_the_step_started(tmp_path):
    samples = to_samples(orchestrator(tmp_path), [[tokened(1.0), tokened(0.0)]], version=2, step=2)
    assert {s.policy_version for s in samples} == {2}
