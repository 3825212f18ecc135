"""Adapter fit: what a taskset needs that an adapter running one rollout at a time through its own turn loop (TRL's
`environment_factory`, the OpenEnv server) cannot give it, refused by name instead of scored wrong in silence.

Two things: a group reward (`@reward(group=True)`) scores a task's rollouts together, and such an adapter never has
them together, so it would be None on every rollout; and a task whose rollouts a program harness drives (an agent
program, a verifiers environment's own `rollout()`) never runs the adapter's turn loop at all.
"""

from __future__ import annotations

from tracegym.core.errors import UsageError
from tracegym.envs.group_scoring import group_scorers
from tracegym.envs.taskset import Taskset


def check_adapter_fit(taskset: Taskset, adapter: str) -> None:
    """A UsageError naming the taskset, what it needs and what to use instead, when `adapter` cannot run it."""
    if found := group_scorers(taskset):
        raise UsageError(f"taskset {taskset.id!r}: group {found[0].kind} {found[0].name!r} scores a task's rollouts "
                         f"together, and {adapter} runs them one at a time (it would be None on every one); use "
                         "`tracegym eval` / `tracegym rl`, which keep a task's group together")
    harness = taskset.harness_override or taskset.task(taskset[0]).harness
    if harness is not None:
        raise UsageError(f"taskset {taskset.id!r}: its rollouts are driven by a program harness "
                         f"({type(harness).__name__}), and {adapter} drives its own turn loop; use `tracegym eval` / "
                         "`tracegym serve` / `tracegym rl`")
