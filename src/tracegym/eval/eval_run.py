"""Eval run: one `tracegym eval` from its parts to run folder: find the work (all of it, or what a resume lacks),
reach the model, run the rollouts with a dashboard, append every trace as it finishes, write the summary.

The run takes its parts (`EvalParts`: the taskset, the model, where and how the rollouts run), never the command's
config; `eval_parts` is the one place that turns an `EvalConfig` into them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import IO, Any

from rich.console import Console

from tracegym.core.errors import InfrastructureError, TracegymError, UsageError
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.evaluate import bounded_taskset, evaluate_iter
from tracegym.envs.taskset import Taskset
from tracegym.eval.dashboard import Dashboard, PlainDashboard, RichDashboard, Tally
from tracegym.eval.episode_run import check_episodes_complete, finish_episodes, resume_episodes, run_episodes
from tracegym.eval.episode_summary import EpisodeSummary
from tracegym.eval.eval_parts import EvalParts, env_address
from tracegym.eval.run_folder import ERRORED, TRACES, RunFolder
from tracegym.eval.summary import Summary, summarize, summary_table
from tracegym.models.endpoint import Endpoint
from tracegym.models.launch import serve
from tracegym.serve.env_client import EnvClient


@dataclass
class Work:
    """The work of one run: every (task, rollout index) pair, those still to run, and the traces kept (the
    episodes kept, for a multi-agent taskset: its pairs index episodes)."""

    expected: list[tuple[TaskData, int]]
    todo: list[tuple[TaskData, int]]
    kept: list[Any] = field(default_factory=list)


def work_for(parts: EvalParts, folder: RunFolder | None = None) -> Work:
    """What to run: all of it for a new run (`folder` None, so it can be found before the folder is made);
    on resume, keep the folder's good traces, set the errored ones aside, and run the rest."""
    tasks = load_rows(parts.taskset, parts.num_tasks, parts.name)
    check_unique_keys(parts.taskset.id, tasks)
    expected = [(d, i) for d in tasks for i in range(parts.rollouts)]
    if folder is None:
        return Work(expected, expected)
    if parts.multi_agent:
        kept = resume_episodes(folder, expected)
        done = {(e.task_key, e.episode_index) for e in kept}
        return Work(expected, [(d, i) for d, i in expected if (d.key, i) not in done], kept=kept)
    folder.repair()
    stored = folder.read_traces().traces
    check_same_tasks(stored, tasks, folder)
    wanted = {(d.key, i) for d, i in expected}
    good = {(t.task_key, t.rollout_index): t for t in stored
            if t.ended_normally and (t.task_key, t.rollout_index) in wanted}
    errored = [t for t in stored if (t.task_key, t.rollout_index) not in good]
    if errored:
        old = folder.read_traces(ERRORED).traces
        folder.rewrite([*old, *errored], ERRORED)
    folder.rewrite(good.values())
    todo = [(d, i) for d, i in expected if (d.key, i) not in good]
    return Work(expected, todo, kept=list(good.values()))


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


def check_same_tasks(stored: list[Trace], tasks: list[TaskData], folder: RunFolder) -> None:
    """A UsageError unless every stored trace is of a task the taskset still has, with the same row: a key is
    a position or a given id, which names the same task only while the data is the same."""
    rows = {d.key: d for d in tasks}
    strangers = list(dict.fromkeys(t.task_key for t in stored if t.task_key not in rows))
    if strangers:
        count = sum(1 for t in stored if t.task_key not in rows)
        shown = ", ".join(repr(k) for k in strangers[:3]) + (", ..." if len(strangers) > 3 else "")
        raise UsageError(f"--resume {folder.path}: {TRACES} holds {count} trace(s) of task keys this taskset does "
                         f"not have ({shown}): the taskset changed since the run started, or a tracegym that "
                         "keyed rows by a hash of their content wrote them; start a new run")
    changed = next((t for t in stored if t.task != rows[t.task_key]), None)
    if changed is not None:
        raise UsageError(f"--resume {folder.path}: task {changed.task_key!r} of {TRACES} is not the taskset's row "
                         "with that key now (the taskset changed since the run started); start a new run")


def check_complete(work: Work, traces: list[Trace], folder: RunFolder) -> None:
    """An error unless the folder's `traces` cover every expected (task key, rollout index) pair."""
    held = {(t.task_key, t.rollout_index) for t in traces}
    missing = [(d.key, i) for d, i in work.expected if (d.key, i) not in held]
    if missing:
        key, index = missing[0]
        raise InfrastructureError(f"{folder.path}: {len(missing)} of {len(work.expected)} rollouts have no trace "
                                  f"after the run (first: task {key!r} #{index}); the traces that came back were "
                                  f"of other task keys; --resume {folder.path} reruns them")


