"""Episode driver: plays one episode of a MultiAgentTask, each member turn through the rollout loop's own steps.

Every member has its own Trace, driven by its own `Rollout` (so a member's model call, its timeout, its tokens,
its tool calls, its stops and the classification of its errors are a rollout's). The driver adds only what an
episode has beyond that: the schedule, the views (before a member acts it is shown the others' public output
since its last turn, attributed, then the referee's `observe` message: its prompt only ever grows, so its turn
N+1 extends its turn N exactly, tokens included), atomic slots (every member of a slot moves, then all moves are
applied; a failed turn applies none, cancels its peers' turns still running and ends the episode with its error;
a move that raises as it is applied undoes the slot's moves before it), bounded move retries and forfeits,
quarantine of malformed markup, settling (unless a member forfeited: the forfeit decided the game) and per-member
scoring.

An episode ends when its schedule is exhausted or the game is over (`completed`), a stop fires, `max_turns`
slots ran, a member's prompt no longer fits (`truncated`; a reply cut by the completion budget is still that
member's move), or an error or timeout; only a normal end is scored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tracegym.core.episode import Episode
from tracegym.core.errors import ErrorKind, TraceError, classify
from tracegym.core.messages import Message, user
from tracegym.core.sampling import Sampling
from tracegym.core.seat_tally import EPISODE_METRICS, FORFEITS, INVALID_MOVES, PARSE_ERRORS
from tracegym.core.timing import Span
from tracegym.core.trace import StopReason, Trace
from tracegym.envs.multi_agent import InvalidMove, MultiAgentTask
from tracegym.envs.rollout import Ended, Rollout, Timeouts, score
from tracegym.envs.schedule import Slot, check_slot
from tracegym.envs.thread_lane import contained
from tracegym.envs.view import Public, attributed, public_text
from tracegym.models.client import ModelClient

T = TypeVar("T")
FORFEIT = object()
"""The move of a member that ran out of retries."""


@dataclass(slots=True)
class _Move:
    member: str
    move: Any
    public: str


class _Reader:
    """Reads the public text of a member's replies, once each as it arrives (a model turn's `malformed` check,
    which flags the reply's node); the last one read is `last`."""

    __slots__ = ("last", "tag")

    def __init__(self, tag: str) -> None:
        self.tag, self.last = tag, Public("", False)

    def __call__(self, reply: Message) -> bool:
        self.last = public_text(reply.text, self.tag)
        return self.last.malformed


class _MemberFailed(Exception):
    """A member's turn failed; its error is on its trace already."""

    def __init__(self, member: str, error: TraceError, cause: BaseException) -> None:
        super().__init__(error.message)
        self.member, self.error, self.cause = member, error, cause


