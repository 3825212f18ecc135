"""Launcher: starts every process of an RL run (vLLM, `model.servers` of them, one env server per environment, the
orchestrator, the trainer), each with its own log in the run folder, and supervises them: if one dies, all are
stopped and the user is told which one and shown the tail of its log (one of several vLLM servers dying is
reported and the run goes on with the others). Ctrl-C (and SIGTERM, which `tracegym rl` turns into one)
stops everything; a launcher killed outright leaves nothing either: each process exits with it.

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
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tracegym.core.errors import InfrastructureError
from tracegym.envs.registry import load_taskset
from tracegym.models.embedded import embedded_model_dir
from tracegym.models.launch import server_config
from tracegym.models.vllm_server import VLLMServerConfig, is_cpu_build, log_tail
from tracegym.models.vllm_servers import VLLMServers
from tracegym.runtimes import processes
from tracegym.serve.env_client import check_env_server
from tracegym.serve.local_server import local_server
from tracegym.train.malloc import Malloc, malloc_env, preload
from tracegym.train.regeneration import STOPPED_EXIT
from tracegym.train.rl_config import RLConfig, env_servers, lora_slots
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import LAUNCHER_PID_ENV
from tracegym.train.teacher import core_split, served_here, teacher_endpoints
from tracegym.train.weight_sync import sync_mode

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


def with_model_paths(config: RLConfig) -> RLConfig:
    """The config with the trainer's model set to the served model's directory (the embedded one by default)."""
    if config.trainer.model:
        return config
    trainer = config.trainer.model_copy(update={"model": config.model.name or str(embedded_model_dir())})
    return config.model_copy(update={"trainer": trainer})


def with_cpu_threads(config: RLConfig) -> RLConfig:
    """The config with the trainer's torch threads set, where unset, to half this machine's cores when it trains
    on the CPU beside a vLLM of the CPU build started here: that vLLM's model worker binds itself to the other
    cores, and generation of the next step overlaps training. On 2 cores (trainer 1 thread, vLLM's worker the
    other core) a reverse-text loop step took 6.0-6.3 s, against 7.1 s with the trainer on both cores
    (`benchmarks/rl_step_vs_trl.py --loop`)."""
    trainer = config.trainer
    if trainer.num_threads or trainer.device == "cuda" or not is_cpu_build():
        return config
    threads = max(1, (os.cpu_count() or 2) // 2)
    return config.model_copy(update={"trainer": trainer.model_copy(update={"num_threads": threads})})


def vllm_config(config: RLConfig, run_dir: Path) -> VLLMServerConfig:
    """vLLM serving the base model (with runtime LoRA loading for the policy adapter and the opponent pool's,
    or in-place merges of the adapter or reloads of merged weights), stamping every response with the policy
    version that served it."""
    served = server_config(config.model, log_path=RLFolder(run_dir).log_path("vllm"))
    env = preload(config.trainer.malloc, os.environ.get("LD_PRELOAD", ""))  # vLLM's CPU docs ask for it too
    served = served.model_copy(update={"max_lora_rank": max(16, config.trainer.lora_rank),
                                       "max_loras": lora_slots(config), "env": env,
                                       "cpu_kv_cache_gib": config.kv_cache_gib, "report_policy_version": True})
    return sync_mode(config.weight_sync, config.trainer.lora).vllm_config(served)


def role_command(name: str, run_dir: Path, processes: int = 1) -> list[str]:
    """The command of one role: `python -m tracegym.train.roles NAME RUN_DIR`, under torchrun with `processes`
    ranks on this machine when there are several."""
    role = ["-m", "tracegym.train.roles", name, str(run_dir)]
    if processes == 1:
        return [sys.executable, *role]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", *role]


def start_role(name: str, run_dir: Path, processes: int = 1, malloc: Malloc = "system") -> Role:
    """Start one role (`processes` ranks of it under torchrun when several, with the `malloc` allocator), logging
    to its log file."""
    log_path = RLFolder(run_dir).log_path(name)
    log = log_path.open("ab")
    env = {**malloc_env(malloc), LAUNCHER_PID_ENV: str(os.getpid())}
    proc = subprocess.Popen(role_command(name, run_dir, processes), stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    return Role(name, proc, log_path, log)


def launch(config: RLConfig, run_dir: Path, out: IO[str] = sys.stdout) -> int:
    """Run the whole RL run; 0 when every step trained, 1 when a process died (named, with its log tail)."""
    folder = RLFolder(run_dir)
    folder.logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        count = config.model.servers
        say(out, "starting vLLM ..." if count == 1 else f"starting {count} vLLM servers ...")
        served = vllm_config(config, run_dir)
        student_cores, teacher_cores = core_split(config)
        servers = stack.enter_context(VLLMServers(served, count, student_cores))
        if served_here(config):
            say(out, "starting the teacher's vLLM ...")
        teacher = stack.enter_context(teacher_endpoints(config, folder.log_path("teacher-vllm"), teacher_cores))
        envs = start_env_servers(config, run_dir, stack, out)
        folder.rewind()  # both processes go on from the newest checkpoint
        first, *rest = servers.base_urls
        folder.write_endpoints(Endpoints(base_url=first, replicas=rest, base_model=served.name, envs=envs, **teacher))
        trainer = start_role("trainer", run_dir, config.trainer.num_processes, config.trainer.malloc)
        roles = [trainer, start_role("orchestrator", run_dir)]
        say(out, f"running {config.steps} steps; metrics: {folder.metrics.path}, logs: {folder.logs}")
        try:
            return supervise(roles, servers, out)
        finally:
            for role in roles:
                role.stop()


def start_env_servers(config: RLConfig, run_dir: Path, stack: contextlib.ExitStack,
                      out: IO[str]) -> dict[str, list[str]]:
    """The run's env servers (`env_servers`) started here; an environment with an `address` uses the server(s)
    running there instead (after checking that they serve what the config says)."""
    addresses = {}
    for key, env in env_servers(config).items():
        if env.address is not None:
            asyncio.run(check_env_server(env.address, load_taskset(env.id, env.options)))
            addresses[key] = env.address
            say(out, f"env server {key}: {', '.join(env.address)} (running elsewhere)")
            continue
        log_dir = RLFolder(run_dir).env_log_dir(key)
        addresses[key] = [stack.enter_context(local_server(env.id, env.options, log_dir=log_dir,
                                                           worker_timeout=env.worker_timeout))]
        say(out, f"env server {key}: {addresses[key][0]}")
    return addresses


def supervise(roles: list[Role], servers: VLLMServers, out: IO[str]) -> int:
    """Wait until the orchestrator and trainer both finish; stop at the first failure and report it. Of several
    vLLM servers, one that dies is reported and the run goes on with the others (rollouts move to them); the
    last one dying ends the run."""
    lost: set[str] = set()
    while True:
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