async def run_rollouts(parts: EvalParts, work: Work, folder: RunFolder, endpoint: Endpoint, tally: Tally,
                       boards: list[Dashboard]) -> None:
    """Run the work's rollouts, appending each trace to the folder and showing it on the dashboards."""
    with contextlib.ExitStack() as shown:
        for board in boards:
            shown.enter_context(board)
        async for trace in rollouts(parts, work, folder, endpoint):
            folder.append(trace)
            tally.add(trace)
            for board in boards:
                board.update(trace)


async def rollouts(parts: EvalParts, work: Work, folder: RunFolder, endpoint: Endpoint) -> AsyncIterator[Trace]:
    """Traces of the work as they finish: through an env server (one already running, or one started
    here with worker logs in the run folder) or in this process."""
    options = parts.settings.options(work.todo)
    if parts.env is None:
        async for trace in evaluate_iter(parts.taskset, endpoint, **options):
            yield trace
        return
    with contextlib.ExitStack() as stack:
        async with EnvClient(env_address(parts.env, stack, folder.logs / "env")) as client:
            async for trace in client.evaluate_iter(parts.taskset, endpoint, **options):
                yield trace


def execute(parts: EvalParts, folder: RunFolder, work: Work, *, resume: bool = False,
            out: IO[str] | None = None, endpoint: Endpoint | None = None) -> Summary | EpisodeSummary:
    """Run `work` into `folder`; return its summary (also written to `summary.json` and printed).
    Ctrl-C keeps every finished trace, writes the summary so far, and says how to resume. The wall time is
    that of every session of the run (a resume adds its own to the earlier ones). `endpoint`: the model endpoint
    the command reached already (at `--model.base-url`); None: serve `parts.model`."""
    out = out or sys.stdout
    earlier = folder.earlier_wall_time() if resume else 0.0
    tally = Tally(total=len(work.expected) * parts.members, done_before=len(work.kept) * parts.members)
    title = f"{parts.name} · {parts.model.display_name()} · {folder.path}"
    with (folder.logs / "eval.log").open("a", encoding="utf-8") as log:
        boards: list[Dashboard] = [PlainDashboard(tally, log, every=1)]
        boards.append(RichDashboard(tally, title, Console(file=out)) if parts.rich else PlainDashboard(tally, out))
        try:
            model = (contextlib.nullcontext(endpoint) if endpoint
                     else serve(parts.model, log_path=folder.logs / "vllm.log"))
            with model as endpoint:
                where = ", ".join(endpoint.servers())
                print(f"eval: model {endpoint.model} at {where} ready after {tally.elapsed:.1f}s", file=log, flush=True)
                tally.restart_clock()
                run = run_episodes(parts, work.todo, folder, endpoint, tally, boards) if parts.multi_agent else (
                    run_rollouts(parts, work, folder, endpoint, tally, boards))
                asyncio.run(run)
        except KeyboardInterrupt:
            conclude(parts, folder, earlier + tally.elapsed, out, title)
            print(f"interrupted; finish the run with: tracegym eval --resume {folder.path}", file=out, flush=True)
            raise
        finally:
            folder.close()
    summary = conclude(parts, folder, earlier + tally.elapsed, out, title)
    if parts.multi_agent:
        check_episodes_complete(work.expected, folder)
    else:
        check_complete(work, folder.read_traces().traces, folder)
    return summary


def conclude(parts: EvalParts, folder: RunFolder, wall_time: float, out: IO[str],
             title: str) -> Summary | EpisodeSummary:
    """Summarise what the folder holds (its episodes, for a multi-agent taskset) and print it."""
    if parts.multi_agent:
        return finish_episodes(folder, wall_time, out, title)
    return finish(parts.pass_threshold, folder, folder.read_traces().traces, wall_time, out, title)


def finish(pass_threshold: float, folder: RunFolder, traces: list[Trace], wall_time: float, out: IO[str],
           title: str) -> Summary:
    """Summarise the folder's `traces` into `summary.json` and print the table."""
    summary = summarize(traces, pass_threshold=pass_threshold, wall_time=wall_time)
    folder.write_summary(summary.model_dump(mode="json"))
    print(file=out)
    Console(file=out).print(summary_table(summary, title=title))
    print(f"run folder: {folder.path}", file=out, flush=True)
    return summary
