"""Counter env: a TRL `environment_factory`-shaped class (a counter driven by tool methods) run as a taskset.

`CounterEnv` is written exactly as TRL expects, with no tracegym import: a zero-argument constructor, `reset(**row)`
that returns text appended as is to the prompt (so it opens with its own blank line), and public methods
`increment`, `decrement` and `get_count` that become tools (the private `_check_step` does not; the rules text is
a module function, since TRL would offer a public static method as a tool). A step outside 1..`max_step` raises,
and the model sees the error as the tool's answer. The reward `reached_target` is TRL-shaped: it reads each
environment's `count` against its `target` (1.0 on the target, else 0.0); the metric `distance` is
tracegym-shaped and reads the instance at `task.env`. `counter_env(config)` builds the taskset.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from tracegym.core.trace import Trace
from tracegym.envs.environment import EnvironmentTask, EnvironmentTaskset
from tracegym.envs.taskset import TasksetConfig, config_from, seeded_rows

PROMPT = "Use the counter tools to bring the counter to the target, then reply 'done'."
DESCRIPTION = "Drive a counter to a target with increment/decrement tools (TRL environment class; reward: on target)."


class CounterEnvConfig(TasksetConfig):
    """Options of counter-env."""

    num_tasks: int = 100
    """How many (start, target) pairs to generate."""
    max_value: int = Field(default=20, ge=1)
    """Starts and targets are drawn from 0 to this (a target always differs from its start)."""
    max_step: int = Field(default=5, ge=1)
    """Most a single increment or decrement may move the counter."""


class CounterEnv:
    """A counter that starts at some value and should end on a target."""

    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.max_step = 1

    def reset(self, **kwargs: Any) -> str:
        """Start a new episode from the task row (`start`, `target`, `max_step`); the text joins the prompt."""
        self.count = int(kwargs.get("start", 0))
        self.target = int(kwargs.get("target", 0))
        self.max_step = int(kwargs.get("max_step", 1))
        return "\n\n" + rules(self.count, self.target, self.max_step)

    def increment(self, amount: int) -> str:
        """Add to the counter.

        Args:
            amount: How much to add, from 1 to the step limit.
        """
        self._check_step(amount)
        self.count += amount
        return f"The counter is now {self.count}."

    def decrement(self, amount: int) -> str:
        """Subtract from the counter.

        Args:
            amount: How much to subtract, from 1 to the step limit.
        """
        self._check_step(amount)
        self.count -= amount
        return f"The counter is now {self.count}."

    def get_count(self) -> str:
        """Read the counter's current value."""
        return f"The counter is at {self.count}."

    def _check_step(self, amount: int) -> None:
        if not 1 <= amount <= self.max_step:
            raise ValueError(f"amount must be from 1 to {self.max_step}, got {amount}")


def rules(start: int, target: int, max_step: int) -> str:
    """The episode's rules as the model reads them."""
    return f"The counter starts at {start} and the target is {target}. Each call moves it by 1 to {max_step}."


def reached_target(prompts: list[Any], completions: list[Any], environments: list[CounterEnv],
                   **kwargs: Any) -> list[float]:
    """TRL-shaped reward: 1.0 for each environment whose counter is on its target."""
    return [float(env.count == env.target) for env in environments]


def distance(task: EnvironmentTask, trace: Trace) -> float:
    """How far the counter ended from the target."""
    return float(abs(task.env.count - task.env.target))


def make_row(rng: random.Random, cfg: CounterEnvConfig, index: int) -> dict[str, Any]:
    """One task row: a start and a different target."""
    start, target = rng.sample(range(cfg.max_value + 1), 2)
    return {"id": f"counter-env-{cfg.seed}-{index}", "prompt": PROMPT, "start": start, "target": target,
            "max_step": cfg.max_step}


def counter_env(config: CounterEnvConfig | Mapping[str, Any] | None = None) -> EnvironmentTaskset[CounterEnvConfig]:
    """The counter-env taskset: `CounterEnv` run unmodified, scored by the TRL-shaped `reached_target`."""
    cfg = config_from(CounterEnvConfig, config, "counter-env")
    return EnvironmentTaskset(CounterEnv, cfg, id="counter-env", description=DESCRIPTION,
                              data=list(seeded_rows(make_row, cfg, cfg.num_tasks)), rewards=[reached_target],
                              metrics=[distance])
