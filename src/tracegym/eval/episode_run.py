"""Episode run: `tracegym eval` on a multi-agent taskset: find the episodes to play (all, or what a resume
lacks), play them (in process or on an env server) with the seats bound, append each to the run folder, and
summarise per seat. `eval_run.execute` drives it as it drives rollouts."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import IO

from rich.console import Console

from tracegym.core.episode import Episode
from tracegym.core.errors import InfrastructureError, UsageError
from tracegym.core.task_data import TaskData
from tracegym.envs.evaluate import evaluate_episodes_iter, multi_agent_class
from tracegym.envs.seats import Seat, bind
from tracegym.eval.dashboard import Dashboard, Tally
from tracegym.eval.episode_summary import EpisodeSummary, episode_table, summarize_episodes
from tracegym.eval.eval_parts import EvalParts, env_address
from tracegym.eval.run_folder import EPISODES, ERRORED, RunFolder
from tracegym.models.endpoint import Endpoint
from tracegym.serve.env_client import EnvClient

EPISODES_ERRORED = "episodes.errored.jsonl"


def seats_for(parts: EvalParts, endpoint: Endpoint) -> dict[str, Seat]:
    """The run's seat binding (`--seat.ID.*`) completed from the policy's endpoint, checked against the
    taskset's seats (a seat it has not is a UsageError naming it)."""
    seats = {name: choice.seat(endpoint) for name, choice in parts.seats.items()}
    bind(multi_agent_class(parts.taskset).seats, seats, parts.taskset.id)
    return seats


def resume_episodes(folder: RunFolder, expected: list[tuple[TaskData, int]]) -> list[Episode]:
    """The folder's episodes that ended normally and are still expected (kept; the rest, and their traces, move
    to the `.errored` files, and traces of an episode whose record was never written are dropped)."""
    folder.repair()
    stored = folder.read_episodes()
    rows = {d.key: d for d, _ in expected}
    strangers = [e for e in stored if e.task_key not in rows or e.task != rows[e.task_key]]
    if strangers:
        raise UsageError(f"--resume {folder.path}: {EPISODES} holds episodes of task {strangers[0].task_key!r}, "
                         "which the taskset does not have as stored (it changed since the run started); start a "
                         "new run")
    wanted = {(d.key, i) for d, i in expected}
    good = {(e.task_key, e.episode_index): e for e in stored
            if e.ended_normally and (e.task_key, e.episode_index) in wanted}
    kept = set(map(id, good.values()))
    errored = [e for e in stored if id(e) not in kept]
    if errored:
        old = folder.read_episodes(EPISODES_ERRORED, ERRORED)
        folder.rewrite_episodes([*old, *errored], EPISODES_ERRORED, ERRORED)
    folder.rewrite_episodes(good.values())
    return list(good.values())


async def run_episodes(parts: EvalParts, todo: list[tuple[TaskData, int]], folder: RunFolder, endpoint: Endpoint,
                       tally: Tally, boards: list[Dashboard]) -> None:
    """Play the episodes of `todo`, appending each to the folder; the dashboards see each member's trace."""
    with contextlib.ExitStack() as shown:
        for board in boards:
            shown.enter_context(board)
        async for episode in episodes(parts, todo, folder, endpoint):
            folder.append_episode(episode)
            for trace in episode.traces.values():
                tally.add(trace)
                for board in boards:
                    board.update(trace)


async def episodes(parts: EvalParts, todo: list[tuple[TaskData, int]], folder: RunFolder,
                   endpoint: Endpoint) -> AsyncIterator[Episode]:
    """Episodes as they finish: on an env server (running, or started here) or in this process."""
    options = parts.settings.options(todo)
    seats = seats_for(parts, endpoint)
    env = parts.env
    if env is None:
        async for episode in evaluate_episodes_iter(parts.taskset, endpoint, seats=seats, **options):
            yield episode
        return
    with contextlib.ExitStack() as stack:
        async with EnvClient(env_address(env, stack, folder.logs / "env")) as client:
            async for episode in client.evaluate_episodes_iter(parts.taskset, endpoint, seats=seats, **options):
                yield episode


def finish_episodes(folder: RunFolder, wall_time: float, out: IO[str], title: str) -> EpisodeSummary:
    """Summarise the folder's episodes into `summary.json` and print the per-seat table."""
    summary = summarize_episodes(folder.read_episodes(), wall_time=wall_time)
    folder.write_summary(summary.model_dump(mode="json"))
    print(file=out)
    Console(file=out).print(episode_table(summary, title=title))
    print(f"run folder: {folder.path}", file=out, flush=True)
    return summary


def check_episodes_complete(expected: list[tuple[TaskData, int]], folder: RunFolder) -> None:
    """An error unless the folder holds an episode for every expected (task key, episode index) pair."""
    held = {(e.task_key, e.episode_index) for e in folder.read_episodes()}
    missing = [(d.key, i) for d, i in expected if (d.key, i) not in held]
    if missing:
        raise InfrastructureError(f"{folder.path}: {len(missing)} of {len(expected)} episodes have no record after "
                                  f"the run (first: task {missing[0][0]!r} #{missing[0][1]}); --resume "
                                  f"{folder.path} reruns them")
