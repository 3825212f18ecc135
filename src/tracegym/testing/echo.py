"""Echo taskset: a trivial taskset for env-server tests and benchmarks (`tracegym.testing.echo:Echo`).

Each task asks the model to repeat a word; the environment says "again" until `turns` model turns are done.
Reward: the last reply contains the word. Metric: turns taken. No I/O, so it measures the plumbing only.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import signal
import sys
from typing import Literal

from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import metric, reward
from tracegym.envs.task import EnvResponse, Task
from tracegym.envs.taskset import Taskset, TasksetConfig

SPEC = "tracegym.testing.echo:Echo"
"""The id a server or worker loads this taskset by."""


class EchoConfig(TasksetConfig):
    """Options of the echo taskset."""

    num_tasks: int = 100
    """How many tasks."""
    turns: int = 1
    """Model turns per rollout (the environment answers "again" until then)."""
    setup_sleep: float = 0.0
    """Seconds each rollout's setup sleeps (to hold rollouts in flight in tests)."""
    exit_in_setup: bool = False
    """End the whole process in setup (to test what happens when an env-server worker dies)."""
    poison_task: str | None = None
    """Id of one task whose setup ends the whole process (to test that it costs only its own rollouts)."""
    poison_how: Literal["exit", "segfault", "kill", "sys.exit", "interrupt"] = "exit"
    """How the poison task ends it: `os._exit(3)`, a segfault (SIGSEGV), SIGKILL (as the OOM killer does),
    `sys.exit(3)` (which ends only its rollout: the loop records it as a task error) or KeyboardInterrupt (which
    the loop lets pass, as it may be a Ctrl-C: it ends the event loop)."""


class EchoTask(Task[TaskData, EchoConfig]):
    """Repeat a word for `turns` turns."""

    async def setup(self) -> None:
        cfg = self.config
        if cfg.exit_in_setup or self.data.id == cfg.poison_task:  # every task, or the poison one
            _end_process("exit" if cfg.exit_in_setup else cfg.poison_how)
        if cfg.setup_sleep:
            await asyncio.sleep(cfg.setup_sleep)

    async def env_response(self, trace: Trace) -> EnvResponse:
        return "again" if trace.num_turns < self.config.turns else None

    @reward
    def echoed(self, trace: Trace) -> float:
        return float(str(self.data.answer) in trace.last_reply)

    @metric
    def turns_taken(self, trace: Trace) -> float:
        return float(trace.num_turns)


def _end_process(how: str) -> None:
    """End this process the way `how` says (see `EchoConfig.poison_how`)."""
    if how == "exit":
        os._exit(3)
    if how == "sys.exit":
        sys.exit(3)
    if how == "interrupt":
        raise KeyboardInterrupt
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
    os.kill(os.getpid(), signal.SIGSEGV if how == "segfault" else signal.SIGKILL)


def make_row(rng: random.Random, cfg: EchoConfig, index: int) -> TaskData:
    """Task `index`: a word to repeat (no randomness: the seed only names the words)."""
    word = f"word{cfg.seed}-{index}"
    return TaskData(id=f"echo-{index}", prompt=f"Say {word}.", answer=word)


class Echo(Taskset[EchoConfig]):
    """Tasks that ask the model to repeat a word."""

    id = "echo"
    description = "Repeat a word (a trivial taskset for tests and benchmarks)."
    task_class = EchoTask
    row_maker = make_row
