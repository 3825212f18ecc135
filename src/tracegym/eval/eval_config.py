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

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, ValidationError, create_model
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
from tracegym.envs.taskset_config import first_error
from tracegym.envs.taskset_section import typed_by_taskset
from tracegym.eval.run_folder import _safe
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


class EvalEnv(BaseModel):
    """One taskset of a run that evaluates several (`[[eval.env]]`, prime-rl's spelling; `tracegym eval A B C`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    """Taskset id, as `--taskset.id` takes it."""
    name: str | None = None
    """Its run folder's name inside the combined run's; unset: the id (its last path part, made a folder name)."""
    options: dict[str, Any] = Field(default_factory=dict, validation_alias=AliasChoices("options", "args"))
    """The taskset's own options (its Config fields, as `--taskset.NAME` gives them to one taskset); `args`
    (prime-rl's name) is taken too."""
    num_tasks: int | None = Field(default=None, gt=0, validation_alias=AliasChoices("num_tasks", "num_examples"))
    """Tasks of this taskset (its first N); unset: the run's `num_tasks`. `num_examples` (prime-rl's) too."""
    rollouts: int | None = Field(default=None, gt=0,
                                 validation_alias=AliasChoices("rollouts", "rollouts_per_example"))
    """Rollouts per task of this taskset; unset: the run's `rollouts`. `rollouts_per_example` (prime-rl's) too."""
    env: dict[str, Any] = Field(default_factory=dict)
    """This taskset's env-server options over the run's `[env]` (`EnvServerChoice`'s keys: `runtime`, `harness`,
    `workers`, `elastic`, `address`, ...), e.g. `env = { runtime = "bubblewrap", workers = 2 }`."""

    def folder_name(self) -> str:
        """Its run folder's name inside the combined run's folder."""
        return self.name or _safe(self.id)


def _distinct_folders(envs: list[EvalEnv]) -> list[EvalEnv]:
    names = [e.folder_name() for e in envs]
    twice = sorted({n for n in names if names.count(n) > 1 or n == "logs"})  # logs/: the combined run's own
    if twice:
        raise ValueError(f"two entries would share the run folder {twice[0]!r}: give one of them a `name`")
    return envs


class EvalSet(BaseModel):
    """The tasksets of a run that evaluates several, each into its own run folder inside the combined one."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    env: Annotated[list[EvalEnv], AfterValidator(_distinct_folders)] = Field(default_factory=list)
    """The tasksets, in the order they run; the run's other options (model, sampling, `-n`, `-r`, `[env]`, ...)
    apply to each."""


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
    eval: EvalSet = EvalSet()
    """Several tasksets in one run (`[[eval.env]]` entries: `id`, `options`, `num_tasks`, `rollouts`, `name`; or
    `tracegym eval A B C`): one run folder each inside a combined run folder, whose `summary.json` holds them all;
    `--resume` of the combined folder finishes each. A single-taskset run leaves it empty."""

    def model_choice(self) -> ModelChoice:
        """The model section, its HTTP attempts capped at the model stage's timeout (a longer attempt would be
        cancelled by the stage anyway)."""
        return self.model.model_copy(update={"timeout": min(self.model.timeout, self.timeouts.model)})

    def taskset_options(self) -> dict[str, Any]:
        """The taskset's own options (its Config fields)."""
        return self.taskset.model_dump(exclude={"id"})

    def to_toml_dict(self) -> dict[str, Any]:
        """This config as TOML-ready data (no None values, paths as text)."""
        data = self.model_dump(mode="json", exclude={"dry_run"})
        if not self.eval.env:
            data.pop("eval")
        return toml_ready(data)


RUN_DEFINING = ("taskset", "model.name", "seat", "num_tasks", "rollouts", "sampling", "pass_threshold", "cuts",
                "eval")
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


def leading_ids(args: Sequence[str]) -> list[str]:
    """The taskset ids named before the first option (`tracegym eval A B C ...`)."""
    ids = []
    for arg in args:
        if arg.startswith("-") or arg.startswith("@"):
            break
        ids.append(arg)
    return ids


