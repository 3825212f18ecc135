"""`tracegym eval`: evaluate a model on a taskset into a run folder, or `--resume` an interrupted run."""

from __future__ import annotations

import asyncio
import operator
import sys
from pathlib import Path

import tomli_w

from tracegym.cli.flag import pop_flag
from tracegym.config.run_dir import owned
from tracegym.core.errors import UsageError
from tracegym.envs.evaluate import multi_agent_class, seats_of
from tracegym.envs.registry import load_taskset
from tracegym.envs.scripted_seat import check_scripts
from tracegym.envs.seats import Seat, bind
from tracegym.envs.task_sandbox import check_taskset
from tracegym.eval.episode_summary import EpisodeSummary
from tracegym.eval.eval_config import RUN_DEFINING, EvalConfig, parse_eval_args, validate_saved
from tracegym.eval.eval_parts import eval_parts
from tracegym.eval.eval_run import execute, work_for
from tracegym.eval.run_folder import RunFolder
from tracegym.eval.run_summary import too_many_failed
from tracegym.eval.summary import Summary
from tracegym.models.launch import reach
from tracegym.models.renderer import load_renderer
from tracegym.runtimes.admission import configure_admission
from tracegym.serve.env_client import check_env_server

USAGE = """Evaluate a model on a taskset; results go to a run folder under --output-dir.
  tracegym eval TASKSET [OPTIONS]           a new run (or --taskset.id, or [taskset] in an @ file)
  tracegym eval --resume RUN_DIR [OPTIONS]  finish an interrupted run with its saved config: reruns
                                            the missing and errored rollouts"""


def run(args: list[str]) -> int:
    """Parse, validate, then run (new run folder) or resume (existing one)."""
    resume_dir, rest = pop_flag(args, "--resume")
    if resume_dir is not None:
        folder = RunFolder.open(Path(resume_dir))
        saved = folder.read_config()
        config = parse_eval_args(rest, defaults=saved, source=str(folder.config_path), description=USAGE)
        check_same_run(saved, config, folder)
    else:
        config = parse_eval_args(rest, description=USAGE)
    taskset = load_taskset(config.taskset.id, config.taskset_options())  # a bad option fails before any folder
    if config.seat:  # so does a seat the taskset has not, or a script it cannot play
        seats = bind(seats_of(taskset), {name: Seat(script=c.script) for name, c in config.seat.items()}, taskset.id)
        check_scripts(multi_agent_class(taskset), seats)
    if config.dry_run:
        print(tomli_w.dumps(config.to_toml_dict()), end="")
        return 0
    if config.env.address is not None:  # a server of another taskset or config fails before any folder too
        asyncio.run(check_env_server(config.env.address, taskset))
    else:  # so does a sandbox this host cannot run as asked (a server elsewhere checked its own host)
        check_taskset(taskset)
    if not config.serve:  # the rollouts' sandboxes open in this process
        configure_admission(config.env.sandbox)
    endpoint = None
    if config.model.base_url is not None:  # asked once, before any folder is made; record which model answered
        endpoint = reach(config.model_choice())
        if endpoint.client == "tokens":  # else every rollout would fail on it: once, here, naming the flag
            load_renderer(endpoint.tokenizer or endpoint.model, endpoint.renderer)
        config = config.model_copy(update={"model": config.model.model_copy(update={"name": endpoint.model})})
    parts = eval_parts(config, taskset)
    if resume_dir is not None:
        with owned(folder.path):
            summary = execute(parts, folder, work_for(parts, folder), resume=True, endpoint=endpoint)
        return verdict(summary, config.max_error_rate)
    work = work_for(parts)  # found before the folder is made: a taskset whose loading fails leaves none
    folder = RunFolder.create(config.output_dir, config.taskset.id, parts.model.display_name(), config.run_id)
    with owned(folder.path):
        folder.write_config(config.to_toml_dict())
        summary = execute(parts, folder, work, endpoint=endpoint)
    return verdict(summary, config.max_error_rate)


def verdict(summary: Summary | EpisodeSummary, max_error_rate: float) -> int:
    """The exit code of a finished run: 1, saying why on stderr, when too much of it failed; else 0."""
    failed = too_many_failed(summary, max_error_rate)
    if failed is None:
        return 0
    print(f"tracegym eval: {failed}", file=sys.stderr)
    return 1


def check_same_run(saved: dict, config: EvalConfig, folder: RunFolder) -> None:
    """A resume may change how the run goes (concurrency, dashboard) but not what it computes."""
    before = validate_saved(type(config), saved, str(folder.config_path))
    for name in RUN_DEFINING:
        value = operator.attrgetter(name)
        changed = differences(name, _plain(value(before)), _plain(value(config)))
        if changed:
            shown = ", ".join(f"{key} = {old!r}, not {new!r}" for key, old, new in changed)
            raise UsageError(f"--resume {folder.path}: the run was made with {shown}; "
                             "drop the option or start a new run")


def differences(key: str, old: object, new: object) -> list[tuple[str, object, object]]:
    """The dotted keys (under `key`) whose values differ, with the old and new value of each."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in dict.fromkeys([*old, *new]) for d in differences(f"{key}.{k}", old.get(k), new.get(k))]
    return [] if old == new else [(key, old, new)]


def _plain(value: object) -> object:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value
