"""Rescore: recompute rewards and metrics of stored traces with the current taskset code, without the model.

Each trace gets a fresh Task. Tasks that keep state in an environment instance (class-based environments)
have it rebuilt by replay: `setup` (reset with the task's fields), then every answered tool call of the trace's
main branch again, in order, each through the rollout loop's own tool step; each answer is compared with the
one the model saw. A replay that answers differently (a random game, a clock, a tool whose code changed) rebuilt
some other state: the trace is reported as diverged and left unscored, with the first differing call recorded
as an error at stage `rescore`, never scored on that other state. Rewards and metrics computed by scorers are
replaced; the loop's own counts (tool calls, tool errors) and the trace's other errors are kept. A trace that
did not end normally (an error, a timeout, a cancel) stays unscored, as it was. The taskset's group rewards
(`envs.group_scoring`) then score each task's rescored traces together: every stored rollout of a task is its group.

An episode of a multi-agent taskset is rescored by replay too: the episode driver runs again with each member's
model answering from that member's stored replies (`Replay`), so the referee's current code rebuilds the game and
the scorers score it; a replay asked for a turn on a view the stored trace does not have diverged.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from typing import cast

from pydantic import BaseModel

from tracegym.core.episode import Episode
from tracegym.core.errors import ErrorKind, TaskError, TraceError
from tracegym.core.messages import ImagePart, Message, ToolCall, tool
from tracegym.core.sampling import Sampling
from tracegym.core.trace import RewardScore, Trace
from tracegym.envs.environment import EnvironmentTask
from tracegym.envs.episode import play
from tracegym.envs.evaluate import CONCURRENCY
from tracegym.envs.group_scoring import score_group, scores_groups
from tracegym.envs.multi_agent import MultiAgentTask
from tracegym.envs.rollout import LOOP_METRICS, Rollout, Timeouts, score, within
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset
from tracegym.envs.thread_lane import contained
from tracegym.models.client import ModelRequest, ModelResponse

SHOWN = 80
"""Characters of a stored or replayed answer kept in a divergence record."""


class Divergence(BaseModel):
    """A trace whose replay answered a tool call differently from the stored trace: where it first differed."""

    task_key: str
    rollout_index: int
    call: int
    """Position of the differing call among the trace's answered tool calls, from 1."""
    tool: str
    stored: str
    """The answer the model saw in the rollout (shortened to `SHOWN` characters)."""
    replayed: str
    """The answer the replay got (shortened the same way)."""

    def describe(self) -> str:
        """One line: the trace and the call that differed, with both answers."""
        return f"{self.task_key} #{self.rollout_index}: {self.call_differed()}"

    def call_differed(self) -> str:
        """The call that differed, with both answers."""
        return f"tool call {self.call} ({self.tool}): stored {self.stored!r}, replayed {self.replayed!r}"


class Rescored(BaseModel):
    """Every trace rescored, in the order given, and the ones whose replay diverged (left unscored)."""

    traces: list[Trace]
    diverged: list[Divergence]


async def rescore_trace(taskset: Taskset, trace: Trace, timeouts: Timeouts) -> Trace:
    """A copy of `trace` scored by the taskset's current scorers (unscored when its replay diverged); alone, outside
    its group, its group rewards are None (`rescore` scores groups)."""
    new, _ = await _rescore(taskset, trace, timeouts)
    return new


async def rescore(taskset: Taskset, traces: list[Trace], timeouts: Timeouts,
                  concurrency: int = CONCURRENCY) -> Rescored:
    """Every trace rescored, in the same order, `concurrency` at a time, with the divergences found."""
    gate = asyncio.Semaphore(concurrency)

    async def one(trace: Trace) -> tuple[Trace, Divergence | None]:
        async with gate:
            return await _rescore(taskset, trace, timeouts)

    done = await asyncio.gather(*(one(t) for t in traces))
    await _score_groups(taskset, [t for t, d in done if d is None and not _failed_rescore(t)], timeouts, gate)
    return Rescored(traces=[t for t, _ in done], diverged=[d for _, d in done if d is not None])


