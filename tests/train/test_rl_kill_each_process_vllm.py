"""Slow: each process of a small `tracegym rl` run on the embedded model is killed with -9 (an env server worker,
the trainer, vLLM, the orchestrator, the env server, then `tracegym rl` itself), and after each `--resume` the run
reaches the same final step with every step trained once, no sample twice and no group lost.

One run per killed process would start vLLM seven times (~1.5-3.5 min each on this loaded 2-core machine), so the
kills share four runs: in the first an env server worker dies mid-step (the run goes on: its server replaces it),
then the trainer and vLLM together at a checkpoint; in the second the orchestrator and the env server together
mid-step; in the third `tracegym rl` itself at a checkpoint (every other process exits with it); the fourth
finishes the run.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tracegym.runtimes.processes import process_alive
from tracegym.train.rl_folder import RLFolder

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).parents[2] / "configs" / "rl" / "reverse_text.toml"
STEPS, TASKS, GROUP = 6, 2, 4
RUN_S = 600.0
"""The most one run may take to reach the point where a process is killed (vLLM starts in it)."""


def rl(tmp_path: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(CONFIG), "--steps", str(STEPS),
            "--checkpoint-every", "1", "--orchestrator.tasks-per-step", str(TASKS), "--orchestrator.group-size",
            str(GROUP), "--orchestrator.concurrency", str(TASKS * GROUP), "--orchestrator.eval.num-tasks", "2",
            "--output-dir", str(tmp_path), *flags]


def descendants(pid: int) -> dict[int, tuple[int, str]]:
    """Every process whose ancestry (by ppid, read from /proc) leads to `pid`, with its parent and command line."""
    parents, commands = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                commands[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p: (parents[p], commands.get(p, "")) for p in found}


def the(run: subprocess.Popen, *parts: str, parent: tuple[str, ...] = ()) -> int:
    """The process of the run whose command line holds every one of `parts`, and its parent's `parent` (waiting for
    it to start): the inner one where one runs another (vLLM under its supervisor), the first of several alike (an
    env server's workers)."""
    found: list[int] = []

    def holds(pid: int, wanted: tuple[str, ...], processes: dict[int, tuple[int, str]]) -> bool:
        return all(part in processes.get(pid, (0, ""))[1] for part in wanted)

    def started() -> bool:
        processes = descendants(run.pid)
        matches = {p for p, (ppid, _) in processes.items() if holds(p, parts, processes)
                   and holds(ppid, parent, processes)}
        found[:] = [min({p for p in matches if processes[p][0] in matches} or matches)] if matches else []
        return bool(found) or run.poll() is not None

    poll(started, RUN_S, f"a process of the run running {parts}")
    assert found, f"the run ended (exit {run.returncode}) before a process ran {parts}"
    return found[0]


def poll(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def rewound(run_dir: Path, since: float) -> bool:
    """True once the launcher started `since` has rewound the run folder (it writes the endpoints right after)."""
    endpoints = run_dir / "endpoints.json"
    return endpoints.exists() and endpoints.stat().st_mtime >= since


class Ledger:
    """What the run folder shows of progress, each as the set of things made so far, so that a moment is a new one
    (a count would not do: a resumed step keeps the groups it had, so with two tasks a step's count of finished
    groups can start at 1 and never be seen above it before the step's file is removed)."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = RLFolder(run_dir)

    def batches(self) -> set[str]:
        return {p.name for p in (self.folder.path / "batches").glob("*.msgpack")}

    def checkpoints(self) -> set[str]:
        return {p.name for p in self.folder.checkpoints()}

    def finished_groups(self) -> set[str]:
        """Each finished group of an unfinished step, as its file and line."""
        groups = set()
        for partial in (self.folder.path / "partial").glob("*.jsonl"):
            try:
                groups |= {f"{partial.name}:{line}" for line in partial.read_text().splitlines()}
            except FileNotFoundError:  # its step was just made
                continue
        return groups


TRAINER = ("tracegym.train.roles trainer",)
ORCHESTRATOR = ("tracegym.train.roles orchestrator",)
VLLM = ("vllm.entrypoints.openai.api_server",)
ENV_SERVER = ("tracegym.cli.main serve", "logs/env-reverse-text ")
"""The training env server (the held-out one logs to `env-eval-reverse-text`)."""
WORKER = ("tracegym.serve.worker",)
"""A worker of the training env server (`the` finds it under `ENV_SERVER`)."""
LAUNCHER = ("tracegym.cli.main rl",)
"""`tracegym rl` itself: killed with -9, it can stop nothing; every other process must exit with it."""


def attempt(tmp_path: Path, run_dir: Path, kills: list[tuple[str, list[tuple[str, ...]]]], resume: bool) -> None:
    """Start (or resume) the run and, for each (moment, processes) of `kills`, wait for that moment of this attempt
    (`batch`: a new batch made; `group`: a group of an unfinished step finished; `checkpoint`: a new checkpoint)
    and kill those processes with -9. Every process of the run must be gone after (those not killed stopped by the
    launcher, or, when it was killed, exiting with it)."""
    flags = ("--resume", str(run_dir)) if resume else ("--run-id", run_dir.name)
    run = subprocess.Popen(rl(tmp_path, *flags), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = Ledger(run_dir)
    moments = {"batch": ledger.batches, "group": ledger.finished_groups, "checkpoint": ledger.checkpoints}
    seen: set[int] = set()
    started = time.time()
    try:  # the launcher writes the endpoints once it rewound the folder: the ledger counts from there
        poll(lambda: rewound(run_dir, started) or run.poll() is not None, RUN_S, "the launcher to rewind the folder")
        for moment, processes in kills:
            before = moments[moment]()
            # found before the moment, so that the kill comes within a poll of it (a step takes seconds)
            pids = [run.pid if parts == LAUNCHER else the(run, *parts, parent=ENV_SERVER if parts == WORKER else ())
                    for parts in processes]
            seen |= set(descendants(run.pid))  # now: once the launcher is dead, its children are no longer its
            poll(lambda: bool(moments[moment]() - before) or run.poll() is not None, RUN_S, f"a new {moment}")  # noqa: B023
            assert run.poll() is None, f"the run ended (exit {run.returncode}) before {processes} were killed"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        code = run.wait(timeout=120)
    finally:
        run.kill()
        run.wait()
    assert code != 0
    poll(lambda: not any(map(process_alive, seen)), 60, "every process of the killed run to end")


def test_every_process_killed_in_turn_and_resumed_reaches_the_same_final_step_exactly_once(tmp_path):
    run_dir = tmp_path / "r"
    attempt(tmp_path, run_dir, [("group", [WORKER]), ("checkpoint", [TRAINER, VLLM])], resume=False)
    attempt(tmp_path, run_dir, [("group", [ORCHESTRATOR, ENV_SERVER])], resume=True)
    attempt(tmp_path, run_dir, [("checkpoint", [LAUNCHER])], resume=True)
    done = subprocess.run(rl(tmp_path, "--resume", str(run_dir)), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    folder = RLFolder(run_dir)
    assert folder.latest_checkpoint().name == f"step-{STEPS:06d}"
    assert json.loads((run_dir / "policy.json").read_text())["version"] == STEPS
    assert [r["step"] for r in folder.trained_steps()] == list(range(STEPS))  # each step trained once
    assert [r["step"] for r in folder.metrics.read() if "step" in r] == list(range(STEPS))
    trained = [s.trace_id for step in range(STEPS) for s in folder.read_batch(step).samples]
    assert len(trained) == len(set(trained))  # no sample twice
    for step in range(STEPS):
        traces = folder.step_log(step).read().traces
        groups = Counter(t.task_key for t in traces)
        assert len(groups) == TASKS and set(groups.values()) == {GROUP}, (step, groups)  # each group, whole, once
        assert {s.trace_id for s in folder.read_batch(step).samples} <= {t.id for t in traces}
    assert not list(run_dir.glob("partial/*.jsonl"))
    assert [r["eval_step"] for r in folder.metrics.read() if "eval_reward" in r][-1] == STEPS
