"""Eval run: one `tracegym eval` from its parts to run folder: find the work (every (task key, episode index) pair,
or what a resume lacks), reach the model, run the episodes with a dashboard (a single-agent taskset's are its
rollouts, each a solo episode), append each to the run folder's episode log as it finishes, write the summary.

Single- and multi-agent tasksets take this one path; they differ only in the summary (`eval.run_summary`). The run
takes its parts (`EvalParts`: the taskset, the model, where and how the episodes run), never the command's config;
`eval_parts` is the one place that turns an `EvalConfig` into them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO

from rich.console import Console

from tracegym.core.episode import Episode
from tracegym.core.errors import InfrastructureError, TracegymError, UsageError
from tracegym.core.task_data import TaskData
from tracegym.envs.evaluate import bounded_taskset, evaluate_episodes_iter
from tracegym.envs.group_scoring import scores_groups
from tracegym.envs.taskset import Taskset
from tracegym.eval.dashboard import Dashboard, PlainDashboard, RichDashboard, Tally
from tracegym.eval.episode_summary import EpisodeSummary
from tracegym.eval.eval_parts import EvalParts, env_address
from tracegym.eval.run_folder import RunFolder
from tracegym.eval.run_summary import run_table, summarize_run
from tracegym.eval.summary import Summary
from tracegym.models.endpoint import Endpoint
from tracegym.models.launch import serve
from tracegym.runtimes.watchdog import (
    ShutdownDeadline,
    Stage,
    Stall,
    Stalled,
    beat,
    build_watchdog,
    until_stalled,
    watch,
)
from tracegym.serve.env_client import EnvClient


@dataclass
class Work:
    """The work of one run: every (task, episode index) pair, those still to run, and the episodes kept."""

    expected: list[tuple[TaskData, int]]
    todo: list[tuple[TaskData, int]]
    kept: list[Episode] = field(default_factory=list)


def work_for(parts: EvalParts, folder: RunFolder | None = None) -> Work:
    """What to run: all of it for a new run (`folder` None, so it can be found before the folder is made);
    on resume, what `kept_on_resume` does not keep."""
    tasks = load_rows(parts.taskset, parts.num_tasks, parts.name)
    check_unique_keys(parts.taskset.id, tasks)
    expected = [(d, i) for d in tasks for i in range(parts.rollouts)]
    if folder is None:
        return Work(expected, expected)
    kept = kept_on_resume(folder, expected, whole_groups=scores_groups(parts.taskset))
    done = {(e.task_key, e.episode_index) for e in kept}
    return Work(expected, [(d, i) for d, i in expected if (d.key, i) not in done], kept=kept)


def kept_on_resume(folder: RunFolder, expected: list[tuple[TaskData, int]], whole_groups: bool = False,
                   ) -> list[Episode]:
    """The folder's episodes to keep: those that ended normally with every member's trace, of a pair still
    expected (`whole_groups`, for a taskset with group rewards: only of tasks whose every rollout is kept, so a
    task's group reruns whole). The rest move to the folder's `errored` log, lines that cannot be read at all to
    `<file>.unreadable` (named on stderr), and the log is rewritten with the kept ones alone (so a folder of the old
    layout is in the new one after it). Leaves the folder alone when a stored task is not the taskset's now
    (`check_same_tasks`)."""
    folder.log.repair()
    read = folder.log.read()
    stored = read.episodes
    check_same_tasks(stored, [d for d, _ in expected], folder)
    for source, aside in folder.log.set_aside(read).items():
        print(f"tracegym: warning: {len(read.unreadable[source])} line(s) of {source.name} could not be read "
              f"({read.problems.get(source, 'corrupt')}): set aside in {aside.name}; their rollouts run again",
              file=sys.stderr)
    wanted = {(d.key, i) for d, i in expected}
    good = {(e.task_key, e.episode_index): e for e in stored
            if e.ended_normally and set(e.traces) == set(e.members) and (e.task_key, e.episode_index) in wanted}
    if whole_groups:  # a group reward compares a task's rollouts: one missing, its group runs again whole
        short = {key for key, i in wanted if (key, i) not in good}
        good = {pair: e for pair, e in good.items() if pair[0] not in short}
    kept = set(map(id, good.values()))
    errored = [e for e in stored if id(e) not in kept]
    if errored:
        folder.errored.write(errored, keep=True)
    folder.log.write(good.values())
    return list(good.values())


def load_rows(taskset: Taskset, num_tasks: int | None, name: str) -> list[TaskData]:
    """The rows to run; the taskset's own `load()` failing is one line naming it as given (`name`; a UsageError,
    exit 2)."""
    try:
        return list(bounded_taskset(taskset, num_tasks))
    except TracegymError:
        raise
    except Exception as exc:  # user code: translated here, at the edge where it is first called
        raise UsageError(f"taskset {name!r}: loading its tasks failed: {type(exc).__name__}: {exc}") from None


def check_unique_keys(taskset_id: str, tasks: list[TaskData]) -> None:
    """A UsageError when the taskset gives two rows one key: their traces could not be told apart."""
    seen: dict[str, int] = {}
    for position, data in enumerate(tasks):
        if data.key in seen:
            raise UsageError(f"taskset {taskset_id!r} gives key {data.key!r} to tasks {seen[data.key]} and "
                             f"{position}; task keys (TaskData.id) must be unique")
        seen[data.key] = position


def check_same_tasks(stored: list[Episode], tasks: list[TaskData], folder: RunFolder) -> None:
    """A UsageError unless every stored episode is of a task the taskset still has, with the same row: a key is
    a position or a given id, which names the same task only while the data is the same."""
    rows = {d.key: d for d in tasks}
    strangers = list(dict.fromkeys(e.task_key for e in stored if e.task_key not in rows))
    if strangers:
        count = sum(1 for e in stored if e.task_key not in rows)
        shown = ", ".join(repr(k) for k in strangers[:3]) + (", ..." if len(strangers) > 3 else "")
        raise UsageError(f"--resume {folder.path}: the run holds {count} episode(s) of task keys this taskset does "
                         f"not have ({shown}): the taskset changed since the run started, or a tracegym that "
                         "keyed rows by a hash of their content wrote them; start a new run")
    changed = next((e for e in stored if e.task != rows[e.task_key]), None)
    if changed is not None:
        raise UsageError(f"--resume {folder.path}: task {changed.task_key!r} of the run is not the taskset's row "
                         "with that key now (the taskset changed since the run started); start a new run")


def check_complete(expected: list[tuple[TaskData, int]], folder: RunFolder) -> None:
    """An error unless the folder holds an episode for every expected (task key, episode index) pair."""
    held = {(e.task_key, e.episode_index) for e in folder.log.read().episodes}
    missing = [(d.key, i) for d, i in expected if (d.key, i) not in held]
    if missing:
        key, index = missing[0]
        raise InfrastructureError(f"{folder.path}: {len(missing)} of {len(expected)} episodes are not in the run "
                                  f"folder after the run (first: task {key!r} #{index}); --resume {folder.path} "
                                  "reruns them")


async def run(parts: EvalParts, todo: list[tuple[TaskData, int]], folder: RunFolder, endpoint: Endpoint,
              tally: Tally, boards: list[Dashboard]) -> None:
    """Run the episodes of `todo`, appending each to the folder; the tally and dashboards see each member's
    trace."""
    with contextlib.ExitStack() as shown:
        for board in boards:
            shown.enter_context(board)
        async for episode in episodes(parts, todo, folder, endpoint):
            folder.log.append(episode)
            for trace in episode.traces.values():
                tally.add(trace)
                for board in boards:
                    board.update(trace)


async def episodes(parts: EvalParts, todo: list[tuple[TaskData, int]], folder: RunFolder,
                   endpoint: Endpoint) -> AsyncIterator[Episode]:
    """Episodes as they finish: through an env server (one already running, or one started here with worker
    logs in the run folder) or in this process."""
    options = parts.settings.options(todo)
    seats = parts.seats_for(endpoint)
    if parts.env is None:
        async for episode in evaluate_episodes_iter(parts.taskset, endpoint, seats=seats, **options):
            yield episode
        return
    with contextlib.ExitStack() as stack:
        async with EnvClient(env_address(parts.env, stack, folder.logs / "env")) as client:
            with watch(Stage.ENV_SERVER, f"({len(todo)} episodes asked)"):
                async for episode in client.evaluate_episodes_iter(parts.taskset, endpoint, seats=seats, **options):
                    beat(Stage.ENV_SERVER, f"episode {episode.task_key}#{episode.episode_index} returned")
                    yield episode


def execute(parts: EvalParts, folder: RunFolder, work: Work, *, resume: bool = False,
            out: IO[str] | None = None, endpoint: Endpoint | None = None) -> Summary | EpisodeSummary:
    """Run `work` into `folder`; return its summary (also written to `summary.json` and printed).
    Ctrl-C keeps every finished episode, writes the summary so far, and says how to resume. The wall time is
    that of every session of the run (a resume adds its own to the earlier ones). `endpoint`: the model endpoint
    the command reached already (at `--model.base-url`); None: serve `parts.model`. With nothing left to run (a
    finished run resumed) only the summary is written again."""
    out = out or sys.stdout
    earlier = folder.earlier_wall_time() if resume else 0.0
    title = f"{parts.name} · {parts.model.display_name()} · {folder.path}"
    if not work.todo:  # a resume of a finished run: nothing to serve the model or start an env server for
        return conclude(parts, folder, earlier, out, title)
    tally = Tally(total=len(work.expected) * parts.members, done_before=len(work.kept) * parts.members)
    with (folder.logs / "eval.log").open("a", encoding="utf-8") as log:
        boards: list[Dashboard] = [PlainDashboard(tally, log, every=1)]
        boards.append(RichDashboard(tally, title, Console(file=out)) if parts.rich else PlainDashboard(tally, out))
        try:
            run_with_model(parts, work.todo, folder, endpoint, tally, boards, log)
        except KeyboardInterrupt:
            conclude(parts, folder, earlier + tally.elapsed, out, title)
            print(f"interrupted; finish the run with: tracegym eval --resume {folder.path}", file=out, flush=True)
            raise
        except Stalled as stalled:
            conclude(parts, folder, earlier + tally.elapsed, out, title)
            print(f"stopped: {stalled}; finish the run with: tracegym eval --resume {folder.path}", file=out,
                  flush=True)
            raise
        finally:
            folder.log.close()
    summary = conclude(parts, folder, earlier + tally.elapsed, out, title)
    check_complete(work.expected, folder)
    return summary


def run_with_model(parts: EvalParts, todo: list[tuple[TaskData, int]], folder: RunFolder, endpoint: Endpoint | None,
                   tally: Tally, boards: list[Dashboard], log: IO[str]) -> None:
    """Run `todo` against the model (`endpoint`, reached already, or `parts.model` served here for the run) with
    the watchdog over every stage: a stage past its hard budget stops the run (`Stalled`), and stopping the model's
    server then has the shutdown budget too."""
    model = contextlib.nullcontext(endpoint) if endpoint else serve(parts.model, log_path=folder.logs / "vllm.log")
    with ShutdownDeadline(parts.watchdog.shutdown) as deadline, model as served:
        where = ", ".join(served.servers())
        print(f"eval: model {served.model} at {where} ready after {tally.elapsed:.1f}s", file=log, flush=True)
        tally.restart_clock()
        try:
            asyncio.run(until_stalled(run(parts, todo, folder, served, tally, boards), build_watchdog(parts.watchdog),
                                      warned(boards), shutdown=parts.watchdog.shutdown))
        except Stalled:
            deadline.start()
            raise


def warned(boards: list[Dashboard]) -> Callable[[Stall], None]:
    """What a stage silent past its soft budget does: named on every dashboard (the log's among them)."""

    def warn(stall: Stall) -> None:
        for board in boards:
            board.warn(stall.line())

    return warn


def conclude(parts: EvalParts, folder: RunFolder, wall_time: float, out: IO[str],
             title: str) -> Summary | EpisodeSummary:
    """Summarise the folder's episodes into `summary.json` (see `summarize_run`) and print the table."""
    summary = summarize_run(folder.log.read().episodes, pass_threshold=parts.pass_threshold, wall_time=wall_time,
                            cuts=parts.cuts)
    folder.write_summary(summary.model_dump(mode="json"))
    print(file=out)
    Console(file=out).print(run_table(summary, title=title))
    print(f"run folder: {folder.path}", file=out, flush=True)
    return summary
