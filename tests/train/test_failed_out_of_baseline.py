"""Failed rollouts and members are out of the group baseline exactly: with 10% of a step's rollouts failed on
infrastructure (a model endpoint down, a sandbox that would not start), every valid sibling's advantage is
bit-for-bit what it is when the failed ones never ran; the step's figures count each failure kind and what the
failures would have cost (`reward_unmasked`)."""

import asyncio

import pytest

import tracegym as tg
from tracegym.core.episode import Episode
from tracegym.core.errors import ErrorKind, FailureKind, InfrastructureError, TraceError
from tracegym.core.trace import RewardScore, StopReason, Trace
from tracegym.envs.evaluate import failed_episode
from tracegym.runtimes.sandbox import RuntimeUnavailable
from tracegym.testing import Fail, ScriptedModel, make_episode, make_trace
from tracegym.train.advantages import AdvantageConfig, build_advantages
from tracegym.train.orchestrator import check_not_all_failed, step_metrics
from tracegym.train.signal import Group, RLSignal, StepGroups, learner_traces

GROUP = 20
MODEL_DOWN = {3}
"""Rollout indices whose model call fails (HTTP 503: model_unavailable)."""
NO_SANDBOX = {12}
"""Rollout indices whose task's sandbox cannot start (sandbox_error)."""
ADVANTAGES = [AdvantageConfig(), AdvantageConfig(std=True), AdvantageConfig(name="rae")]


@tg.reward
def length(task, trace):
    """A reward with many values, so the group's mean and std are not round numbers."""
    return len(trace.last_reply) / 7


class SandboxedTask(tg.Task):
    """Its setup starts a sandbox; the builds numbered in `NO_SANDBOX` find none."""

    built = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.number = SandboxedTask.built
        SandboxedTask.built += 1

    async def setup(self):
        if self.number % GROUP in NO_SANDBOX:
            raise RuntimeUnavailable("bubblewrap: cannot create a user namespace")


class Sandboxed(tg.Taskset):
    id = "sandboxed"
    task_class = SandboxedTask


def reply_for(request):
    """Rollout i answers with a reply of (5 i mod 11) characters; those in `MODEL_DOWN` find the endpoint down."""
    index = request.sampling.seed
    return Fail(503, "endpoint down") if index % GROUP in MODEL_DOWN else "x" * (5 * index % 11)


def rolled_out_groups() -> list[list[Trace]]:
    """Two tasks' groups of `GROUP` rollouts each, run one by one (so task builds are numbered by rollout), against
    a scripted model with exact tokens."""
    SandboxedTask.built = 0
    taskset = Sandboxed(data=[{"prompt": "a"}, {"prompt": "b"}], rewards=[length])
    model = ScriptedModel(rule=reply_for, tokens=True)

    async def group(data) -> list[Trace]:
        return [await tg.run_rollout(taskset, data, model, rollout_index=i, infra_retries=0,
                                     sampling=tg.Sampling(seed=0, temperature=1.0)) for i in range(GROUP)]

    return [asyncio.run(group(data)) for data in taskset]


def advantages_by_trace(config: AdvantageConfig, groups: list[Group]) -> dict[str, float]:
    """Each trained trace's advantage (one sample per trace here), from a fresh signal of `config`."""
    samples, _ = asyncio.run(RLSignal(build_advantages(config)).samples(StepGroups(0, groups), version=0))
    assert len({s.trace_id for s in samples}) == len(samples)
    return {s.trace_id: s.advantage for s in samples}


@pytest.fixture(scope="module")
def groups() -> list[list[Trace]]:
    return rolled_out_groups()


def test_the_injected_failures_are_ten_percent_model_and_sandbox_failures(groups):
    failures = [t.failure for g in groups for t in g if t.failure is not None]
    assert sorted(failures) == sorted([FailureKind.MODEL_UNAVAILABLE, FailureKind.SANDBOX_ERROR] * 2)
    assert len(failures) / sum(map(len, groups)) == 0.1


