"""Launcher: runs an RL run's launch plan (`launch_plan`) on this machine: starts every process in it (vLLM,
`model.servers` of them, the teacher's vLLM when the run serves it, one env server per environment, the
orchestrator, the trainer), each with its own log in the run folder, and supervises them: if one dies, all are
stopped and the user is told which one and shown the tail of its log (one of several vLLM servers dying is
reported and the run goes on with the others). Each role's stages report their progress (`runtimes.watchdog`); the
launcher names a stage silent past its soft budget and stops the run when one is past its hard budget. Ctrl-C (and
SIGTERM, which `tracegym rl` turns into one) stops everything; a launcher killed outright leaves nothing either:
each process exits with it.

With `trainer.num_processes` N > 1 the trainer role is started under `torchrun` (torch's `torch.distributed.run`,
one node, N ranks that find each other on loopback); torchrun stops every rank when one fails or it is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tracegym.core.errors import InfrastructureError, UsageError
from tracegym.models.embedded import embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, is_cpu_build, log_tail
from tracegym.models.vllm_servers import VLLMServers
from tracegym.runtimes import processes
from tracegym.runtimes.watchdog import (
    DRAIN_CANCELLED_EXIT,
    STALLED_EXIT,
    ProgressFiles,
    ShutdownDeadline,
    Stage,
    WatchdogConfig,
)
from tracegym.serve.env_client import check_env_server_runs
from tracegym.serve.local_server import local_server
from tracegym.train.launch_plan import LaunchPlan, RolePlan, TeacherPlan
from tracegym.train.malloc import malloc_env
from tracegym.train.regeneration import STOPPED_EXIT
from tracegym.train.rl_config import EnvChoice, RLModel
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import LAUNCHER_PID_ENV
from tracegym.train.trainer import TrainerConfig

STOP_GRACE_S = 20.0


@dataclass
class Role:
    """One supervised child process and its log."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def stop(self) -> None:
        processes.stop(self.proc, STOP_GRACE_S)
        self.log.close()


def with_model_paths(trainer: TrainerConfig, model: RLModel) -> TrainerConfig:
    """The trainer section with its model set, where unset, to the served model's directory (the embedded one by
    default)."""
    if trainer.model:
        return trainer
    return trainer.model_copy(update={"model": model.name or str(embedded_model_dir())})


