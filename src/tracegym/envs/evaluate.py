"""Evaluate: the in-process way to run rollouts of a taskset: one rollout, a group, or many with bounded concurrency.

Every run of a task is an Episode: `run_episode`, `evaluate_episodes_iter` and `evaluate_episodes` run any taskset
(a single-agent rollout is the episode of one member, `Episode.solo`; a multi-agent one binds its members by
`seats`), and every run folder and training step takes their episodes. For a single-agent taskset the same runs
also come as bare traces: `run_rollout` runs one, `run_group` the rollouts of one task, `evaluate_iter` yields traces
as they finish and `evaluate` returns them in task order. `serve.env_client.EnvClient` has the same functions, with
the same arguments, run on an env server instead: swap the one object to move rollouts out of process.
None of them raises for a rollout that failed: it is a trace with errors, and its siblings go on. A rollout that
ended on an infrastructure error (endpoint down) is rerun with a fresh Task up to `infra_retries` times.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack, cast

from tracegym.core.episode import SOLO, Episode
from tracegym.core.errors import ErrorKind, UsageError, classify
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason, Trace
from tracegym.envs.episode import play
from tracegym.envs.group_scoring import score_group, score_solo_group, scores_groups
from tracegym.envs.multi_agent import MultiAgentTask, is_multi_agent
from tracegym.envs.registry import load_taskset
from tracegym.envs.rollout import Timeouts, rollout
from tracegym.envs.schedule import Member
from tracegym.envs.scripted_seat import check_scripts, with_scripts
from tracegym.envs.seats import Seat, Seats, bind
from tracegym.envs.task_sandbox import check_taskset_async
from tracegym.envs.taskset import Taskset
from tracegym.envs.thread_lane import contained_call
from tracegym.models.client import ModelClient
from tracegym.models.connect import make_client
from tracegym.models.endpoint import Endpoint

X = TypeVar("X")
R = TypeVar("R")

INFRA_RETRIES = 1
"""Default reruns of a rollout that ended on an infrastructure error (here, in an env server's `run`, in eval)."""

CONCURRENCY = 32
"""Default number of rollouts an evaluation runs at once (here, on an env client, in `tracegym eval`)."""


class RolloutOptions(TypedDict, total=False):
    """How each rollout runs: keywords every run function takes, in process or through an env client."""

    sampling: Sampling | None
    """Sampling parameters (default `Sampling()`); rollout i of a seeded group samples with seed + i."""
    timeouts: Timeouts | None
    """Seconds each stage may take (default `Timeouts()`)."""
    infra_retries: int
    """Reruns of a rollout that ended on an infrastructure error, each with a fresh Task (default `INFRA_RETRIES`)."""


class EvaluateOptions(RolloutOptions, total=False):
    """What `evaluate` and `evaluate_iter` run, and how many at once; see `plan` for the defaults."""

    num_tasks: int | None
    """Only the first `num_tasks` tasks (an infinite taskset needs it unless `pairs` is given)."""
    rollouts: int
    """Rollouts per task (default 1)."""
    concurrency: int
    """Rollouts running at once, at most (default `CONCURRENCY`)."""
    pairs: Iterable[tuple[TaskData, int]] | None
    """(task, rollout index) pairs to run instead of every task x `rollouts`: e.g. what a resumed run lacks."""


ModelArg = ModelClient | Endpoint
"""A live model client, or an Endpoint that a client is made from for the call and closed after it."""


async def run_rollout(taskset: Taskset, data: TaskData, model: ModelArg, *, rollout_index: int = 0,
                      **options: Unpack[RolloutOptions]) -> Trace:
    """One rollout of one task, rerun on infrastructure errors at most `infra_retries` times; never raises for
    the rollout (a misspelt option is a UsageError)."""
    check_options(options)
    check_single_agent(taskset)
    sampling, timeouts = options.get("sampling"), options.get("timeouts")
    infra_retries = options.get("infra_retries", INFRA_RETRIES)
    async with live(model) as client:
        for attempt in range(infra_retries + 1):
            try:
                task = contained_call(taskset.task, data)
                trace = await rollout(task, client, sampling, rollout_index=rollout_index, timeouts=timeouts)
            except Exception as exc:  # the one boundary around a rollout: a row the taskset cannot build a Task
                # from, or a bug in the loop, fails this rollout only (evaluate and the env worker wait for a trace)
                return failed_trace(data, taskset.id, rollout_index, exc)
            if not trace.has_error(ErrorKind.INFRASTRUCTURE) or attempt == infra_retries:
                return trace
    raise AssertionError("unreachable")


async def run_group(taskset: Taskset, data: TaskData, model: ModelArg, rollouts: int,
                    **options: Unpack[RolloutOptions]) -> list[Trace]:
    """`rollouts` rollouts of one task, concurrently; traces in rollout-index order."""
    check_options(options)
    check_single_agent(taskset)
    async with live(model) as client:
        traces = list(await asyncio.gather(
            *(run_rollout(taskset, data, client, rollout_index=i, **options) for i in range(rollouts))))
    await score_group(taskset, traces, scoring_timeout(options.get("timeouts")))
    return traces


async def evaluate_iter(taskset: str | Taskset, model: ModelArg,
                        **options: Unpack[EvaluateOptions]) -> AsyncIterator[Trace]:
    """Yield traces as they finish, each task's rollouts in turn (`evaluate_episodes_iter`'s solo episodes, as
    traces); tasks are read lazily."""
    ts = load_taskset(taskset)
    check_single_agent(ts)
    async for episode in evaluate_episodes_iter(ts, model, **options):
        yield episode.traces[SOLO]


async def evaluate(taskset: str | Taskset, model: ModelArg, **options: Unpack[EvaluateOptions]) -> list[Trace]:
    """Every planned rollout (default: `rollouts` of each of the first `num_tasks` tasks); traces in task order,
    then rollout index."""
    return await in_task_order(evaluate_iter, taskset, model, options)


async def run_episode(taskset: Taskset, data: TaskData, model: ModelArg, *, episode_index: int = 0,
                      seats: Seats | None = None, **options: Unpack[RolloutOptions]) -> Episode:
    """One episode of a task: every member plays as `model` unless `seats` binds it elsewhere (a single-agent
    task's one member, `SOLO`, always does: its rollout as `Episode.solo`); rerun on an infrastructure error at
    most `infra_retries` times; never raises for the episode (a seat the taskset has not, or a misspelt option, is a
    UsageError)."""
    check_options(options)
    if not is_multi_agent(taskset):
        bind([], seats, taskset.id)
        return Episode.solo(await run_rollout(taskset, data, model, rollout_index=episode_index, **options))
    members = multi_agent_class(taskset).seats
    bound = bind(members, seats, taskset.id)
    check_scripts(multi_agent_class(taskset), bound)
    trainable = {m.id: bound[m.id].trains(m) for m in members}
    infra_retries = options.get("infra_retries", INFRA_RETRIES)
    sampling = options.get("sampling")
    async with live_seats(model, bound) as clients:
        for attempt in range(infra_retries + 1):
            try:
                task = cast(MultiAgentTask, contained_call(taskset.task, data))  # multi_agent_class checked it
                players = with_scripts(task, clients, bound, sampling.seed if sampling else None, episode_index)
                episode = await play(task, players, sampling, episode_index=episode_index,
                                     trainable=trainable, timeouts=options.get("timeouts"))
            except Exception as exc:  # the boundary around an episode, as around a rollout
                return failed_episode(taskset.id, members_of(taskset), data, episode_index, exc)
            failed_on_infra = episode.error is not None and episode.error.kind == ErrorKind.INFRASTRUCTURE
            if not failed_on_infra or attempt == infra_retries:
                return episode
    raise AssertionError("unreachable")


async def evaluate_episodes_iter(taskset: str | Taskset, model: ModelArg, *, seats: Seats | None = None,
                                 **options: Unpack[EvaluateOptions]) -> AsyncIterator[Episode]:
    """Yield episodes as they finish (`rollouts` per task: episode indices 0..rollouts-1; `pairs`: (task,
    episode index) pairs)."""
    work = plan(taskset, **options)
    bound = bind(seats_of(work.taskset), seats, work.taskset.id)  # a bad seat fails before any episode
    if is_multi_agent(work.taskset):
        check_scripts(multi_agent_class(work.taskset), bound)  # so does a script the game cannot play
    await check_taskset_async(work.taskset)  # so does a sandbox this host cannot run as asked
    async with live(model) as client:
        async def one(pair: tuple[TaskData, int]) -> Episode:
            return await run_episode(work.taskset, pair[0], client, episode_index=pair[1], seats=seats,
                                     **work.options)

        if not scores_groups(work.taskset):
            async for episode in as_finished(work.pairs, one, work.concurrency):
                yield episode
            return

        async def group(pairs: list[tuple[TaskData, int]]) -> list[Episode]:  # held until its group scorers ran
            done = await asyncio.gather(*(one(pair) for pair in pairs))
            return await score_solo_group(work.taskset, done, scoring_timeout(work.options.get("timeouts")))

        async for episodes in as_finished(same_task_runs(work.pairs), group, work.concurrency, size=len):
            for episode in episodes:
                yield episode


async def evaluate_episodes(taskset: str | Taskset, model: ModelArg, *, seats: Seats | None = None,
                            **options: Unpack[EvaluateOptions]) -> list[Episode]:
    """Every planned episode, in task order, then episode index."""
    return await in_order(evaluate_episodes_iter, taskset, model, options, seats=seats)


def multi_agent_class(taskset: Taskset) -> type[MultiAgentTask]:
    """The taskset's MultiAgentTask class; a UsageError when its tasks are single-agent."""
    if not is_multi_agent(taskset):
        raise UsageError(f"taskset {taskset.id!r} is single-agent: run rollouts (run_rollout, evaluate), not "
                         "episodes")
    return cast("type[MultiAgentTask]", taskset.task_class)


def seats_of(taskset: Taskset) -> list[Member]:
    """The members a seat binding may name: a multi-agent taskset's, in seat order; none for a single-agent one."""
    return list(multi_agent_class(taskset).seats) if is_multi_agent(taskset) else []


def members_of(taskset: Taskset) -> list[str]:
    """The member ids of the taskset's episodes in seat order (`[SOLO]` for a single-agent taskset)."""
    return [m.id for m in seats_of(taskset)] or [SOLO]


def check_single_agent(taskset: Taskset) -> None:
    """A UsageError when the taskset is multi-agent (its tasks run as episodes)."""
    if is_multi_agent(taskset):
        raise UsageError(f"taskset {taskset.id!r} is multi-agent: run episodes (run_episode, evaluate_episodes), "
                         "not rollouts")


@contextlib.asynccontextmanager
async def live_seats(model: ModelArg, seats: Mapping[str, Seat]) -> AsyncIterator[dict[str, ModelClient]]:
    """Each member's live client: the policy's (`model`), or its seat's (one client per distinct endpoint)."""
    if not isinstance(model, Endpoint) and all(seat.model is None for seat in seats.values()):
        yield dict.fromkeys(seats, model)  # every member plays as the caller's own client: nothing to open or close
        return
    async with contextlib.AsyncExitStack() as stack:
        policy = await stack.enter_async_context(live(model))
        made: dict[Any, ModelClient] = {}
        clients = {}
        for member, seat in seats.items():
            if seat.model is None:
                clients[member] = policy
                continue
            key = seat.model if isinstance(seat.model, Endpoint) else id(seat.model)
            if key not in made:
                made[key] = await stack.enter_async_context(live(seat.model))
            clients[member] = made[key]
        yield clients


def failed_episode(taskset_id: str, members: list[str], data: TaskData, episode_index: int, exc: BaseException, *,
                   stage: str = "setup", kind: ErrorKind = ErrorKind.TASK) -> Episode:
    """The record of an episode of `members` that produced none of its own (its Task could not be built, its
    env-server request failed): `exc` recorded at `stage`, with a failed trace per member."""
    if members == [SOLO]:
        return Episode.solo(failed_trace(data, taskset_id, episode_index, exc, stage=stage, kind=kind))
    error = classify(exc, stage, kind=kind)
    episode = Episode(task=data, taskset=taskset_id, episode_index=episode_index, members=members,
                      stop_reason=StopReason.after(error), error=error)
    for member in members:
        trace = failed_trace(data, taskset_id, episode_index, exc, stage=stage, kind=kind)
        episode.traces[member] = trace.model_copy(update={"member": member, "episode_id": episode.id})
        episode.rewards[member] = None
    return episode


# --- shared with the env client ----------------------------------------------------------------------------
@dataclass
class Plan:
    """What an evaluation runs: its taskset, the (task, rollout index) pairs (drawn lazily), how many at once,
    and the options of each rollout."""

    taskset: Taskset
    pairs: Iterator[tuple[TaskData, int]]
    concurrency: int
    options: RolloutOptions


def plan(taskset: str | Taskset, *, num_tasks: int | None = None, rollouts: int = 1, concurrency: int = CONCURRENCY,
         pairs: Iterable[tuple[TaskData, int]] | None = None, **options: Unpack[RolloutOptions]) -> Plan:
    """The evaluation `evaluate_iter` runs (in process or on an env server), with the defaults of its options."""
    check_options(options, EvaluateOptions.__optional_keys__)  # the others are this function's own arguments
    ts = bounded_taskset(taskset, num_tasks, need_bound=pairs is None)
    if pairs is None:
        pairs = ((d, i) for d in ts for i in range(rollouts))
    return Plan(ts, iter(pairs), concurrency, options)


def same_task_runs(pairs: Iterable[tuple[TaskData, int]], most: int | None = None,
                   ) -> Iterator[list[tuple[TaskData, int]]]:
    """Consecutive (task, rollout index) pairs of the same task, in runs of at most `most` (None: a task's whole
    run, its group), drawn lazily."""
    run: list[tuple[TaskData, int]] = []
    for pair in pairs:
        if run and ((most is not None and len(run) >= most) or not (pair[0] is run[0][0] or pair[0] == run[0][0])):
            yield run
            run = []
        run.append(pair)
    if run:
        yield run


def scoring_timeout(timeouts: Timeouts | None) -> float:
    """Seconds each scorer (a group scorer too) may take under these timeouts (None: the defaults)."""
    return (timeouts or Timeouts()).scoring


def check_options(options: Mapping[str, object], known: Collection[str] = RolloutOptions.__optional_keys__) -> None:
    """A UsageError naming the first of `options` that is not `known` (a misspelt keyword of a run function, in
    process or on an env client), and listing the known ones."""
    if unknown := sorted(options.keys() - set(known)):
        raise UsageError(f"unknown option {unknown[0]!r} (options: {', '.join(sorted(known))})")


async def in_task_order(evaluate_iter: Callable[..., AsyncIterator[Trace]], taskset: str | Taskset, model: Any,
                        options: EvaluateOptions) -> list[Trace]:
    """What `evaluate` returns, from either `evaluate_iter`: every trace, in the order of the planned pairs'
    tasks, then rollout index."""
    return await in_order(evaluate_iter, taskset, model, options)


async def in_order(evaluate_iter: Callable[..., AsyncIterator[Any]], taskset: str | Taskset, model: Any,
                   options: EvaluateOptions, **more: Any) -> list[Any]:
    """Every trace (or episode) `evaluate_iter` yields, in the order of the planned pairs' tasks, then rollout
    (episode) index; `more`: its own further keywords (an episode's `seats`)."""
    work = plan(taskset, **options)
    pairs = list(work.pairs)
    done = [t async for t in evaluate_iter(work.taskset, model, concurrency=work.concurrency, pairs=pairs,
                                           **work.options, **more)]
    position = {d.key: n for n, (d, _) in reversed(list(enumerate(pairs)))}
    return sorted(done, key=lambda t: (position.get(t.task_key, 0), _index(t)))


def _index(item: Trace | Episode) -> int:
    return item.rollout_index if isinstance(item, Trace) else item.episode_index


def failed_trace(data: TaskData, taskset_id: str, rollout_index: int, exc: BaseException, *,
                 stage: str = "setup", kind: ErrorKind = ErrorKind.TASK) -> Trace:
    """The trace of a rollout that produced none of its own (its Task could not be built, its env-server request
    failed): `exc` recorded at `stage` (`classify`: of its own kind when it is a tracegym error, else of `kind`)."""
    error = classify(exc, stage, kind=kind)
    return Trace(task=data, taskset=taskset_id, rollout_index=rollout_index, errors=[error],
                 stop_reason=StopReason.after(error))


def bounded_taskset(taskset: str | Taskset, num_tasks: int | None, need_bound: bool = True) -> Taskset:
    """The taskset, cut to its first `num_tasks`; an infinite one without a bound is a UsageError."""
    ts = load_taskset(taskset)
    if num_tasks is not None:
        return ts.head(num_tasks)
    if need_bound and not ts.bounded:
        raise UsageError(f"taskset {ts.id!r} is infinite: give num_tasks")
    return ts


@contextlib.asynccontextmanager
async def live(model: ModelArg) -> AsyncIterator[ModelClient]:
    """`model` itself, or a client made from an Endpoint and closed on exit (a client given stays the caller's)."""
    if not isinstance(model, Endpoint):
        yield model
        return
    client = make_client(model)
    try:
        yield client
    finally:
        await client.aclose()


async def as_finished(items: Iterator[X], run: Callable[[X], Awaitable[R]], concurrency: int,
                      size: Callable[[X], int] | None = None) -> AsyncIterator[R]:
    """`run(item)` for every item, results yielded as they finish, the items running at once taking at most
    `concurrency` in all: each takes `size(item)` (default 1; a group of rollouts takes its length), and one
    item always runs even if it is bigger. Items are drawn lazily (one ahead); when the consumer stops early,
    the runs still going are cancelled. `run` must not raise."""
    done: asyncio.Queue[tuple[R, int]] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()

    async def one(item: X, n: int) -> None:
        await done.put((await run(item), n))

    in_flight = 0
    upcoming = next(items, None)
    try:
        while True:
            while upcoming is not None:
                n = size(upcoming) if size is not None else 1
                if in_flight and in_flight + n > concurrency:
                    break
                job = asyncio.create_task(one(upcoming, n))
                running.add(job)
                job.add_done_callback(running.discard)
                in_flight += n
                upcoming = next(items, None)
            if not in_flight:
                return
            result, n = await done.get()
            in_flight -= n
            yield result
    finally:
        for job in running:
            job.cancel()
