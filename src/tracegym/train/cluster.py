"""Cluster launch: the Slurm batch script that runs an RL run's launch plan (`launch_plan`) on the nodes of one
allocation.

`tracegym rl @ run.toml --cluster slurm` writes the run folder (its `config.toml`) and `rl.sbatch` into it; the
run folder must be on a filesystem every node sees (batches, checkpoints and weights move through it, as on one
machine). The allocation's nodes are taken in order: `inference_nodes` vLLM servers, then `env_nodes` env server
hosts (none: the env servers run beside the orchestrator), then `trainer_nodes`, which run the trainer's ranks
under `torchrun` (`trainer.num_processes` per node, rendezvous at the first trainer node) and, on the first of
them, the orchestrator. Env servers listen beyond loopback, so the job makes a shared secret for them. A teacher
is reached at its `base_url`: the script serves none.

`sbatch` starts the script once; it asks `srun` for one task per node, each of which runs the same script with
`node` as its argument and does that node's part. Two steps in between are tracegym's own (`python -m
tracegym.train.cluster ...`): serving the run's vLLM on a node (as its plan configures it, bound to the node's
address), and, on the first trainer node, waiting until every server answers and writing `endpoints.json`.
The job ends when the trainer and orchestrator finish: the first trainer node marks the run done and the server
nodes stop.

A job that ends early comes back and goes on: the script asks to be requeued (`--requeue`: a preempted job is put
back in the queue by Slurm), and `REQUEUE_NOTICE_S` before its time limit Slurm signals it (`--signal`), when it
requeues itself (`scontrol requeue`). Each attempt (`SLURM_RESTART_COUNT`) starts every node's part afresh and, like
`tracegym rl --resume`, goes on from the run folder: the newest checkpoint, the batches made past it and the groups
of the unfinished step that had finished (`rl_folder`); nothing of the attempt that was stopped is lost or made
twice, so no checkpoint is needed before it stops. The job's log is appended to, attempt after attempt.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shlex
import socket
import sys
import time
from pathlib import Path

from tracegym.core.errors import InfrastructureError, TracegymError, UsageError
from tracegym.models import transport
from tracegym.train.launch_plan import LaunchPlan, plan_launch
from tracegym.train.rl_folder import Endpoints, Poll, RLFolder
from tracegym.train.roles import load_config

SCRIPT = "rl.sbatch"
REQUEUE_NOTICE_S = 300
"""How long before its time limit the job is signalled to requeue itself (Slurm's notice may come up to a minute
late)."""
HEALTH_WAIT_S = 1800.0
"""How long the first trainer node waits for every server to answer (vLLM loads big models slowly)."""


def sbatch_script(plan: LaunchPlan) -> str:
    """The batch script of `plan` laid out as its `slurm` section says, naming its run folder absolute (every node
    reads it)."""
    slurm = plan.slurm
    if slurm is None:
        raise UsageError("the run is planned for this machine (cluster = 'local'), not for Slurm")
    run_dir = plan.run_dir.resolve()
    envs = plan.started_env_servers()
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={slurm.job_name}",
        f"#SBATCH --nodes={plan.vllm_servers + slurm.env_nodes + plan.trainer.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={slurm.gpus_per_node}"] if slurm.gpus_per_node else []),
        *[f"#SBATCH --{flag}={value}" for flag, value in
          (("partition", slurm.partition), ("account", slurm.account), ("time", slurm.time)) if value],
        f"#SBATCH --output={run_dir}/logs/slurm-%j.log",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:USR1@{REQUEUE_NOTICE_S}",
        f"# Written by `tracegym rl ... --cluster slurm` for the run in {run_dir}. Submit: sbatch {run_dir / SCRIPT}",
        "set -euo pipefail",
        "",
        f"RUN_DIR={shlex.quote(str(run_dir))}",
        f"INFERENCE_NODES={plan.vllm_servers}",
        f"ENV_NODES={slurm.env_nodes}",
        f"TRAINER_NODES={plan.trainer.nodes}",
        f"RANKS_PER_NODE={plan.trainer.processes}",
        f"VLLM_PORT={slurm.vllm_port}",
        f"ENV_PORT={slurm.env_port}",
        f"MASTER_PORT={slurm.master_port}",
        "",
        "setup() {",
        f"    cd {shlex.quote(str(slurm.project_dir.resolve()))}",
        *[f"    {line}" for line in slurm.setup],
        "}",
        "",
        "# The allocation's nodes in order: inference, env servers, trainer.",
        'HOSTS=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )',
        'INFERENCE_HOSTS=( "${HOSTS[@]:0:INFERENCE_NODES}" )',
        'ENV_HOSTS=( "${HOSTS[@]:INFERENCE_NODES:ENV_NODES}" )',
        'TRAINER_HOSTS=( "${HOSTS[@]:INFERENCE_NODES+ENV_NODES:TRAINER_NODES}" )',
        'MASTER_ADDR="${TRAINER_HOSTS[0]}"',
        'ATTEMPT="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"  # a requeued job is the same job, once more',
        'READY="$RUN_DIR/slurm/ready-$ATTEMPT"',
        'DONE="$RUN_DIR/slurm/done-$ATTEMPT"',
        "",
        *_env_hosts(envs),
        "",
        NODE_FUNCTIONS,
        *_env_server_function(envs, slurm.env_port),
        "",
        MAIN,
    ]
    return "\n".join(lines) + "\n"


def _env_hosts(envs: dict) -> list[str]:
    """Bash: which host runs env server number i (in turn over the env nodes, else the first trainer node)."""
    lines = ['env_host() {  # env server number $1',
             '    if [ "$ENV_NODES" -gt 0 ]; then echo "${ENV_HOSTS[$(( $1 % ENV_NODES ))]}"; '
             'else echo "${TRAINER_HOSTS[0]}"; fi',
             '}']
    addresses = " ".join(f'--env {shlex.quote(key)}=tcp://$(env_host {i}):$((ENV_PORT + {i}))'
                         for i, key in enumerate(envs))
    return [*lines, f'ENV_ADDRESSES="{addresses}"' if envs else 'ENV_ADDRESSES=""']


def _env_server_function(envs: dict, port: int) -> list[str]:
    """Bash: start, in the background, the env servers whose turn falls on this host (`$1`)."""
    lines = ["start_env_servers() {  # this host's env servers, in the background"]
    for i, (key, env) in enumerate(envs.items()):
        command = ["tracegym", "serve", "--taskset.id", env.id, "--taskset-json", json.dumps(env.options),
                   *env.serve_args()]
        logs = f'"$RUN_DIR/logs/env-{key.replace(":", "-")}"'
        lines += [f'    if [ "$(env_host {i})" = "$1" ]; then',
                  f'        {shlex.join(command)} --log-dir {logs} --address "tcp://0.0.0.0:$((ENV_PORT + {i}))" \\',
                  f'            > {logs[:-1]}.log" 2>&1 &',
                  "        SERVERS+=($!)",
                  "    fi"]
    return [*lines, "    true", "}"]


NODE_FUNCTIONS = r'''serve_until_done() {  # this node's servers run until the run is done; one that dies fails the job
    while [ ! -e "$DONE" ]; do
        for pid in "${SERVERS[@]}"; do
            kill -0 "$pid" 2>/dev/null || { echo "a server on $(hostname) died" >&2; exit 1; }
        done
        sleep 5
    done
    kill "${SERVERS[@]}" 2>/dev/null || true
}'''

MAIN = r'''requeue() {  # the time limit is near (--signal): back in the queue; the next attempt resumes the run
    echo "tracegym: job $SLURM_JOB_ID nears its time limit; requeued, its next attempt resumes the run" >&2
    scontrol requeue "$SLURM_JOB_ID"
    kill -TERM "$SRUN" 2>/dev/null || true
}

if [ "${1:-}" != node ]; then  # on the batch host: one task per node, each running this script's node part
    mkdir -p "$RUN_DIR/logs" "$RUN_DIR/slurm"
    [ "${SLURM_RESTART_COUNT:-0}" -eq 0 ] || echo "tracegym: attempt $ATTEMPT resumes the run in $RUN_DIR" >&2
    # Env servers listen beyond loopback: they and the orchestrator share a secret made for this job.
    export TRACEGYM_ENV_SECRET="${TRACEGYM_ENV_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
    srun --kill-on-bad-exit=1 bash "$RUN_DIR/rl.sbatch" node &
    SRUN=$!
    trap requeue USR1
    while true; do
        STATUS=0
        wait "$SRUN" || STATUS=$?
        kill -0 "$SRUN" 2>/dev/null || exit "$STATUS"  # srun ended: its status is the job's
    done  # a signal's trap ended the wait early: srun goes on until the requeue stops it
fi

setup
NODE=$SLURM_PROCID
HOST="${HOSTS[$NODE]}"
SERVERS=()
if [ "$NODE" -lt "$INFERENCE_NODES" ]; then
    python -m tracegym.train.cluster vllm "$RUN_DIR" "$VLLM_PORT" "$NODE" > "$RUN_DIR/logs/vllm-$NODE.log" 2>&1 &
    SERVERS+=($!)
    serve_until_done
elif [ "$NODE" -lt $((INFERENCE_NODES + ENV_NODES)) ]; then
    start_env_servers "$HOST"
    serve_until_done
else
    TRAINER_NODE=$((NODE - INFERENCE_NODES - ENV_NODES))
    if [ "$TRAINER_NODE" -eq 0 ]; then
        [ "$ENV_NODES" -gt 0 ] || start_env_servers "$HOST"
        VLLM_URLS=()
        for host in "${INFERENCE_HOSTS[@]}"; do VLLM_URLS+=(--vllm "http://$host:$VLLM_PORT/v1"); done
        python -m tracegym.train.cluster endpoints "$RUN_DIR" "${VLLM_URLS[@]}" $ENV_ADDRESSES
        touch "$READY"
        python -m tracegym.train.roles orchestrator "$RUN_DIR" >> "$RUN_DIR/logs/orchestrator.log" 2>&1 &
        ORCHESTRATOR=$!
    fi
    while [ ! -e "$READY" ]; do sleep 2; done
    python -m torch.distributed.run --nnodes="$TRAINER_NODES" --node-rank="$TRAINER_NODE" \
        --nproc-per-node="$RANKS_PER_NODE" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" \
        -m tracegym.train.roles trainer "$RUN_DIR" >> "$RUN_DIR/logs/trainer-node$TRAINER_NODE.log" 2>&1 &
    TRAINER=$!
    if [ "$TRAINER_NODE" -eq 0 ]; then  # the first of trainer and orchestrator to end is waited for first
        while kill -0 "$TRAINER" 2>/dev/null && kill -0 "$ORCHESTRATOR" 2>/dev/null; do sleep 5; done
        if kill -0 "$TRAINER" 2>/dev/null; then wait "$ORCHESTRATOR"; wait "$TRAINER"
        else wait "$TRAINER"; wait "$ORCHESTRATOR"; fi  # set -e: a failure ends the job (srun stops every node)
        touch "$DONE"
        kill "${SERVERS[@]}" 2>/dev/null || true
    else
        wait "$TRAINER"
    fi
fi'''


def write_sbatch(plan: LaunchPlan) -> Path:
    """Write `rl.sbatch` (and the `logs/` folder its job log goes to) into the plan's run folder, whose config the
    caller wrote; returns its path."""
    path = plan.run_dir.resolve() / SCRIPT
    (path.parent / "logs").mkdir(exist_ok=True)  # Slurm opens the job's log there before the script runs
    path.write_text(sbatch_script(plan))
    path.chmod(0o755)
    return path


# --- what the nodes run --------------------------------------------------------------------------------------
def serve_vllm(run_dir: Path, port: int, node: int) -> None:
    """Serve the run's model on this node, as its plan says but bound to every interface, until the process is
    stopped."""
    from tracegym.models.vllm_server import VLLMServer

    served = plan_launch(load_config(run_dir), run_dir).vllm
    served = served.model_copy(update={"host": "0.0.0.0", "port": port,
                                       "log_path": run_dir / "logs" / f"vllm-server-{node}.log"})
    with VLLMServer(served):
        while True:
            time.sleep(3600)


def write_endpoints(run_dir: Path, vllm_urls: list[str], envs: dict[str, str],
                    wait_s: float = HEALTH_WAIT_S) -> None:
    """Once every vLLM server and env server answers (up to `wait_s`), forget what a previous job made past the
    newest checkpoint and write `endpoints.json` for the roles (with the teacher at its `base_url`, if any)."""
    from tracegym.serve.env_client import check_env_server_runs

    if not vllm_urls:
        raise UsageError("--slurm.inference-nodes: the run needs at least one vLLM server")
    for url in [*vllm_urls, *envs.values()]:
        check_resolves(url)
    plan = plan_launch(load_config(run_dir), run_dir)
    for url in vllm_urls:
        Poll(f"vLLM at {url}", wait_s, every=5.0).wait(functools.partial(_answers, url))
    for key, address in envs.items():
        Poll(f"env server {key} at {address}", wait_s, every=5.0).wait(functools.partial(_env_answers, address))
        env = plan.env_servers[key]
        asyncio.run(check_env_server_runs(address, env.id, env.options))
    folder = RLFolder(run_dir)
    folder.rewind()
    first, *rest = vllm_urls  # the roles route across them (models.router) and publish to each
    folder.write_endpoints(Endpoints(base_url=first, replicas=rest, base_model=plan.vllm.name,
                                     envs={key: [address] for key, address in envs.items()},
                                     **plan.teacher.endpoints()))


def check_resolves(url: str) -> None:
    """A UsageError naming the node when the host in `url` has no address."""
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    try:
        socket.getaddrinfo(host, None)
    except OSError as exc:
        raise UsageError(f"node {host!r} (in {url}) does not resolve: {exc.strerror or exc}") from None


def _answers(base_url: str) -> bool:
    try:
        transport.call(base_url.removesuffix("/v1") + "/health", timeout=5.0)
    except TracegymError:
        return False
    return True


def _env_answers(address: str) -> bool:
    from tracegym.serve.env_client import EnvClient

    async def ping() -> None:
        async with EnvClient(address, request_timeout=5.0) as client:
            await client.health()

    try:
        asyncio.run(ping())
    except (TracegymError, OSError):
        return False
    return True


def main(argv: list[str]) -> int:
    """`python -m tracegym.train.cluster vllm RUN_DIR PORT NODE` or `... endpoints RUN_DIR --vllm URL ...
    [--env KEY=ADDRESS ...]`: a node's part of a Slurm run (see `MAIN`)."""
    try:
        if len(argv) == 4 and argv[0] == "vllm":
            serve_vllm(Path(argv[1]), int(argv[2]), int(argv[3]))
            return 0
        if len(argv) >= 2 and argv[0] == "endpoints":
            pairs = list(zip(argv[2::2], argv[3::2], strict=True))
            urls = [value for flag, value in pairs if flag == "--vllm"]
            envs = dict(value.split("=", 1) for flag, value in pairs if flag == "--env")
            write_endpoints(Path(argv[1]), urls, envs)
            return 0
    except (TracegymError, InfrastructureError) as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    print("usage: python -m tracegym.train.cluster {vllm RUN_DIR PORT NODE | endpoints RUN_DIR --vllm URL "
          "[--env KEY=ADDRESS ...]}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