class EpisodeRun:
    """The state of one running episode; `run()` drives it to a finished Episode."""

    def __init__(self, task: MultiAgentTask, clients: Mapping[str, ModelClient], sampling: Sampling,
                 timeouts: Timeouts, episode: Episode) -> None:
        self.task, self.timeouts, self.episode = task, timeouts, episode
        self._t0 = time.monotonic()
        self.rollouts = {m: Rollout(task, clients[m], sampling_for(sampling, episode, m), timeouts,
                                    episode.traces[m], self._t0) for m in episode.members}
        self.inbox: dict[str, list[Message]] = {m: [] for m in episode.members}
        self.readers = {m: _Reader(task.private_tag) for m in episode.members}
        self.slots = 0
        self.stage = "setup"
        self.forfeited = False
        """A member forfeited: the game's outcomes are the forfeit's, and `settle` does not run."""

    async def run(self) -> Episode:
        """Play, settle and score within the rollout timeout (the whole episode's), then clean up."""
        try:
            await asyncio.wait_for(self._play_and_score(), self.timeouts.rollout)
        except TimeoutError:
            self._fail(TraceError(kind=ErrorKind.TIMEOUT, stage="episode",
                                  message=f"episode exceeded {self.timeouts.rollout}s"), StopReason.TIMEOUT)
        except asyncio.CancelledError:
            self._end(StopReason.CANCELLED)
            raise
        finally:
            await self._cleanup()
            self._finish()
        return self.episode

    async def _play_and_score(self) -> None:
        try:
            await contained(self._play())
        except Ended as ended:
            self._end(ended.reason, ended.by)
        except _MemberFailed as failed:
            error = failed.error.model_copy(update={"stage": f"{failed.member}:{failed.error.stage}"})
            self._fail(error, StopReason.after(failed.cause))
        except Exception as exc:  # the task's own hooks (schedule, observe, act, settle): the episode's error
            self._fail(classify(exc, self.stage, self.slots), StopReason.after(exc))
        if self.episode.ended_normally:
            await self._score()

    # --- playing -----------------------------------------------------------------------------------------
    async def _play(self) -> None:
        first = self.rollouts[self.episode.members[0]]
        await first.timed("setup", self.task.setup(), self.timeouts.setup)
        for member, rollout in self.rollouts.items():
            for message in self.task.opening(member):
                rollout.trace.graph.add(message)
            rollout.trace.prompt_length = len(rollout.trace.graph.nodes)
            for name in EPISODE_METRICS:
                rollout.count(name, 0)
        slots = iter(self._call("schedule", self.task.schedule))
        while not self.task.over:
            slot = self._call("schedule", next, slots, None)
            if slot is None:
                break
            if self.slots >= self.task.max_turns:
                raise Ended(StopReason.MAX_TURNS)
            check_slot(slot, self.episode.members)
            await self._slot(slot)
            self.slots += 1
        if not self.forfeited:  # a forfeit decided the game: settling would overwrite its outcomes
            self._call("settle", self.task.settle)
        raise Ended(StopReason.COMPLETED)

    async def _slot(self, slot: Slot) -> None:
        """Every member of the slot moves on the views as they were before it; then, only if all moved, their
        moves are applied in seat order (all or none) and their public output reaches the others' views."""
        if slot.simultaneous:
            moves = await self._together(slot.members)
        else:
            moves = [await self._turn(slot.members[0])]
        self._apply(moves)
        for done in moves:
            if done.move is FORFEIT:
                self.rollouts[done.member].count(FORFEITS, 1)
            if self.task.public_outputs:
                said = attributed(done.member, done.public)  # one message, shared by every other view
                for other in self.episode.members:
                    if other != done.member:
                        self.inbox[other].append(said)
        for member in slot.members:
            await self.rollouts[member].check_stops()

    def _apply(self, moves: list[_Move]) -> None:
        """Apply the slot's moves in seat order, all or none: when one raises, the task is restored to its
        snapshot from before the first (a slot of one move takes none: nothing was applied before it)."""
        saved = self._call("snapshot", self.task.snapshot) if len(moves) > 1 else None
        try:
            for done in moves:
                if done.move is FORFEIT:
                    self._call(f"forfeit:{done.member}", self.task.forfeit, done.member)
                    self.forfeited = True
                else:
                    self._call(f"act:{done.member}", self.task.act, done.member, done.move)
        except Exception:
            if saved is not None:
                failed_at = self.stage
                self._call("restore", self.task.restore, saved)  # a restore that fails is the episode's error
                self.stage = failed_at
            raise

    async def _together(self, members: tuple[str, ...]) -> list[_Move]:
        """The turns of a simultaneous slot, taken at once; their moves in seat order. The first turn to end the
        episode (a member's failure, a prompt that no longer fits) cancels the others' at once: nothing of the
        slot is applied, so their replies would be thrown away. A cancelled member's trace ends `cancelled`, by
        that member (the episode's error is the other's; the cancelled call's span is on the trace)."""
        turns: dict[str, asyncio.Task[_Move]] = {}
        try:
            async with asyncio.TaskGroup() as group:  # a turn that raises cancels its peers, and only them
                for member in members:
                    turns[member] = group.create_task(self._turn(member))
        except BaseExceptionGroup as ended:  # a turn's Ended or _MemberFailed; the first raised comes first
            first = ended.exceptions[0]
            by = next(m for m, t in turns.items() if t.done() and not t.cancelled() and t.exception() is first)
            for member, turn in turns.items():
                if turn.cancelled():
                    self.rollouts[member].end(StopReason.CANCELLED, by)
            raise first from None
        order = self.episode.members.index
        return sorted((turn.result() for turn in turns.values()), key=lambda done: order(done.member))

    async def _turn(self, member: str) -> _Move:
        """`member` sees what is new in its view, then replies until its move is valid (or it forfeits)."""
        rollout = self.rollouts[member]
        rollout.turn = self.slots
        try:
            self._deliver(member)
            for attempt in range(self.task.move_retries + 1):
                public = await self._reply(rollout, self.readers[member])
                if public.malformed:
                    rollout.count(PARSE_ERRORS, 1)
                try:
                    return _Move(member, self.task.move(member, public.text), public.text)
                except InvalidMove as invalid:
                    rollout.count(INVALID_MOVES, 1)
                    if attempt == self.task.move_retries:
                        return _Move(member, FORFEIT, public.text)
                    rollout.trace.graph.add(user(f"Invalid move: {invalid} Try again."))
        except (Ended, _MemberFailed):
            raise
        except Exception as exc:  # this member's model call, tool step or hook: recorded on its trace
            rollout.error_from(exc, rollout.stage)
            raise _MemberFailed(member, rollout.trace.errors[-1], exc) from exc
        raise AssertionError("unreachable")

    async def _reply(self, rollout: Rollout, reader: _Reader) -> Public:
        """One model turn of a member, with its tool calls answered (at most `tool_rounds` rounds of them): the
        public part of its last reply, read once as the reply arrives (it also flags the reply's node)."""
        reply = await rollout.model_turn(reader, length_ends=False)
        for _ in range(self.task.tool_rounds):
            if not reply.tool_calls:
                break
            await rollout.run_tools(reply.tool_calls)
            reply = await rollout.model_turn(reader, length_ends=False)
        return reader.last

    def _deliver(self, member: str) -> None:
        """Append what `member` has not yet seen: the others' public output, then the referee's message."""
        graph = self.rollouts[member].trace.graph
        for message in self.inbox[member]:
            graph.add(message)
        self.inbox[member].clear()
        self.stage = f"observe:{member}"
        told = self.task.observe(member)
        if told:
            graph.add(user(told))

    def _call(self, stage: str, fn: Callable[..., T], *args: Any) -> T:
        """Run a hook of the task, its failure recorded at `stage`."""
        self.stage = stage
        return fn(*args)

    # --- ending ------------------------------------------------------------------------------------------
    async def _score(self) -> None:
        for rollout in self.rollouts.values():
            start = rollout.now()
            await score(self.task, rollout.trace, self.timeouts.scoring, turn=rollout.turn)
            rollout.trace.spans.append(Span(name="scoring", start=start, end=rollout.now()))

    def _end(self, reason: StopReason, by: str | None = None) -> None:
        if self.episode.stop_reason is None:
            self.episode.stop_reason = reason
            for rollout in self.rollouts.values():
                rollout.end(reason, by)

    def _fail(self, error: TraceError, reason: StopReason) -> None:
        if self.episode.error is None:
            self.episode.error = error
        for rollout in self.rollouts.values():
            if not rollout.trace.errors:  # the failing member's own error is on its trace already
                rollout.trace.errors.append(error.model_copy(update={"stage": f"episode:{error.stage}"}))
        self._end(reason)

    async def _cleanup(self) -> None:
        try:
            await asyncio.wait_for(contained(self.task.cleanup()), self.timeouts.setup)
        except Exception as exc:  # cleanup runs in a finally: its failure is recorded, never raised
            self.rollouts[self.episode.members[0]].error_from(exc, "cleanup")

    def _finish(self) -> None:
        """Copy the per-member results onto the episode record (unscored when it did not end normally)."""
        episode = self.episode
        for member, rollout in self.rollouts.items():
            if not episode.ended_normally:
                rollout.mark_unscored()
            trace = rollout.trace
            trace.spans.append(Span(name="total", start=0.0, end=rollout.now()))
            episode.rewards[member] = trace.reward
            episode.member_metrics[member] = dict(trace.metrics)
        episode.outcomes = dict(self.task.outcomes) if episode.ended_normally else {}
        episode.metrics["slots"] = self.slots
        for name in EPISODE_METRICS:
            episode.metrics[name] = sum(r.trace.metrics.get(name) or 0 for r in self.rollouts.values())


