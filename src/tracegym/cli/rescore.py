"""`tracegym rescore RUN_DIR [--repeat N] [--taskset.FIELD V ...]`: recompute rewards of a run's stored episodes; the
policy model is not called (a judge reward asks its judge model). `--repeat N` scores every trace N times and
reports how much each reward moved (`eval.rescore_noise`): a judge's or a sampled reward's noise, in the summary
under `noise` (judges ask their model afresh each time, not their cache).

A single-agent run's traces are rescored one by one, a multi-agent run's episodes by replay (see `eval.rescore`).
Writes the rescored episodes as an episode log, `traces.rescored-<time>-<hex>.jsonl` and
`episodes.rescored-<time>-<hex>.jsonl`, and their `summary.rescored-<time>-<hex>.json`, beside the originals, which
stay. Traces whose replay diverged are counted and listed, here and under `diverged` in that summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from tracegym.cli.flag import pop_flag
from tracegym.core.episode import Episode
from tracegym.core.errors import UsageError
from tracegym.envs.judge import fresh_verdicts
from tracegym.envs.multi_agent import is_multi_agent
from tracegym.envs.registry import load_taskset
from tracegym.envs.taskset import Taskset
from tracegym.eval.episode_summary import episode_table, summarize_episodes
from tracegym.eval.eval_config import EvalConfig, is_combined_data, parse_eval_args
from tracegym.eval.rescore import Divergence, rescore, rescore_episodes
from tracegym.eval.rescore_noise import noise_lines, reward_noise
from tracegym.eval.run_folder import RunFolder
from tracegym.eval.summary import summarize, summary_table

SHOWN = 20
"""Diverged traces listed on the terminal (the summary file lists them all)."""


def run(args: list[str]) -> int:
    """Rescore the run folder named first, with the saved config and any `--taskset.*` overrides."""
    if not args or args[0].startswith("-"):
        raise UsageError("usage: tracegym rescore RUN_DIR [--repeat N] [--taskset.FIELD VALUE ...]")
    folder = RunFolder.open(Path(args[0]))
    if is_combined_data(folder.read_config()):
        raise UsageError(f"{folder.path} is a combined run of several tasksets; rescore each one's run folder: "
                         f"tracegym rescore {folder.path}/<taskset>")
    repeat, rest = pop_flag(args[1:], "--repeat")
    repeats = _repeats(repeat)
    config = parse_eval_args(rest, defaults=folder.read_config(), source=str(folder.config_path))
    taskset = load_taskset(config.taskset.id, config.taskset_options())
    stored = folder.log.read().episodes
    if not stored:
        raise UsageError(f"{folder.path} has no episodes to rescore")
    if is_multi_agent(taskset):
        if repeats > 1:
            raise UsageError(f"--repeat {repeats}: a multi-agent run's episodes are rescored by replay once; "
                             "repeated rescoring is for single-agent runs")
        episodes, summary = _rescore_episodes(folder, taskset, config, stored)
    else:
        episodes, summary = _rescore_traces(folder, taskset, config, stored, repeats)
    name = "rescored-" + time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)  # two in one second stay apart
    out = folder.side_log(name)
    out.write(episodes)
    path = folder.write_summary(summary, f"summary.{name}.json")
    print(f"wrote {out.traces}, {out.episodes.name} and {path.name}")
    return 0


def _repeats(value: str | None) -> int:
    if value is None:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"--repeat {value!r}: the number of times to score each trace, 1 or more")
    return int(value)


def _rescore_traces(folder: RunFolder, taskset: Taskset, config: EvalConfig, stored: list[Episode],
                    repeats: int = 1) -> tuple[list[Episode], dict[str, Any]]:
    """A single-agent run's traces rescored one by one (as solo episodes), and their summary with the traces
    whose replay diverged; scored `repeats` times, the first scoring is kept and the noise across all reported."""
    traces = [t for e in stored for t in e.traces.values()]
    with fresh_verdicts() if repeats > 1 else contextlib.nullcontext():  # each repeat asks its judges again
        results = [asyncio.run(rescore(taskset, traces, config.timeouts, config.concurrency))
                   for _ in range(repeats)]
    result = results[0]
    before = summarize(traces, pass_threshold=config.pass_threshold, cuts=config.cuts)
    after = summarize(result.traces, pass_threshold=config.pass_threshold, cuts=config.cuts)
    Console().print(summary_table(after, title=f"rescored: {folder.path}"))
    print(f"mean reward {_num(before.reward)} -> {_num(after.reward)} over {len(traces)} traces")
    _report_diverged(result.diverged, len(traces))
    record = {**after.model_dump(mode="json"), "diverged": [d.model_dump(mode="json") for d in result.diverged]}
    if repeats > 1:
        noise = reward_noise([r.traces for r in results])
        print("\n".join(noise_lines(noise)))
        record["noise"] = {name: n.model_dump(mode="json") for name, n in noise.items()}
    return [Episode.solo(t) for t in result.traces], record


def _rescore_episodes(folder: RunFolder, taskset: Taskset, config: EvalConfig,
                      stored: list[Episode]) -> tuple[list[Episode], dict[str, Any]]:
    """A multi-agent run's episodes rescored by replay, and their per-seat summary."""
    episodes = asyncio.run(rescore_episodes(taskset, stored, config.timeouts, config.concurrency))
    summary = summarize_episodes(episodes)
    Console().print(episode_table(summary, title=f"rescored: {folder.path}"))
    diverged = [e for e in episodes if e.error is not None and e.error.stage.startswith("rescore")]
    if diverged:
        first = diverged[0]
        assert first.error is not None  # as every diverged episode's
        print(f"{len(diverged)} of {len(episodes)} episodes could not be replayed (left unscored); first: "
              f"{first.task_key} #{first.episode_index}: {first.error.message}")
    return episodes, summary.model_dump(mode="json")


def _report_diverged(diverged: list[Divergence], total: int) -> None:
    """Name the traces whose replay answered differently; they were left unscored, not rescored."""
    if not diverged:
        return
    print(f"{len(diverged)} of {total} traces diverged on replay (a tool answered differently than in the "
          "rollout, so the environment state could not be rebuilt): left unscored, first differing call:")
    for divergence in diverged[:SHOWN]:
        print(f"  {divergence.describe()}")
    if len(diverged) > SHOWN:
        print(f"  ... and {len(diverged) - SHOWN} more (all under 'diverged' in the summary file)")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
