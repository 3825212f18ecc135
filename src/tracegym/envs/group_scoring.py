"""Group scoring: runs a taskset's group rewards and metrics (`@reward(group=True)`) over one task's group of rollouts.

A group is the rollouts of one task that a run makes together: an eval's `-r` rollouts of a task (`evaluate`,
`run_group`, an env server's `run` request of several rollout indices), a training step's `group_size` rollouts,
or a rescore's stored traces of one task. Each rollout is scored alone first (its group scorers held as None,
`envs.rollout.score`); then every group scorer runs once, in order, given the group's traces that ended normally
(rollout-index order) and returning one number per trace, which it is recorded on. A group scorer that raises, runs
past the scoring timeout or returns anything else leaves each of those traces' score None with the error (stage
`scoring:NAME`) recorded on each, never a 0. A trace that did not end normally is left as it was (unscored).
"""

from __future__ import annotations

from collections.abc import Sequence

from tracegym.core.episode import SOLO, Episode
from tracegym.core.errors import UsageError, classify
from tracegym.core.trace import Trace
from tracegym.envs.multi_agent import is_multi_agent
from tracegym.envs.rollout import record_score, within
from tracegym.envs.scorers import NotApplicable, Scorer
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset
from tracegym.envs.thread_lane import contained, contained_call


def group_scorers(taskset: Taskset) -> list[Scorer]:
    """The taskset's group rewards and metrics, unbound, in order; a UsageError naming the first when the taskset
    is multi-agent (an episode's members are scored by the episode, not as a group of rollouts)."""
    found = sorted((s for s in taskset.scorers if s.group), key=lambda s: s.order)
    if found and is_multi_agent(taskset):
        raise UsageError(f"taskset {taskset.id!r}: group {found[0].kind} {found[0].name!r} on a multi-agent "
                         "taskset; group rewards score the rollouts of a single-agent task")
    return found


def scores_groups(taskset: Taskset) -> bool:
    """True when the taskset has group scorers: its runs keep each task's rollouts together until they are done."""
    return bool(group_scorers(taskset))


async def score_group(taskset: Taskset, traces: Sequence[Trace], timeout: float) -> None:
    """Run the taskset's group scorers over `traces` (the rollouts of one task), recording each one's scores on
    the traces that ended normally; each scorer has `timeout` seconds."""
    scorable = [t for t in sorted(traces, key=lambda t: t.rollout_index) if t.ended_normally]
    if not scorable or not (declared := group_scorers(taskset)):
        return
    try:
        task = contained_call(taskset.task, scorable[0].task)
    except Exception as exc:  # the taskset's code building the Task: every group scorer fails on each trace
        for scorer in declared:
            _record_failure(scorable, scorer, exc)
        return
    try:
        for scorer in (s for s in task.scorers if s.group):
            await _run_one(task, scorer, scorable, timeout)
    finally:
        await contained(task.cleanup())


async def score_solo_group(taskset: Taskset, episodes: Sequence[Episode], timeout: float) -> list[Episode]:
    """`score_group` over the traces of a single-agent task's solo episodes; the episodes remade from them (a solo
    episode's reward is its trace's)."""
    traces = [e.traces[SOLO] for e in episodes]
    await score_group(taskset, traces, timeout)
    return [Episode.solo(t) for t in traces]


async def _run_one(task: Task, scorer: Scorer, traces: list[Trace], timeout: float) -> None:
    stage = f"scoring:{scorer.name}"
    try:
        values = scorer.numbers(await within(stage, task.call_scorer(scorer, traces), timeout), len(traces))
    except NotApplicable:
        for trace in traces:
            _forget(trace, scorer)
        return
    except Exception as exc:  # task code's failure (or timeout) is this scorer's error on every trace it scores
        _record_failure(traces, scorer, exc)
        return
    for trace, value in zip(traces, values, strict=True):
        _record(trace, scorer, value)


def _record_failure(traces: list[Trace], scorer: Scorer, exc: Exception) -> None:
    error = classify(exc, f"scoring:{scorer.name}")
    for trace in traces:
        trace.errors.append(error)
        _record(trace, scorer, None)


def _record(trace: Trace, scorer: Scorer, value: float | None) -> None:
    record_score(trace, scorer.kind, scorer.name, scorer.weight, value)


def _forget(trace: Trace, scorer: Scorer) -> None:
    """A scorer that does not apply to this group (NotApplicable) leaves nothing on its traces."""
    (trace.rewards if scorer.kind == "reward" else trace.metrics).pop(scorer.name, None)
