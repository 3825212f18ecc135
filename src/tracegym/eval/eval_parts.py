"""Eval parts: what one eval run is made of (the taskset, the model, where and how its rollouts run), built from
`tracegym eval`'s config by `eval_parts`, the one place that reads that config; the run itself never sees it."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracegym.core.cut_policy import CutPolicy
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.envs.evaluate import CONCURRENCY, INFRA_RETRIES, EvaluateOptions, members_of, seats_of
from tracegym.envs.multi_agent import is_multi_agent
from tracegym.envs.rollout import Timeouts
from tracegym.envs.seats import Seat, SeatChoice, bind
from tracegym.envs.taskset import Taskset
from tracegym.eval.eval_config import EvalConfig
from tracegym.models.endpoint import Endpoint
from tracegym.models.model_choice import ModelChoice
from tracegym.runtimes.watchdog import WatchdogConfig
from tracegym.serve.env_server_choice import WorkerPoolChoice
from tracegym.serve.local_server import local_server

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutSettings:
    """How each rollout runs, in this process or in an env server: sampling, stage timeouts, how many run at
    once, and reruns of a rollout that failed on infrastructure."""

    sampling: Sampling = field(default_factory=Sampling)
    timeouts: Timeouts = field(default_factory=Timeouts)
    concurrency: int = CONCURRENCY
    infra_retries: int = INFRA_RETRIES

    def options(self, pairs: list[tuple[TaskData, int]]) -> EvaluateOptions:
        """These settings as the keyword arguments of `evaluate_iter` over `pairs` (in process and on an env
        client alike)."""
        return EvaluateOptions(sampling=self.sampling, timeouts=self.timeouts, concurrency=self.concurrency,
                               infra_retries=self.infra_retries, pairs=pairs)


@dataclass(frozen=True)
class LocalEnvServer:
    """An env server the run starts for its taskset (imported by id, with its options); it logs into the run
    folder and stops with the run."""

    taskset_id: str
    options: dict[str, Any] = field(default_factory=dict)
    pool: WorkerPoolChoice = field(default_factory=WorkerPoolChoice)
    """Its worker pool and workers' limits (`tracegym serve`'s options)."""


@dataclass(frozen=True)
class EvalParts:
    """What one eval run is made of, built from `tracegym eval`'s config by `eval_parts`."""

    taskset: Taskset
    name: str
    """The taskset id as given (error lines and the dashboard's title name it so)."""
    model: ModelChoice
    num_tasks: int | None = None
    """The first N tasks; None: all of them."""
    rollouts: int = 1
    """Rollouts per task."""
    settings: RolloutSettings = field(default_factory=RolloutSettings)
    env: LocalEnvServer | list[str] | None = None
    """Where the rollouts run: an env server started here, those already running at these addresses, or (None)
    this process."""
    pass_threshold: float = 1.0
    """A scored rollout passes (for pass@k) when its reward is at least this."""
    cuts: CutPolicy = field(default_factory=CutPolicy)
    """The reward (or mask) a cut rollout counts with in the summary."""
    rich: bool = True
    """A live rich dashboard on the terminal; False: plain status lines."""
    seats: dict[str, SeatChoice] = field(default_factory=dict)
    """A multi-agent taskset's seats bound elsewhere than the model; the rest play as it."""
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    """Each stage's budgets of silence (`runtimes.watchdog`)."""

    @property
    def multi_agent(self) -> bool:
        """True when the taskset's tasks are played by several members (else each episode is one solo rollout)."""
        return is_multi_agent(self.taskset)

    @property
    def members(self) -> int:
        """Traces per episode: the number of seats of a multi-agent taskset, else 1."""
        return len(members_of(self.taskset))

    def seats_for(self, endpoint: Endpoint) -> dict[str, Seat]:
        """The run's seat binding (`--seat.ID.*`) completed from the policy's endpoint, checked against the
        taskset's seats (a seat it has not is a UsageError naming it; a single-agent taskset has none)."""
        seats = {name: choice.seat(endpoint) for name, choice in self.seats.items()}
        bind(seats_of(self.taskset), seats, self.taskset.id)
        return seats


def eval_parts(config: EvalConfig, taskset: Taskset) -> EvalParts:
    """The parts of the run `config` describes, around its loaded `taskset`: an `--env.address` wins over
    `--no-serve`, which runs the rollouts in this process instead of a local env server."""
    local = LocalEnvServer(config.taskset.id, config.taskset_options(), config.env) if config.serve else None
    settings = RolloutSettings(sampling=config.sampling, timeouts=config.timeouts,
                               concurrency=within_capacity(config.concurrency, taskset),
                               infra_retries=config.infra_retries)
    return EvalParts(taskset=taskset, name=config.taskset.id, model=config.model_choice(), num_tasks=config.num_tasks,
                     rollouts=config.rollouts, settings=settings, env=config.env.address or local,
                     pass_threshold=config.pass_threshold, cuts=config.cuts, rich=config.rich,
                     seats=dict(config.seat), watchdog=config.watchdog)


def within_capacity(concurrency: int, taskset: Taskset) -> int:
    """`-c`, cut to the rollouts the taskset can run at once where it knows (an OpenEnv server's sessions), noted."""
    capacity = taskset.capacity()
    if capacity is None or capacity >= concurrency:
        return concurrency
    log.warning("taskset %s runs at most %d rollouts at once (its server's capacity): -c %d runs as -c %d",
                taskset.id, capacity, concurrency, capacity)
    return capacity


def env_address(env: LocalEnvServer | list[str], stack: contextlib.ExitStack, log_dir: Path) -> str | list[str]:
    """Where a run's rollouts go: the running env servers given, or one started here for the run (its logs in
    `log_dir`; stopped when `stack` closes)."""
    if isinstance(env, list):
        return env
    return stack.enter_context(local_server(env.taskset_id, env.options, log_dir=log_dir, pool=env.pool))