async def _score_groups(taskset: Taskset, traces: list[Trace], timeouts: Timeouts, gate: asyncio.Semaphore) -> None:
    """The taskset's group scorers over each task's rescored traces (every stored rollout of the task is its
    group), once they are all rescored alone."""
    if not scores_groups(taskset):
        return
    groups: dict[str, list[Trace]] = {}
    for trace in traces:
        groups.setdefault(trace.task_key, []).append(trace)

    async def one(group: list[Trace]) -> None:
        async with gate:
            await score_group(taskset, group, timeouts.scoring)

    await asyncio.gather(*(one(g) for g in groups.values()))


def _failed_rescore(trace: Trace) -> bool:
    """True when rescoring this trace failed before its scorers ran (its Task could not be built or replayed)."""
    return any(e.stage == "rescore" for e in trace.errors)


async def _rescore(taskset: Taskset, trace: Trace, timeouts: Timeouts) -> tuple[Trace, Divergence | None]:
    new = trace.model_copy(deep=True)
    new.rewards = {}
    new.metrics = {k: v for k, v in trace.metrics.items() if k in LOOP_METRICS}
    new.errors = [e for e in trace.errors if not e.stage.startswith(("scoring:", "rescore"))]
    new.judgments = []  # the judges of this scoring record their own calls
    try:
        task = taskset.task(new.task)
    except Exception as exc:  # the taskset's code building this Task: its error is this trace's, the rest go on
        new.errors.append(TraceError(kind=ErrorKind.TASK, stage="rescore", message=f"{type(exc).__name__}: {exc}"))
        return new, None
    if not trace.ended_normally:
        _mark_unscored(task, new)
        return new, None
    divergence = None
    try:
        divergence = await _replay(task, new, timeouts)  # setup and every tool call carry their own timeouts
        if divergence is None:
            await score(task, new, timeouts.scoring)
        else:
            new.errors.append(TraceError(kind=ErrorKind.TASK, stage="rescore", message=(
                f"replay diverged at {divergence.call_differed()}; left unscored")))
            _mark_unscored(task, new)
    except Exception as exc:  # task code (setup, tools, scorers) failing is this trace's error, not the rescore's
        new.errors.append(TraceError(kind=ErrorKind.TASK, stage="rescore", message=f"{type(exc).__name__}: {exc}"))
    finally:
        await contained(task.cleanup())
    return new, divergence


async def _replay(task: Task, trace: Trace, timeouts: Timeouts) -> Divergence | None:
    """Rebuild an environment's state (others need nothing): setup, then the trace's answered tool calls in order
    through the loop's own tool step (same argument checks, error texts and timeouts as the rollout), stopping at
    the first answer that differs from the stored one."""
    if not isinstance(task, EnvironmentTask):
        return None
    await within("setup", contained(task.setup()), timeouts.setup)
    # a scratch rollout: its trace takes the replay's spans and counts, the model is never called
    steps = Rollout(task, NoModel(), Sampling(), timeouts, Trace(task=task.data))
    for position, (call, stored) in enumerate(_answered_calls(trace), start=1):
        replayed = compared(tool(await steps.run_tool(call), call.id))
        if replayed != stored:
            return Divergence(task_key=trace.task_key, rollout_index=trace.rollout_index, call=position,
                              tool=call.name, stored=_short(stored), replayed=_short(replayed))
    return None


class NoModel:
    """The model client of a replay, which runs tools only: asking it for a turn is a bug."""

    name = "replay"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("a replay never calls the model")

    async def aclose(self) -> None:
        return None


def _answered_calls(trace: Trace) -> list[tuple[ToolCall, str]]:
    """Each tool call on the trace's main branch with the answer the model saw: the tool messages right after its
    assistant message, in call order. A call with no answer never ran in the rollout, so it is not replayed."""
    messages = trace.messages
    pairs: list[tuple[ToolCall, str]] = []
    for i, message in enumerate(messages):
        answers = itertools.takewhile(lambda m: m.role == "tool", messages[i + 1:])
        pairs.extend(zip(message.tool_calls, (compared(m) for m in answers), strict=False))
    return pairs


