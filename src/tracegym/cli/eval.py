"""`tracegym eval`: evaluate a model on a taskset (or several) into a run folder, or `--resume` an interrupted run."""

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
from tracegym.envs.image_input import check_images_taken
from tracegym.envs.registry import load_taskset
from tracegym.envs.scripted_seat import check_scripts
from tracegym.envs.seats import Seat, bind
from tracegym.envs.task_sandbox import check_taskset
from tracegym.envs.taskset import Taskset
from tracegym.eval.combined_folder import CombinedFolder
from tracegym.eval.combined_run import CombinedRun, Member
from tracegym.eval.episode_summary import EpisodeSummary
from tracegym.eval.eval_config import (
    RUN_DEFINING,
    EvalConfig,
    entry_config,
    is_combined,
    is_combined_data,
    parse_combined_args,
    parse_eval_args,
    validate_saved,
)
from tracegym.eval.eval_parts import eval_parts
from tracegym.eval.eval_run import execute, work_for
from tracegym.eval.run_folder import RunFolder
from tracegym.eval.run_summary import too_many_failed
from tracegym.eval.summary import Summary
from tracegym.eval.verifiers_flags import translate
from tracegym.models.embedded_vlm import resolved_vlm
from tracegym.models.endpoint import Endpoint
from tracegym.models.launch import choice_takes_images, reach
from tracegym.models.renderer import load_renderer
from tracegym.runtimes.admission import configure_admission
from tracegym.serve.env_client import check_env_server

USAGE = """Evaluate a model on a taskset; results go to a run folder under --output-dir.
  tracegym eval TASKSET [OPTIONS]           a new run (or --taskset.id, or [taskset] in an @ file)
  tracegym eval A B C [OPTIONS]             several tasksets (or [[eval.env]] entries in an @ file): a run
                                            folder each inside one combined run folder, one summary
  tracegym eval --resume RUN_DIR [OPTIONS]  finish an interrupted run (a combined one too) with its saved
                                            config: reruns the missing and errored rollouts"""


def run(args: list[str]) -> int:
    """Parse, validate, then run (new run folder) or resume (existing one); several tasksets: `run_combined`.
    verifiers' `vf-eval` spellings are taken too, each named once with ours (`eval.verifiers_flags`)."""
    args, notes = translate(args)
    for note in notes:
        print(f"tracegym eval: note: {note}", file=sys.stderr)
    resume_dir, rest = pop_flag(args, "--resume")
    if resume_dir is not None:
        folder = RunFolder.open(Path(resume_dir))
        saved = folder.read_config()
        if is_combined_data(saved):
            return run_combined(rest, CombinedFolder(folder.path), saved)
        config = parse_eval_args(rest, defaults=saved, source=str(folder.config_path), description=USAGE)
        check_same_run(saved, config, folder)
    elif is_combined(rest):
        return run_combined(rest)
    else:
        config = parse_eval_args(rest, description=USAGE)
    config = config.model_copy(update={"model": resolved_vlm(config.model)})
    taskset = loaded(config)  # a bad option or seat fails before any folder
    if config.dry_run:
        print(tomli_w.dumps(config.to_toml_dict()), end="")
        return 0
    check_host(config, taskset)
    check_images(config, taskset)
    if not config.serve:  # the rollouts' sandboxes open in this process
        configure_admission(config.env.sandbox)
    config, endpoint = reached(config)
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


def loaded(config: EvalConfig) -> Taskset:
    """The run's taskset, built with its options (its tasks' sandboxes in `--env.runtime` and its rollouts driven
    by `--env.harness.*`, when given), its seats (`--seat.ID`, scripted ones' scripts too) checked against the
    taskset's."""
    taskset = load_taskset(config.taskset.id, config.taskset_options())
    taskset = taskset.with_runtime(config.env.runtime).with_harness(config.env.harness)
    if config.seat:  # a seat the taskset has not, or a script it cannot play, fails here
        seats = bind(seats_of(taskset), {name: Seat(script=c.script) for name, c in config.seat.items()}, taskset.id)
        check_scripts(multi_agent_class(taskset), seats)
    return taskset


def check_host(config: EvalConfig, taskset: Taskset) -> None:
    """Before any folder: a server at `--env.address` of another taskset or config fails, and so does a sandbox
    this host cannot run as asked (a server elsewhere checked its own host)."""
    if config.env.address is not None:
        asyncio.run(check_env_server(config.env.address, taskset))
    else:
        check_taskset(taskset)


def check_images(config: EvalConfig, taskset: Taskset) -> None:
    """Before any folder: a taskset that shows images and a model that takes text only fail, naming the taskset,
    the task and the message (`envs.image_input`)."""
    choice = config.model_choice()
    check_images_taken(taskset, choice_takes_images(choice), choice.display_name())


def reached(config: EvalConfig) -> tuple[EvalConfig, Endpoint | None]:
    """The endpoint at `--model.base-url`, asked once before any folder is made, and the config naming the model
    that answered; (config, None) when the run serves its model itself."""
    if config.model.base_url is None:
        return config, None
    endpoint = reach(config.model_choice())
    if endpoint.client == "tokens":  # else every rollout would fail on it: once, here, naming the flag
        load_renderer(endpoint.tokenizer or endpoint.model, endpoint.renderer)
    return config.model_copy(update={"model": config.model.model_copy(update={"name": endpoint.model})}), endpoint


def run_combined(args: list[str], folder: CombinedFolder | None = None, saved: dict | None = None) -> int:
    """Several tasksets (`tracegym eval A B C`, `[[eval.env]]`), or `--resume` of such a run (`folder`, its
    `saved` config): every taskset loaded and checked before any folder is made, the model reached (or served)
    once, each taskset run into its own run folder in turn, then the combined summary. Exit 1 when any taskset's
    run failed past `--max-error-rate`."""
    source = str(folder.config_path) if folder else "the saved config"
    config = parse_combined_args(args, defaults=saved, source=source, description=USAGE)
    if folder is not None and saved is not None:
        check_same_run(saved, config, folder)
    configs = [entry_config(config, i) for i in range(len(config.eval.env))]
    tasksets = [loaded(member) for member in configs]
    if config.dry_run:
        print(tomli_w.dumps(config.to_toml_dict()), end="")
        return 0
    for member, taskset in zip(configs, tasksets, strict=True):
        check_host(member, taskset)
        check_images(member, taskset)
    if not config.serve:
        configure_admission(config.env.sandbox)
    config, endpoint = reached(config)
    new = folder is None
    members = [Member.of(env, member.model_copy(update={"model": config.model}), taskset, new=new)
               for env, member, taskset in zip(config.eval.env, configs, tasksets, strict=True)]
    if folder is None:  # made once every taskset's work is found: a taskset whose loading fails leaves none
        folder = CombinedFolder.create_for(config.output_dir, config.eval.env, members[0].parts.model.display_name(),
                                           config.run_id)
    with owned(folder.path):
        if new:
            folder.write_config(config.to_toml_dict())
        _, summaries = CombinedRun(folder, members).run(endpoint)
    codes = [verdict(summary, config.max_error_rate, name=member.env.folder_name())
             for member, summary in zip(members, summaries, strict=True)]
    return max(codes, default=0)


def verdict(summary: Summary | EpisodeSummary, max_error_rate: float, name: str = "") -> int:
    """The exit code of a finished run: 1, saying why on stderr (naming the taskset's run `name` of a combined
    run), when too much of it failed; else 0."""
    failed = too_many_failed(summary, max_error_rate)
    if failed is None:
        return 0
    print(f"tracegym eval: {name + ': ' if name else ''}{failed}", file=sys.stderr)
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
