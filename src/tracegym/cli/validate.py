"""`tracegym validate TASKSET`: run each task's gold reply and a no-op agent; exit 1 when a gold fails or doing
nothing pays (the tasks named), 0 when the taskset is clean."""

from __future__ import annotations

import asyncio
from typing import Annotated

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic_config import BaseConfig

from tracegym.config.command_line import parse_command
from tracegym.core.errors import UsageError
from tracegym.envs.multi_agent import is_multi_agent
from tracegym.envs.registry import load_taskset
from tracegym.envs.rollout import Timeouts
from tracegym.envs.taskset_section import typed_by_taskset
from tracegym.eval.eval_config import find_taskset_id
from tracegym.eval.eval_run import load_rows
from tracegym.eval.validation import Validation, validate
from tracegym.train.rl_config import EnvChoice


class ValidateTaskset(BaseModel):
    """The taskset to validate and its options (`--taskset.NAME VALUE`, typed by the taskset)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    id: str
    """Taskset id: a built-in, an installed one, `package.module:Name` or `path/to/file.py:Name`."""


class ValidateConfig(BaseConfig):
    """Check a taskset's rewards before training on it: each task's gold reply (`Task.gold`) must pass, and an
    empty reply on every turn must not be paid."""

    taskset: ValidateTaskset
    num_tasks: Annotated[int | None, Field(validation_alias=AliasChoices("num_tasks", "n"), gt=0)] = 20
    """Tasks to check (the first N); an infinite taskset needs it."""
    pass_threshold: float = 1.0
    """The reward a gold reply must reach."""
    noop_max: float = 0.0
    """The most reward an empty reply may earn."""
    concurrency: int = Field(default=8, gt=0)
    """Rollouts at once (in this process)."""
    timeouts: Timeouts = Timeouts()


def config_class(taskset_id: str | None) -> type[ValidateConfig]:
    """ValidateConfig with its `taskset` section typed by that taskset's Config (untyped when unknown)."""
    return typed_by_taskset(ValidateConfig, taskset_id)


def run(args: list[str]) -> int:
    """Validate, print the report, exit 1 when any task is flagged."""
    if args and not args[0].startswith("-"):
        args = ["--taskset.id", args[0], *args[1:]]
    config, _ = parse_command(config_class(find_taskset_id(args)), args, prog="tracegym validate")
    return report(asyncio.run(check(config)))


async def check(config: ValidateConfig) -> Validation:
    taskset = load_taskset(config.taskset.id, config.taskset.model_dump(exclude={"id"}))
    if is_multi_agent(taskset):
        raise UsageError(f"validate: taskset {taskset.id!r} is multi-agent: its gold and no-op agents would each be "
                         "one seat of an episode, which validate does not play (single-agent tasksets only)")
    rows = load_rows(taskset, config.num_tasks, config.taskset.id)
    return await validate(taskset, rows, pass_threshold=config.pass_threshold, noop_max=config.noop_max,
                          timeouts=config.timeouts, concurrency=config.concurrency)


def report(validation: Validation) -> int:
    print("\n".join(validation.lines()), flush=True)
    return 0 if validation.clean else 1


PREFLIGHT_TASKS = 20
"""Tasks of each training environment `tracegym rl --validate` checks."""


def preflight(envs: list[EnvChoice]) -> bool:
    """`tracegym rl --validate`: each training environment's first tasks validated here (one on a running env
    server is loaded here too: its code must be importable); False, with the report printed, when any is not
    clean."""
    clean = True
    for env in envs:
        taskset = load_taskset(env.id, env.options)
        if is_multi_agent(taskset):
            print(f"validate {env.id}: multi-agent, not validated (single-agent tasksets only)", flush=True)
            continue
        validation = asyncio.run(validate(taskset, load_rows(taskset, PREFLIGHT_TASKS, env.id)))
        clean = report(validation) == 0 and clean
    return clean