@pytest.mark.parametrize("config", ADVANTAGES, ids=["group_mean", "group_mean_std", "rae"])
def test_valid_rollouts_advantages_are_exactly_those_of_a_step_without_the_failed_ones(groups, config):
    with_failed = advantages_by_trace(config, [[Episode.solo(t) for t in g] for g in groups])
    without = advantages_by_trace(config, [[Episode.solo(t) for t in g if t.failure is None] for g in groups])
    assert with_failed == without
    assert len(without) == 36


def member_failed(episode: Episode, member: str, error: TraceError) -> Episode:
    """`episode` with `member`'s own trace failed by `error` (the episode itself ended normally)."""
    episode.traces[member].errors.append(error)
    return episode


def game_groups(failed: bool) -> list[Group]:
    """Two tasks' groups of 10 two-player episodes; with `failed`, one episode of each lost to its env-server
    request and one member of another hit by a sandbox failure (10% of the members); without, those are absent (the
    lost episode) or untrainable (the member), as if they never ran."""
    groups = []
    for t, task in enumerate([tg.TaskData(prompt="deal 1"), tg.TaskData(prompt="deal 2")]):
        group = []
        for i in range(10):
            rewards = {"p0": ((3 * i + t) % 7) / 6, "p1": -((3 * i + t) % 7) / 6 + (i % 3) / 5}
            if i == 4:
                if failed:
                    lost = InfrastructureError("env server at tcp://127.0.0.1:5555 is gone")
                    group.append(failed_episode("game", ["p0", "p1"], task, i, lost, stage="env_server",
                                                kind=ErrorKind.INFRASTRUCTURE))
                continue
            episode = make_episode(rewards, task=task, episode_index=i,
                                   trainable={"p0": True, "p1": failed or i != 7})
            if i == 7 and failed:
                sandbox = TraceError(kind=ErrorKind.INFRASTRUCTURE, stage="p1:tool:python", message="no sandbox",
                                     failure=FailureKind.SANDBOX_ERROR)
                episode = member_failed(episode, "p1", sandbox)
            group.append(episode)
        groups.append(group)
    return groups


@pytest.mark.parametrize("config", ADVANTAGES, ids=["group_mean", "group_mean_std", "rae"])
def test_valid_members_advantages_are_exactly_those_of_a_step_without_the_failed_ones(config):
    failed, clean = game_groups(failed=True), game_groups(failed=False)
    by_position = {}
    for f_group, c_group in zip(failed, clean, strict=True):
        for f_episode in f_group:
            c_episode = next((e for e in c_group if e.episode_index == f_episode.episode_index), None)
            for member, trace in f_episode.traces.items():
                if c_episode is not None and member in c_episode.trainable_members:
                    by_position[trace.id] = c_episode.traces[member].id
    with_failed, without = advantages_by_trace(config, failed), advantages_by_trace(config, clean)
    assert {by_position[trace_id]: a for trace_id, a in with_failed.items()} == without
    assert len(without) == 34


def test_step_metrics_count_each_injected_failure_kind(groups):
    metrics = step_metrics(groups, [], 1.0)
    assert (metrics["failed/model_unavailable"], metrics["failed/sandbox_error"]) == (2, 2)
    assert metrics["rollouts_failed"] == 4 and metrics["rollouts"] == 40


def test_reward_unmasked_counts_a_failed_rollout_at_its_recorded_reward_or_zero():
    scored_then_timed_out = make_trace(reward=0.5)
    scored_then_timed_out.errors.append(TraceError(kind=ErrorKind.TIMEOUT, stage="tool:search", message="60s"))
    metrics = step_metrics([[make_trace(reward=1.0), make_trace(reward=1.0), scored_then_timed_out,
                             make_trace(reward=None, error=ErrorKind.INFRASTRUCTURE)]], [], 1.0)
    assert metrics["reward"] == 1.0
    assert metrics["reward_unmasked"] == (1.0 + 1.0 + 0.5 + 0.0) / 4