def with_cpu_threads(trainer: TrainerConfig) -> TrainerConfig:
    """The trainer section with its torch threads set, where unset, to half this machine's cores when it trains
    on the CPU beside a vLLM of the CPU build started here: that vLLM's model worker binds itself to the other
    cores, and generation of the next step overlaps training. On 2 cores (trainer 1 thread, vLLM's worker the
    other core) a reverse-text loop step took 6.0-6.3 s, against 7.1 s with the trainer on both cores
    (`benchmarks/rl_step_vs_trl.py --loop`)."""
    if trainer.num_threads or trainer.device == "cuda" or not is_cpu_build():
        return trainer
    return trainer.model_copy(update={"num_threads": max(1, (os.cpu_count() or 2) // 2)})


def start_role(role: RolePlan, run_dir: Path) -> Role:
    """Start one role (its ranks under torchrun when several, with its allocator), logging to its log file."""
    log_path = RLFolder(run_dir).log_path(role.name)
    log = log_path.open("ab")
    env = {**malloc_env(role.malloc), LAUNCHER_PID_ENV: str(os.getpid())}
    proc = subprocess.Popen(role.command(run_dir), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    return Role(role.name, proc, log_path, log)


def launch(plan: LaunchPlan, out: IO[str] = sys.stdout, watchdog: WatchdogConfig | None = None) -> int:
    """Run the whole RL run here, as `plan` says; 0 when every step trained, 1 when a process died (named, with
    its log tail), 5 when a stage made no progress within its `watchdog` budget (6 when that was only the
    held-out evaluation after the last step). Stopping the processes has the shutdown budget, then they are
    killed."""
    if plan.slurm is not None:
        raise UsageError("this run is laid out for Slurm (cluster = 'slurm'): submit its batch script instead")
    watchdog = watchdog or WatchdogConfig()
    folder = RLFolder(plan.run_dir)
    folder.logs.mkdir(parents=True, exist_ok=True)
    for old in folder.logs.glob("progress-*.json"):  # an earlier session's (a resume): no role of this one's
        old.unlink()
    with ShutdownDeadline(watchdog.shutdown) as deadline, contextlib.ExitStack() as stack:
        count = plan.vllm_servers
        say(out, "starting vLLM ..." if count == 1 else f"starting {count} vLLM servers ...")
        servers = stack.enter_context(VLLMServers(plan.vllm, count, plan.vllm_cores))
        if plan.teacher.server is not None:
            say(out, "starting the teacher's vLLM ...")
        teacher = stack.enter_context(start_teacher(plan.teacher))
        envs = start_env_servers(plan.env_servers, plan.run_dir, stack, out)
        folder.rewind()  # both processes go on from the newest checkpoint
        first, *rest = servers.base_urls
        folder.write_endpoints(Endpoints(base_url=first, replicas=rest, base_model=plan.vllm.name, envs=envs,
                                         **teacher))
        roles = [start_role(plan.trainer, plan.run_dir), start_role(plan.orchestrator, plan.run_dir)]
        say(out, f"running {plan.steps} steps; metrics: {folder.metrics.path}, logs: {folder.logs}")
        return run_roles(roles, servers, out, ProgressFiles(folder.logs, watchdog), deadline)


def run_roles(roles: list[Role], servers: VLLMServers, out: IO[str], progress: ProgressFiles,
              deadline: ShutdownDeadline) -> int:
    """Supervise the started roles to the end (`supervise`), then stop them, within the shutdown `deadline`."""
    try:
        return supervise(roles, servers, out, progress)
    finally:
        deadline.start()
        for role in roles:
            role.stop()


@contextlib.contextmanager
def start_teacher(teacher: TeacherPlan) -> Iterator[dict[str, Any]]:
    """`Endpoints`' teacher fields, with the vLLM server of a teacher served here started (and stopped on exit)."""
    if teacher.server is None:
        yield teacher.endpoints()
        return
    with VLLMServer(teacher.server) as server:
        yield teacher.endpoints(server.base_url)


def start_env_servers(envs: dict[str, EnvChoice], run_dir: Path, stack: contextlib.ExitStack,
                      out: IO[str]) -> dict[str, list[str]]:
    """The env servers `envs` names started here; an environment with an `address` uses the server(s) running
    there instead (after checking that they serve what the config says)."""
    addresses = {}
    for key, env in envs.items():
        if env.address is not None:
            asyncio.run(check_env_server_runs(env.address, env.id, env.options))
            addresses[key] = env.address
            say(out, f"env server {key}: {', '.join(env.address)} (running elsewhere)")
            continue
        log_dir = RLFolder(run_dir).env_log_dir(key)
        addresses[key] = [stack.enter_context(local_server(env.id, env.options, log_dir=log_dir, pool=env))]
        say(out, f"env server {key}: {addresses[key][0]}")
    return addresses


def supervise(roles: list[Role], servers: VLLMServers, out: IO[str], progress: ProgressFiles | None = None) -> int:
    """Wait until the orchestrator and trainer both finish; stop at the first failure and report it. Of several
    vLLM servers, one that dies is reported and the run goes on with the others (rollouts move to them); the
    last one dying ends the run. `progress`: the roles' stages, judged each look (`judge`)."""
    lost: set[str] = set()
    while True:
        if progress is not None and (code := judge(progress, out)) is not None:
            return code
        codes = {r.name: r.proc.poll() for r in roles}
        failed = [r for r in roles if codes[r.name] not in (None, 0)]
        check_servers(servers, lost, out)
        if failed:
            role = failed[0]
            if codes[role.name] == STOPPED_EXIT:  # it says why on its last line
                say(out, f"stopping everything: {log_tail(role.log_path, 1)}")
                return 1
            say(out, f"{role.name} died (exit {codes[role.name]}); stopping everything. Its log ends:")
            print(log_tail(role.log_path), file=out, flush=True)
            return 1
        if all(code == 0 for code in codes.values()):
            say(out, "done")
            return 0
        time.sleep(0.5)


def judge(progress: ProgressFiles, out: IO[str]) -> int | None:
    """Say each new watchdog warning; the exit code when a stage is past its hard budget (saying why), else None."""
    warnings, stalled = progress.check()
    for warning in warnings:
        say(out, warning)
    if stalled is None:
        return None
    role, stall = stalled
    if stall.stage == Stage.EVAL_DRAIN:
        say(out, f"every step trained; the held-out evaluation after the last step was cancelled: {role}: "
                 f"{stall.line()}; stopping everything")
        return DRAIN_CANCELLED_EXIT
    say(out, f"stopping everything: {role}: {stall.line()}")
    return STALLED_EXIT


def check_servers(servers: VLLMServers, lost: set[str], out: IO[str]) -> None:
    """Report each vLLM server that died since the last look (adding it to `lost`); raise when none is left."""
    dead = [s for s in servers.servers if not s.running() and str(s.log_path) not in lost]
    if len(lost) + len(dead) == len(servers.servers):
        raise InfrastructureError(f"vLLM died; its log ends:\n{log_tail(dead[-1].log_path)}")
    for server in dead:
        lost.add(str(server.log_path))
        say(out, f"a vLLM server died; going on with the other {len(servers.servers) - len(lost)}. "
                 f"Its log ({server.log_path}) ends:\n{log_tail(server.log_path, 10)}")


def say(out: IO[str], text: str) -> None:
    print(f"rl: {text}", file=out, flush=True)