def compared(answer: Message) -> str:
    """What a tool's stored and replayed answers are compared on: the text, then each image by the hash of its
    URL (a data URI read back from the run folder is the one the rollout made)."""
    images = [hashlib.sha256(p.image_url.get("url", "").encode()).hexdigest()[:16] for p in answer.content or ()
              if isinstance(p, ImagePart)]
    return answer.text + "".join(f"[image {digest}]" for digest in images)


def _mark_unscored(task: Task, trace: Trace) -> None:
    for scorer in task.scorers:
        if scorer.kind == "reward":
            trace.rewards[scorer.name] = RewardScore(score=None, weight=scorer.weight)
        elif scorer.kind == "metric":
            trace.metrics[scorer.name] = None


def _short(text: str) -> str:
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


# --- episodes ----------------------------------------------------------------------------------------------
class Diverged(TaskError):
    """A replayed episode asked a member for a turn on a view its stored trace does not have (the referee's code
    changed): it cannot be rescored on its stored replies."""


class Replay:
    """A member's model in a rescore: each call is answered with the member's stored reply, in order, once the
    view it is asked on is checked to be the stored one."""

    def __init__(self, trace: Trace) -> None:
        self.trace, self.name = trace, trace.model
        self.messages = trace.messages

    async def complete(self, request: ModelRequest) -> ModelResponse:
        at = len(request.messages)
        if self.messages[:at] != request.messages or at >= len(self.messages) or (
                self.messages[at].role != "assistant"):
            raise Diverged(f"member {self.trace.member!r}: the replay asked for turn {at} on a view its stored "
                           "trace does not have")
        return ModelResponse(self.messages[at], finish_reason="stop")

    async def aclose(self) -> None:
        return None


async def rescore_episode(taskset: Taskset, episode: Episode, timeouts: Timeouts) -> Episode:
    """A copy of `episode` whose rewards, outcomes and metrics are the taskset's current code's, found by replaying
    its members' stored replies through the episode driver (no model is called); its traces keep their tokens.
    One that did not end normally is left as it was; one whose replay diverged is left unscored, its error at
    stage `rescore`."""
    new = episode.model_copy(deep=True)
    if not episode.ended_normally or set(episode.traces) != set(episode.members):
        return new
    try:
        task = cast(MultiAgentTask, taskset.task(episode.task))  # an episode's taskset is multi-agent
        replayed = await play(task, {m: Replay(t) for m, t in episode.traces.items()},
                              episode_index=episode.episode_index, trainable=episode.trainable, timeouts=timeouts)
    except Exception as exc:  # building the task failed: this episode's error, the others go on
        replayed = None
        new.error = TraceError(kind=ErrorKind.TASK, stage="rescore", message=f"{type(exc).__name__}: {exc}")
    if replayed is not None and replayed.error is not None:
        new.error = replayed.error.model_copy(update={"stage": f"rescore:{replayed.error.stage}"})
    scored = replayed if replayed is not None and replayed.error is None else None
    new.rewards = {m: scored.rewards.get(m) if scored else None for m in new.members}
    new.outcomes = dict(scored.outcomes) if scored else {}
    new.metrics = dict(scored.metrics) if scored else new.metrics
    for member, trace in new.traces.items():
        again = scored.traces[member] if scored else None
        trace.rewards = dict(again.rewards) if again else {k: RewardScore(score=None, weight=r.weight)
                                                           for k, r in trace.rewards.items()}
        trace.metrics = dict(again.metrics) if again else {k: None for k in trace.metrics}
        trace.judgments = list(again.judgments) if again else []
        new.member_metrics[member] = dict(trace.metrics)
    return new


async def rescore_episodes(taskset: Taskset, episodes: list[Episode], timeouts: Timeouts,
                           concurrency: int = CONCURRENCY) -> list[Episode]:
    """Every episode rescored, in the same order, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(episode: Episode) -> Episode:
        async with gate:
            return await rescore_episode(taskset, episode, timeouts)

    return list(await asyncio.gather(*(one(e) for e in episodes)))
