"""Eval config: every option of `tracegym eval`, parsed from TOML files (`@ file.toml`) and dotted CLI flags.

The `taskset` section is typed by the chosen taskset's own Config, so `--taskset.max-words 5` is validated
(and misspellings suggested) like any other field. The taskset id is therefore found before parsing: from the
first positional argument, `--taskset.id`, or the `[taskset]` table of an `@` file.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError
from pydantic_config import BaseConfig

from tracegym.config.command_line import merge, parse_command, read_files
from tracegym.config.error_report import Origin, known_keys, validation_line
from tracegym.config.renames import Rename, migrate, moved_into
from tracegym.config.run_dir import RunId
from tracegym.config.toml_data import toml_ready
from tracegym.core.cut_policy import CutPolicy
from tracegym.core.errors import UsageError
from tracegym.core.sampling import Sampling
from tracegym.envs.evaluate import CONCURRENCY, INFRA_RETRIES
from tracegym.envs.rollout import Timeouts
from tracegym.envs.seats import SeatChoice
from tracegym.envs.taskset_section import typed_by_taskset
from tracegym.models.model_choice import MOVED_KEYS, ModelChoice
from tracegym.runtimes.watchdog import WatchdogConfig
from tracegym.serve.env_server_choice import EnvServerChoice


def _short(name: str, letter: str) -> Any:
    return Field(validation_alias=AliasChoices(name, letter))


class TasksetSection(BaseModel):
    """The taskset to evaluate and its options (the fields depend on the taskset)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    id: str
    """Taskset id: a built-in, an installed one, `package.module:Name` or `path/to/file.py:Name`."""


class EvalConfig(BaseConfig):
    """Evaluate a model on a taskset; results go to a run folder under `output_dir`."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    taskset: TasksetSection
    model: ModelChoice = ModelChoice()
    seat: dict[str, SeatChoice] = Field(default_factory=dict)
    """Seats of a multi-agent taskset played by another model (its name and base URL, by seat id); the other
    seats play as the model (self-play)."""
    num_tasks: Annotated[int | None, _short("num_tasks", "n"), Field(gt=0)] = None
    """Tasks to evaluate (the first N); unset: all of them (an infinite taskset needs it)."""
    rollouts: Annotated[int, _short("rollouts", "r"), Field(gt=0)] = 1
    """Rollouts per task (pass@k is reported for every k up to this)."""
    sampling: Sampling = Sampling()
    timeouts: Timeouts = Timeouts()
    concurrency: Annotated[int, _short("concurrency", "c"), Field(gt=0)] = CONCURRENCY
    """Rollouts running at once."""
    infra_retries: int = Field(default=INFRA_RETRIES, ge=0)
    """Reruns of a rollout that failed on infrastructure (endpoint down)."""
    serve: bool = True
    """Run rollouts in a local env server's worker processes (`tracegym serve`); `--no-serve`: in this process."""
    env: EnvServerChoice = EnvServerChoice()
    """The env server the rollouts run in: running ones (`--env.address tcp://host:5555`), or the one started here
    and its worker pool (`--env.workers 4`, `--env.elastic`, `--env.worker-timeout 120`, ...: `tracegym serve`'s
    options)."""
    pass_threshold: float = 1.0
    """A rollout passes (for pass@k) when its reward is at least this."""
    cuts: CutPolicy = CutPolicy()
    """The reward a rollout cut short or misread counts with in the summary, one rule per kind (`core.cut_policy`):
    `overlong` (the prompt no longer fit the context), `length` (a reply ran into `sampling.max_tokens`),
    `unparsable` (a reply that did not parse into a tool call or move), each `keep` (its scored reward: the
    default), a number (that reward instead: `--cuts.length 0`) or `mask` (left out of every mean, counted). The
    traces keep their scores either way. Single-agent runs; RL has `[orchestrator.cuts]`."""
    max_error_rate: float = Field(default=0.5, ge=0, le=1)
    """The command exits 1 when more than this fraction of the run's rollouts (episodes, for a multi-agent
    taskset) failed: errored, never finished or left a reward unscored. The run folder keeps them all either
    way."""
    output_dir: Path = Path("outputs")
    """Where run folders are created."""
    run_id: RunId | None = None
    """Name of the run folder; unset: the start time."""
    watchdog: WatchdogConfig = WatchdogConfig()
    """How long each stage may make no progress: named as a warning after `--watchdog.warn-after`, the run stopped
    (exit 5, one line naming the stage) after the stage's own budget (`--watchdog.model-call 900`, ...)."""
    rich: bool = True
    """Live dashboard; `--no-rich` prints plain log lines instead (for CI and files)."""
    dry_run: bool = False
    """Validate the config, print it resolved, and exit."""

    def model_choice(self) -> ModelChoice:
        """The model section, its HTTP attempts capped at the model stage's timeout (a longer attempt would be
        cancelled by the stage anyway)."""
        return self.model.model_copy(update={"timeout": min(self.model.timeout, self.timeouts.model)})

    def taskset_options(self) -> dict[str, Any]:
        """The taskset's own options (its Config fields)."""
        return self.taskset.model_dump(exclude={"id"})

    def to_toml_dict(self) -> dict[str, Any]:
        """This config as TOML-ready data (no None values, paths as text)."""
        return toml_ready(self.model_dump(mode="json", exclude={"dry_run"}))