def is_combined(args: Sequence[str]) -> bool:
    """True when the arguments name several tasksets: two or more ids before the first option, or `eval.env`
    entries (`[[eval.env]]` in an `@` file, or an `--eval.env` flag)."""
    if len(leading_ids(args)) > 1:
        return True
    files, flags, _ = read_files(args, renames=())
    return any(f.startswith("--eval.env") for f in flags) or any(is_combined_data(f.data) for f in files)


def is_combined_data(data: dict[str, Any]) -> bool:
    """True when a config's data (an `@` file's, a run folder's `config.toml`) has `eval.env` entries."""
    section = data.get("eval")
    return isinstance(section, dict) and bool(section.get("env"))


def combined_config_class() -> type[EvalConfig]:
    """EvalConfig for a run of several tasksets: its `taskset` section left unset (each `eval.env` entry names
    its own)."""
    return create_model("EvalConfig", __base__=EvalConfig, taskset=(TasksetSection | None, None))


NO_TASKSET_SECTION = ("taskset: this run evaluates several tasksets (eval.env); give each its options in its "
                      "[[eval.env]] entry (`options = { max_words = 5 }`), not in [taskset] or --taskset.*")


def parse_combined_args(args: Sequence[str], *, defaults: dict[str, Any] | None = None,
                        source: str = "the saved config", description: str | None = None) -> EvalConfig:
    """Parse the arguments of a run of several tasksets (`tracegym eval A B C ...`, `[[eval.env]]` entries);
    `defaults`: a combined run's saved config, which the arguments override. Taskset options go in each entry:
    a `[taskset]` section or `--taskset.*` flag is a UsageError."""
    ids = leading_ids(args)
    cls = combined_config_class()
    if ids and defaults:
        raise UsageError(f"--resume takes no taskset ids (got {' '.join(ids)}): the run's tasksets are in {source}")
    if ids and is_combined(args[len(ids):]):
        raise UsageError(f"tasksets named twice: as arguments ({' '.join(ids)}) and as eval.env entries "
                         "([[eval.env]] in an @ file, or --eval.env); give them one way")
    if any(flag.startswith("--taskset") for flag in args):
        raise UsageError(NO_TASKSET_SECTION)
    default: EvalConfig | None = None
    if defaults:
        default = validate_saved(cls, defaults, source)
    elif ids:
        try:
            default = cls.model_validate({"eval": {"env": [{"id": i} for i in ids]}})
        except ValidationError as exc:
            raise UsageError(f"tracegym eval {' '.join(ids)}: {first_error(exc)}") from None
    config, warnings = parse_command(cls, list(args[len(ids):]), prog="tracegym eval",
                                     description=description, default=default, renames=RENAMES)
    for warning in warnings:
        print(f"tracegym: warning: {warning}", file=sys.stderr)
    if config.taskset is not None:
        raise UsageError(NO_TASKSET_SECTION)
    return config



def entry_config(combined: EvalConfig, index: int) -> EvalConfig:
    """The config of one taskset of a combined run (`eval.env` entry `index`): the combined run's options, its
    taskset and options, and its own `num_tasks` / `rollouts` where it gives them; a bad id or option is a
    UsageError naming the entry."""
    entry = combined.eval.env[index]
    where = f"eval.env.{index} ({entry.id})"
    data = combined.model_dump(mode="json", exclude={"eval", "taskset", "dry_run"}, exclude_none=True)
    data["taskset"] = {"id": entry.id, **entry.options}
    data["env"] = merge(data.get("env", {}), entry.env)
    data.update({k: v for k, v in (("num_tasks", entry.num_tasks), ("rollouts", entry.rollouts)) if v is not None})
    try:
        cls = config_class(entry.id)
        return cls.model_validate(data)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    except ValidationError as exc:
        raise UsageError(f"{where}: {first_error(exc, known=cls.model_fields)}") from None