def infra_failed(kind: ErrorKind, stage: str, failure: FailureKind | None = None) -> Trace:
    """A rollout that ended on an error of `kind` at `stage` (its failure kind decided by the error record)."""
    trace = make_trace(reward=None, stop_reason=StopReason.ERROR)
    fields = {"failure": failure} if failure else {}
    trace.errors.append(TraceError(kind=kind, stage=stage, message="injected", **fields))
    return trace


def tool_timed_out() -> Trace:
    """A rollout the model finished and that was scored, though a tool timed out on the way."""
    trace = make_trace(reward=1.0)
    trace.errors.append(TraceError(kind=ErrorKind.TIMEOUT, stage="tool:search", message="60s"))
    return trace


def unscored() -> Trace:
    trace = make_trace(reward=1.0)
    trace.rewards["judge"] = RewardScore(score=None)
    trace.errors.append(TraceError(kind=ErrorKind.TASK, stage="scoring:judge", message="judge crashed"))
    return trace


INFRA_KINDS = {
    "model_unavailable": lambda: infra_failed(ErrorKind.INFRASTRUCTURE, "model"),
    "model_timeout": lambda: infra_failed(ErrorKind.TIMEOUT, "model"),
    "sandbox_error": lambda: infra_failed(ErrorKind.INFRASTRUCTURE, "setup", FailureKind.SANDBOX_ERROR),
    "tool_timeout": tool_timed_out,
    "scoring_error": unscored,
    "env_server_error": lambda: infra_failed(ErrorKind.INFRASTRUCTURE, "env_server"),
    "worker_died": lambda: infra_failed(ErrorKind.INFRASTRUCTURE, "rollout", FailureKind.WORKER_DIED),
    "rollout_timeout": lambda: infra_failed(ErrorKind.TIMEOUT, "rollout"),
}


@pytest.mark.parametrize("kind", list(INFRA_KINDS))
def test_each_infrastructure_failure_kind_is_counted_by_name_per_step(kind):
    metrics = step_metrics([[make_trace(reward=1.0), INFRA_KINDS[kind]()]], [], 1.0)
    assert metrics[f"failed/{kind}"] == 1 and metrics["rollouts_failed"] == 1


def test_a_multi_agent_steps_failed_members_and_lost_episodes_are_counted_by_kind():
    """A member's own failure is a learner trace's (`failed/<kind>`); an episode lost with its env-server request
    is an episode's (`episodes_failed/<kind>`: which of its members would have trained, nobody recorded)."""
    groups = game_groups(failed=True)
    metrics = step_metrics([learner_traces(g) for g in groups], [], 1.0)
    _, figures = asyncio.run(RLSignal(build_advantages(AdvantageConfig())).samples(StepGroups(0, groups), 0))
    assert metrics["failed/sandbox_error"] == 2 and metrics["rollouts_failed"] == 2
    assert figures["episodes_failed/env_server_error"] == 2 and figures["episode_errors"] == 2


def test_a_step_whose_every_episode_was_lost_stops_the_run_saying_why():
    """Episodes lost with their env-server requests leave no learner trace: the step stops the run all the same."""
    lost = InfrastructureError("env server at tcp://127.0.0.1:5555 is gone")
    episodes = [failed_episode("game", ["p0", "p1"], tg.TaskData(prompt="deal"), i, lost, stage="env_server",
                               kind=ErrorKind.INFRASTRUCTURE) for i in range(3)]
    with pytest.raises(InfrastructureError) as stopped:
        check_not_all_failed(4, [learner_traces(episodes)], episodes)
    assert str(stopped.value) == ("step 4: all 3 episodes failed; the first: infrastructure error in env_server: "
                                  "env server at tcp://127.0.0.1:5555 is gone")


def test_a_step_with_one_episode_played_goes_on():
    lost = InfrastructureError("gone")
    episodes = [make_episode({"p0": 1.0, "p1": -1.0}), failed_episode(
        "game", ["p0", "p1"], tg.TaskData(prompt="deal"), 1, lost, stage="env_server", kind=ErrorKind.INFRASTRUCTURE)]
    check_not_all_failed(0, [learner_traces(episodes)], episodes)
