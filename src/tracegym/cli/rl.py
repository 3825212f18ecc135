"""`tracegym rl @ config.toml [--resume RUN_DIR] [--dry-run] [--cluster slurm]`: train a model with RL on tracegym
environments (here, or through a Slurm batch script it writes); `tracegym rl --replay RUN_DIR --step K` trains a
stored step again and checks it bit for bit (`train.replay`)."""

from __future__ import annotations

import sys
from pathlib import Path

import tomli_w

from tracegym.cli.flag import pop_flag
from tracegym.cli.interrupt import sigterm_unwinds
from tracegym.cli.validate import preflight
from tracegym.config.run_dir import owned
from tracegym.config.toml_data import toml_ready
from tracegym.core.errors import UsageError
from tracegym.envs.registry import load_taskset
from tracegym.envs.task_sandbox import check_taskset
from tracegym.models.embedded_vlm import resolved_vlm
from tracegym.train.cluster import write_sbatch
from tracegym.train.image_run import ImageRun, check_image_run
from tracegym.train.launch_plan import LaunchPlan, plan_launch
from tracegym.train.launcher import launch, say, with_cpu_threads, with_model_paths
from tracegym.train.rl_config import RLConfig, env_servers, parse_rl_args
from tracegym.train.rl_folder import RLFolder
from tracegym.train.run_tally import RunTally
from tracegym.train.teacher import check_teacher


def run(args: list[str]) -> int:
    """Validate, then start (or resume) the run and supervise it to the end."""
    replayed, args = pop_flag(args, "--replay")
    if replayed is not None:
        return replay_step(Path(replayed), args)
    resume, rest = pop_flag(args, "--resume")
    checked = "--validate" in rest  # a pre-flight: the training environments' gold passes, a no-op is not paid
    config, warnings = parse_rl_args([a for a in rest if a != "--validate"])
    config = config.model_copy(update={"model": resolved_vlm(config.model)})
    config = config.model_copy(update={"trainer": with_cpu_threads(with_model_paths(config.trainer, config.model))})
    for warning in warnings:
        print(f"tracegym rl: warning: {warning}", file=sys.stderr)
    if config.mode == "opd" and config.teacher is not None:
        try:
            check_teacher(config.teacher, config.opd.scorer, config.trainer.model, config.model.tokenizer)
        except UsageError as exc:  # a dry run shows the plan of a teacher still to be trained, and says so
            if not config.dry_run:
                raise
            print(f"tracegym rl: warning: {exc} (a run would stop here)", file=sys.stderr)
    check_image_run(env_servers(config.orchestrator).values(), ImageRun(  # every piece that meets images takes them
        config.model, config.mode, config.teacher, config.trainer.lora_projector, config.weight_sync,
        config.opd.scorer))
    if checked and not preflight(config.orchestrator.train.envs):
        print("tracegym rl: --validate: a training environment is not clean (above); nothing was started",
              file=sys.stderr)
        return 1
    if config.dry_run and config.cluster == "local":
        print(resolved(config, plan_launch(config, Path(resume or config.output_dir / "<run-id>"))), end="")
        return 0
    if config.cluster == "local":  # a sandbox this host cannot run as asked fails before any process starts
        check_sandboxes(config)
    folder = RLFolder.resume(Path(resume)) if resume is not None else RLFolder.create(config.output_dir,
                                                                                       config.run_id)
    with owned(folder.path):
        folder.write_config(_toml(config))
        plan = plan_launch(config, folder.path)
        if plan.slurm is not None:  # nothing runs here: the script does, on the allocation
            script = write_sbatch(plan)
            print(f"tracegym rl: wrote {script} (run folder {folder.path.resolve()}; it must be on storage every "
                  f"node sees); submit it with: sbatch {script}")
            return 0
        sigterm_unwinds()  # SIGTERM stops every process of the run, as Ctrl-C does
        return verdict(launch(plan, watchdog=config.watchdog), folder, config.max_error_rate)


def replay_step(run_dir: Path, args: list[str]) -> int:
    """`--replay RUN_DIR --step K`: step K of that run trained again from its stored inputs; 0 when the weights
    equal the run's bit for bit, 1 (naming the first step and tensor that differ) when not."""
    from tracegym.train.image_inputs import folder_source
    from tracegym.train.replay import replay
    from tracegym.train.roles import load_config
    from tracegym.train.trainer import build_trainer

    step, rest = pop_flag(args, "--step")
    if step is None or not step.isdigit() or rest:
        raise UsageError("usage: tracegym rl --replay RUN_DIR --step K (K: a trained step, from 0)")
    if not (run_dir / "config.toml").is_file():
        raise UsageError(f"--replay: {run_dir} is not an RL run folder (no config.toml)")
    images = folder_source(RLFolder(run_dir).images.folder)  # a VLM's run reads its images where it stored them
    result = replay(run_dir, int(step), load_config(run_dir).trainer, lambda c: build_trainer(c, images=images))
    print(f"tracegym rl: {result.line()}")
    return 0 if result.equal else 1


def check_sandboxes(config: RLConfig) -> None:
    """`check_taskset` for the taskset of each env server the run starts here (one running elsewhere checked its
    own host when it started)."""
    for env in env_servers(config.orchestrator).values():
        if env.address is None:
            check_taskset(load_taskset(env.id, env.options))


def verdict(code: int, folder: RLFolder, max_error_rate: float) -> int:
    """The exit code of a finished run (`code`: the launcher's), after its headline: 1, saying why on stderr, when
    more than `max_error_rate` of it failed (`RunTally.too_many_failed`)."""
    tally = RunTally.of(folder.metrics.read())
    if tally.steps:
        say(sys.stdout, tally.headline())
    failed = tally.too_many_failed(max_error_rate)
    if failed is not None:
        print(f"tracegym rl: {failed}", file=sys.stderr)
        return code or 1
    return code


SEATING = {"play", "seats", "difficulty"}
"""An environment's fields the orchestrator uses (to seat episodes, to pick tasks), not its env server."""


def resolved(config: RLConfig, plan: LaunchPlan) -> str:
    """The config of every process, as TOML sections: the run's, its vLLM server's, one per env server the
    launcher would start or reach, and the rest of the launch plan (teacher, roles, weight sync)."""
    sections = {
        "run": _toml(config),
        "vllm": plan.vllm.model_dump(mode="json", exclude_none=True),
        "env_servers": {key: env.model_dump(mode="json", exclude=SEATING) for key, env in plan.env_servers.items()},
        "plan": plan.model_dump(mode="json", exclude={"vllm", "env_servers"}),
    }
    return tomli_w.dumps(toml_ready(sections))


def _toml(config: RLConfig) -> dict:
    return toml_ready(config.model_dump(mode="json", exclude={"dry_run"}))