RUN_DEFINING = ("taskset", "model.name", "seat", "num_tasks", "rollouts", "sampling", "pass_threshold", "cuts")
"""Fields (dotted paths) a resumed run must share with the saved one (the others only change how it runs)."""

RENAMES = [*moved_into("model", MOVED_KEYS), Rename("env_address", "env.address"),
           Rename("worker_timeout", "env.worker_timeout")]
"""Keys that moved: each still works, with a warning naming its new place."""


def parse_eval_args(args: Sequence[str], *, defaults: dict[str, Any] | None = None,
                    source: str = "the saved config", description: str | None = None) -> EvalConfig:
    """Parse `tracegym eval` arguments (a positional taskset id is allowed first) into a validated config;
    `defaults` (a saved run's config, read from `source`) are validated first and the arguments override them.
    `description` heads the `--help` text."""
    args = list(args)
    if args and not args[0].startswith("-") and args[0] != "@":
        args = ["--taskset.id", args[0], *args[1:]]
    section = (defaults or {}).get("taskset")
    saved_id = section.get("id") if isinstance(section, dict) else None  # a bad section: validate_saved says so
    taskset_id = find_taskset_id(args)
    if defaults and taskset_id is not None and taskset_id != saved_id:
        raise UsageError(f"--taskset.id {taskset_id!r} does not match the saved run: {source} has "
                         f"taskset.id = {saved_id!r}; drop it or start a new run")
    cls = config_class(taskset_id or saved_id)
    default = validate_saved(cls, defaults, source) if defaults else None
    config, warnings = parse_command(cls, args, prog="tracegym eval", description=description, default=default,
                                     renames=RENAMES)
    for warning in warnings:
        print(f"tracegym: warning: {warning}", file=sys.stderr)
    return config


def validate_saved(cls: type[EvalConfig], data: dict[str, Any], source: str) -> EvalConfig:
    """A saved config (a run folder's `config.toml`, older ones' keys moved to their new places) validated; a bad
    key is a UsageError naming `source`."""
    try:
        return cls.model_validate(migrate(data, RENAMES)[0])
    except ValidationError as exc:
        raise UsageError(validation_line(exc, known_keys(cls), lambda _: Origin(file=source))) from None


def config_class(taskset_id: str | None) -> type[EvalConfig]:
    """EvalConfig with its `taskset` section typed by that taskset's Config (untyped when unknown)."""
    return typed_by_taskset(EvalConfig, taskset_id)


def find_taskset_id(args: Sequence[str]) -> str | None:
    """The taskset id named by `--taskset.id` or, failing that, by the `@` files' `[taskset]` tables, merged left
    to right: the files read as the command's parser reads them (JSON too, and nested under a `--key` before)."""
    files, flags, _ = read_files(args, renames=())
    for i, flag in enumerate(flags):
        if flag == "--taskset.id" and i + 1 < len(flags):
            return flags[i + 1]
        if flag.startswith("--taskset.id="):
            return flag.split("=", 1)[1]
    merged: dict[str, Any] = {}
    for file in files:
        merged = merge(merged, file.data)
    section = merged.get("taskset")
    return section.get("id") if isinstance(section, dict) else None
