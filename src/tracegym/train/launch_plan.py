"""Launch plan: the processes of an RL run and how each starts, worked out once from the run's config.

`plan_launch` turns an `RLConfig` into a `LaunchPlan`: the policy's vLLM servers (their config, how many, their
cores), one env server per environment (started from its taskset, or running at an address already), how the
teacher is reached, the orchestrator and trainer roles (ranks, torchrun, threads) and the weight-sync mode. The
launcher runs a plan on this machine (`launcher.launch`); the Slurm batch script lays the same plan out on the
nodes of an allocation (`cluster.sbatch_script`); `tracegym rl --dry-run` prints it.

>>> plan = plan_launch(config, run_dir)  # doctest: +SKIP
>>> plan.trainer.command(run_dir)  # doctest: +SKIP
['python', '-m', 'tracegym.train.roles', 'trainer', 'outputs/rl/run']
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tracegym.core.errors import UsageError
from tracegym.models.launch import server_config
from tracegym.models.vllm_server import VLLMServerConfig, is_cpu_build
from tracegym.models.vllm_servers import CORES_ENV, core_shares
from tracegym.train.malloc import Malloc, preload
from tracegym.train.rl_config import (
    EnvChoice,
    OrchestratorConfig,
    RLConfig,
    RLModel,
    SlurmConfig,
    TeacherModel,
    env_servers,
    lora_slots,
    trainer_nodes,
)
from tracegym.train.rl_folder import RLFolder
from tracegym.train.trainer import TrainerConfig
from tracegym.train.weight_sync import SyncMode, sync_mode

TeacherRoute = Literal["none", "in_process", "base_url", "served"]
"""How a run reaches its teacher: it has none (`rl`), scores with it in the orchestrator's process (`[opd] scorer =
"transformers"`), calls it at its `base_url`, or serves it with a vLLM server of its own."""


class TeacherPlan(BaseModel):
    """How the run reaches its teacher, and what it starts for it."""

    model_config = ConfigDict(frozen=True)
    route: TeacherRoute = "none"
    base_urls: list[str] = []
    """`base_url`: the endpoint's API roots."""
    name: str | None = None
    """The model requests name (unset at a `base_url`: the one the endpoint lists first)."""
    server: VLLMServerConfig | None = None
    """`served`: the teacher's vLLM server."""

    def endpoints(self, served_url: str | None = None) -> dict[str, Any]:
        """`Endpoints`' teacher fields (`served_url`: where the server started for a `served` teacher answers)."""
        if self.route == "served":
            assert served_url is not None, "a served teacher is reached where its server answers"
            return {"teacher_base_url": [served_url], "teacher_model": self.name}
        return {"teacher_base_url": self.base_urls or None, "teacher_model": self.name}


class RolePlan(BaseModel):
    """One role of the run (`python -m tracegym.train.roles NAME RUN_DIR`): `processes` ranks on each of `nodes`
    machines, under torchrun when `torchrun`."""

    model_config = ConfigDict(frozen=True)
    name: Literal["orchestrator", "trainer"]
    processes: int = 1
    nodes: int = 1
    torchrun: bool = False
    malloc: Malloc = "system"
    """The allocator its processes start with."""
    threads: int | None = None
    """Torch CPU threads of each rank (None: torch's default)."""

    def command(self, run_dir: Path) -> list[str]:
        """The command that starts it on this machine: the role itself, or torchrun with its ranks on loopback."""
        role = ["-m", "tracegym.train.roles", self.name, str(run_dir)]
        if not self.torchrun:
            return [sys.executable, *role]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.processes}",
                *role]


class LaunchPlan(BaseModel):
    """The processes of one RL run in `run_dir`; on this machine, or on a Slurm allocation laid out as `slurm` says."""

    model_config = ConfigDict(frozen=True)
    run_dir: Path
    steps: int
    """Training steps."""
    vllm: VLLMServerConfig
    """The policy's vLLM server; each of `vllm_servers` is one of it (logging beside the first)."""
    vllm_servers: int = 1
    """Servers of the policy: `model.servers` here, one per inference node on Slurm."""
    vllm_cores: list[str] | None = None
    """On the CPU build beside a teacher served here: each policy server's share of the cores (the teacher's server
    has the last); None: the servers' own split (`VLLMServers`)."""
    env_servers: dict[str, EnvChoice]
    """Every env server by name (`rl_config.env_servers`): started from its environment's taskset (`id`, `options`,
    `worker_timeout`), or running at its `address` already."""
    teacher: TeacherPlan = TeacherPlan()
    orchestrator: RolePlan
    trainer: RolePlan
    weight_sync: SyncMode
    """How the trainer's weights reach vLLM (also in `vllm`: how it starts)."""
    slurm: SlurmConfig | None = None
    """The Slurm allocation's layout (`cluster = "slurm"`); None: everything runs on this machine."""

    def started_env_servers(self) -> dict[str, EnvChoice]:
        """The env servers the run starts itself (not those running elsewhere)."""
        return {key: env for key, env in self.env_servers.items() if env.address is None}


def plan_launch(config: RLConfig, run_dir: Path) -> LaunchPlan:
    """The plan of the run `config` describes (with its trainer section resolved: `launcher.with_model_paths`),
    writing its logs into `run_dir`; a UsageError when this machine has too few cores for its vLLM servers, or when
    a Slurm run would have to serve its teacher (the batch script starts no server for it)."""
    folder = RLFolder(run_dir)
    slurm = config.slurm if config.cluster == "slurm" else None
    mode = sync_mode(config.weight_sync, config.trainer.lora)
    route = teacher_route(config.teacher, in_process=config.mode == "opd" and config.opd.scorer == "transformers")
    if route == "served" and slurm is not None:
        raise UsageError("[teacher] name: a Slurm run does not serve its teacher; serve it where the nodes reach it "
                         "(e.g. `tracegym inference`) and set [teacher] base_url")
    shares = core_split(config.model.servers) if route == "served" and slurm is None else None
    teacher = plan_teacher(config.teacher, route, config.kv_cache_gib, folder.log_path("teacher-vllm"),
                           shares[-1] if shares else None)
    vllm = plan_vllm(config.model, config.trainer, config.orchestrator, mode, config.kv_cache_gib,
                     folder.log_path("vllm"))
    return LaunchPlan(run_dir=run_dir, steps=config.steps, vllm=vllm,
                      vllm_servers=config.model.servers if slurm is None else slurm.inference_nodes,
                      vllm_cores=shares[:-1] if shares else None, env_servers=env_servers(config.orchestrator),
                      teacher=teacher, orchestrator=RolePlan(name="orchestrator"),
                      trainer=plan_trainer(config.trainer, trainer_nodes(config.cluster, config.slurm),
                                           torchrun=slurm is not None or config.trainer.num_processes > 1),
                      weight_sync=mode, slurm=slurm)


def plan_vllm(model: RLModel, trainer: TrainerConfig, orchestrator: OrchestratorConfig, mode: SyncMode,
              kv_cache_gib: float, log_path: Path) -> VLLMServerConfig:
    """vLLM serving the base model as `mode` needs it (runtime LoRA loading for the policy adapter and the opponent
    pool's, or in-place merges of the adapter or reloads of merged weights), stamping every response with the
    policy version that served it."""
    served = server_config(model, log_path=log_path)
    env = preload(trainer.malloc, os.environ.get("LD_PRELOAD", ""))  # vLLM's CPU docs ask for it too
    served = served.model_copy(update={"max_lora_rank": max(16, trainer.lora_rank),
                                       "max_loras": lora_slots(orchestrator), "env": env,
                                       "cpu_kv_cache_gib": kv_cache_gib, "report_policy_version": True})
    return mode.vllm_config(served)


def teacher_route(teacher: TeacherModel | None, in_process: bool) -> TeacherRoute:
    """How the run reaches `teacher`: at its `base_url` when set; else in the orchestrator's process when
    `in_process`, or through a vLLM server of its own."""
    if teacher is None:
        return "none"
    if teacher.base_url is not None:
        return "base_url"
    return "in_process" if in_process else "served"


def core_split(servers: int) -> list[str] | None:
    """On the CPU build, beside a teacher served here: the cores split into `servers + 1` shares, so the policy's
    servers and the teacher's (the last share) do not fight over the same cores; else None."""
    return core_shares(servers + 1) if is_cpu_build() else None


def plan_teacher(teacher: TeacherModel | None, route: TeacherRoute, kv_cache_gib: float, log_path: Path,
                 cores: str | None) -> TeacherPlan:
    """The teacher reached by `route`; a `served` one gets a vLLM server logging to `log_path` (bound to `cores`)."""
    if teacher is None or route in ("none", "in_process"):
        return TeacherPlan(route=route)
    if route == "base_url":
        return TeacherPlan(route=route, base_urls=teacher.base_urls(), name=teacher.name)
    served = server_config(teacher, log_path=log_path)
    env = {**served.env, CORES_ENV: cores} if cores else served.env
    served = served.model_copy(update={"cpu_kv_cache_gib": kv_cache_gib, "env": env})
    return TeacherPlan(route=route, name=served.name, server=served)


def plan_trainer(trainer: TrainerConfig, nodes: int, torchrun: bool) -> RolePlan:
    """The trainer role: `trainer.num_processes` ranks on each of `nodes` machines."""
    return RolePlan(name="trainer", processes=trainer.num_processes, nodes=nodes, torchrun=torchrun,
                    malloc=trainer.malloc, threads=trainer.num_threads)