def sampling_for(sampling: Sampling, episode: Episode, member: str) -> Sampling:
    """A member's sampling: with a seed, member p of episode i samples with seed + i * members + p (every
    member of every episode its own stream, reproducible)."""
    if sampling.seed is None:
        return sampling
    offset = episode.episode_index * len(episode.members) + episode.members.index(member)
    return sampling.model_copy(update={"seed": sampling.seed + offset}) if offset else sampling




async def play(task: MultiAgentTask, clients: Mapping[str, ModelClient], sampling: Sampling | None = None, *,
               episode_index: int = 0, trainable: Mapping[str, bool] | None = None,
               timeouts: Timeouts | None = None) -> Episode:
    """Play one episode of `task`, member m's turns answered by `clients[m]`; never raises for a member's or
    the task's failure (it is the episode's error)."""
    sampling = sampling or Sampling()
    episode = Episode(task=task.data, taskset=task.taskset_id, episode_index=episode_index, members=task.members,
                      trainable=dict(trainable or {m: task.member(m).trainable for m in task.members}),
                      models={m: clients[m].name for m in task.members})
    episode.traces = {m: Trace(task=task.data, taskset=task.taskset_id, rollout_index=episode_index,
                               model=clients[m].name, sampling=sampling_for(sampling, episode, m).model_dump(
                                   mode="json"), member=m, episode_id=episode.id) for m in task.members}
    return await EpisodeRun(task, clients, sampling, timeouts or Timeouts(), episode).run()

