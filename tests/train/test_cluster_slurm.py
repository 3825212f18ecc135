"""The Slurm batch script of an RL run: what it is for a fixture config, and what it starts on which node when
run on a simulated allocation (stand-ins for `scontrol`, `srun`, `python` and `tracegym` that record their calls)."""

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.core.errors import UsageError
from tracegym.testing import FakeOpenAIServer
from tracegym.train.cluster import REQUEUE_NOTICE_S, check_resolves, sbatch_script, write_endpoints, write_sbatch
from tracegym.train.launch_plan import plan_launch
from tracegym.train.rl_config import parse_rl_args
from tracegym.train.rl_folder import Poll, RLFolder

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHIPPED = CONFIGS / "rl" / "reverse_text.toml"
FIXTURE = Path(__file__).with_name("data") / "slurm_reverse_text.sbatch"
LAYOUT = ["--cluster", "slurm", "--trainer.num-processes", "4", "--slurm.trainer-nodes", "2",
          "--slurm.env-nodes", "1", "--slurm.partition", "gpu", "--slurm.time", "04:00:00",
          "--slurm.project-dir", "/shared/tracegym"]


def config(*args: str):
    return parse_rl_args(["@", str(SHIPPED), *LAYOUT, *args])[0]


def test_the_script_for_the_shipped_config_matches_the_fixture():
    script = sbatch_script(plan_launch(config(), Path("/shared/runs/reverse-text")))
    if os.environ.get("TRACEGYM_UPDATE_FIXTURES"):
        FIXTURE.write_text(script)
    assert script == FIXTURE.read_text()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_more_ranks_than_rollouts_per_step_names_the_flag():
    with pytest.raises(UsageError, match=r"--trainer.num-processes: 64 trainer ranks.*only 32 rollouts"):
        config("--trainer.num-processes", "32")


def test_a_node_that_does_not_resolve_is_named():
    with pytest.raises(UsageError, match=r"node 'no-such-node\.invalid'"):
        check_resolves("http://no-such-node.invalid:8000/v1")


FAKES = {
    "scontrol": """if [ "$1" = requeue ]; then echo "scontrol $*" >> "$SIM_LOG"; else printf "%s\\n" $SIM_NODES; fi""",
    "srun": """while [[ "$1" == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do SLURM_PROCID=$i "$@" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid"; done""",
    # servers run until the script stops them; everything else records its call and ends at once
    "python": """echo "node=$SLURM_PROCID python $*" >> "$SIM_LOG"
case "$*" in *"cluster vllm"*) exec sleep 60;; esac""",
    "tracegym": """echo "node=$SLURM_PROCID tracegym $*" >> "$SIM_LOG"
exec sleep 60""",
}


def allocation(tmp_path, nodes: str, *args: str, fakes: dict[str, str] = FAKES, restart: int = 0,
               ) -> tuple[list[str], dict[str, str]]:
    """The command that runs the script written for `args` on a simulated allocation of `nodes` (the stand-ins
    `fakes`; `restart`: the job's attempt), and its environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    run_config = config("--slurm.setup", "[]", "--slurm.project-dir", str(tmp_path), *args)
    script = write_sbatch(plan_launch(run_config, run_dir))
    log = tmp_path / "calls.log"
    count = len(nodes.split())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SIM_NODES": nodes,
           "SIM_LOG": str(log), "SLURM_JOB_NODELIST": f"sim[1-{count}]", "SLURM_JOB_NUM_NODES": str(count),
           "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": str(restart)}
    return ["bash", str(script)], env


def simulate(tmp_path, nodes: str, *args: str, restart: int = 0) -> tuple[list[str], str]:
    """Run the script written for `args` on a simulated allocation of `nodes`; the calls each node made (sorted) and
    the run folder."""
    command, env = allocation(tmp_path, nodes, *args, restart=restart)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return sorted(Path(env["SIM_LOG"]).read_text().splitlines()), str((tmp_path / "run").resolve())


def test_each_node_starts_its_part_with_the_others_addresses(tmp_path):
    calls, run = simulate(tmp_path, "gpu1 cpu1 gpu2 gpu3")
    run_dir = tmp_path / "run"
    torchrun = ("python -m torch.distributed.run --nnodes=2 --node-rank={} --nproc-per-node=4 --master-addr=gpu2 "
                f"--master-port=29500 -m tracegym.train.roles trainer {run}")
    assert calls == sorted([
        f"node=0 python -m tracegym.train.cluster vllm {run} 8000 0",
        "node=1 tracegym serve --taskset.id reverse-text --taskset-json {\"seed\": 0} "
        f"--log-dir {run}/logs/env-reverse-text --address tcp://0.0.0.0:5555",
        "node=1 tracegym serve --taskset.id reverse-text --taskset-json {\"seed\": 12345} "
        f"--log-dir {run}/logs/env-eval-reverse-text --address tcp://0.0.0.0:5556",
        f"node=2 python -m tracegym.train.cluster endpoints {run} --vllm http://gpu1:8000/v1 "
        "--env reverse-text=tcp://cpu1:5555 --env eval:reverse-text=tcp://cpu1:5556",
        f"node=2 python -m tracegym.train.roles orchestrator {run}",
        "node=2 " + torchrun.format(0),
        "node=3 " + torchrun.format(1),
    ])
    assert (run_dir / "slurm" / "done-77-0").exists()


def test_several_inference_nodes_each_serve_and_all_reach_the_endpoints(tmp_path):
    calls, run = simulate(tmp_path, "gpu1 gpu0 cpu1 gpu2 gpu3", "--slurm.inference-nodes", "2")
    assert f"node=0 python -m tracegym.train.cluster vllm {run} 8000 0" in calls
    assert f"node=1 python -m tracegym.train.cluster vllm {run} 8000 1" in calls
    [endpoints] = [c for c in calls if "cluster endpoints" in c]
    assert "--vllm http://gpu1:8000/v1 --vllm http://gpu0:8000/v1 " in endpoints


def test_an_environments_pool_options_reach_its_env_server(tmp_path):
    toml = tmp_path / "rl.toml"
    toml.write_text('[[orchestrator.train.envs]]\nid = "reverse-text"\nelastic = true\ngrow_at = 8\n'
                    'worker_timeout = 120\n')
    script = sbatch_script(plan_launch(parse_rl_args(["@", str(toml), *LAYOUT])[0], Path("/shared/runs/reverse-text")))
    assert "tracegym serve --taskset.id reverse-text --taskset-json '{}' --elastic --grow-at 8.0 " \
           "--worker-timeout 120.0 --log-dir" in script


def test_the_endpoints_of_a_slurm_run_name_its_teacher_at_its_base_url(tmp_path):
    """An sft run on Slurm reaches its teacher where the config says, as it does on one machine."""
    args = ["rl", "@", str(CONFIGS / "sft" / "reverse_text_teacher.toml"), "--cluster", "slurm", "--output-dir",
            str(tmp_path), "--run-id", "r", "--slurm.setup", "[]"]
    assert main(args) == 0
    with FakeOpenAIServer(rule=lambda request: "ok") as vllm:
        write_endpoints(tmp_path / "r", [vllm.base_url], {}, wait_s=10.0)
    endpoints = RLFolder(tmp_path / "r").read_endpoints()
    assert (endpoints.teacher_base_url, endpoints.teacher_model) == (["http://127.0.0.1:8011/v1"], None)


def test_a_teacher_the_run_would_serve_is_refused_on_slurm_naming_it(tmp_path):
    config = parse_rl_args(["@", str(CONFIGS / "opd" / "reverse_text.toml"), "--cluster", "slurm"])[0]
    with pytest.raises(UsageError, match=r"\[teacher\] name: a Slurm run does not serve its teacher"):
        plan_launch(config, tmp_path)


def test_the_script_asks_to_be_requeued_and_to_be_signalled_before_its_time_limit():
    script = sbatch_script(plan_launch(config(), Path("/shared/runs/reverse-text")))
    assert "#SBATCH --requeue\n" in script and f"#SBATCH --signal=B:USR1@{REQUEUE_NOTICE_S}\n" in script
    assert "#SBATCH --open-mode=append\n" in script  # each attempt's log follows the one before
    assert "trap requeue USR1" in script and 'scontrol requeue "$SLURM_JOB_ID"' in script


def test_a_requeued_attempt_runs_every_nodes_part_again_under_its_own_markers(tmp_path):
    (tmp_path / "run" / "slurm").mkdir(parents=True)
    (tmp_path / "run" / "slurm" / "ready-77-0").touch()  # left by the attempt that was stopped
    calls, run = simulate(tmp_path, "gpu1 cpu1 gpu2 gpu3", restart=1)
    assert f"node=0 python -m tracegym.train.cluster vllm {run} 8000 0" in calls
    assert f"node=2 python -m tracegym.train.roles orchestrator {run}" in calls
    assert (tmp_path / "run" / "slurm" / "done-77-1").exists()


def test_the_time_limit_signal_requeues_the_job_and_stops_its_steps(tmp_path):
    """`--signal=B:USR1@N` reaches the batch shell while srun runs the nodes' parts; the job asks to be requeued
    and ends its steps (Slurm then starts the next attempt)."""
    fakes = {**FAKES, "srun": 'echo "srun started" >> "$SIM_LOG"\nexec sleep 60'}
    command, env = allocation(tmp_path, "gpu1 cpu1 gpu2 gpu3", fakes=fakes)
    log = Path(env["SIM_LOG"])
    job = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert Poll("srun to start", 30).wait(lambda: log.exists() and "srun started" in log.read_text())
        job.send_signal(signal.SIGUSR1)
        _, err = job.communicate(timeout=30)
    finally:
        job.kill()
    assert "scontrol requeue 77" in log.read_text().splitlines()
    assert "requeued, its next attempt resumes the run" in err


def test_a_requeued_attempt_goes_on_from_the_run_folder(tmp_path):
    """The endpoints step of each attempt rewinds the folder as `--resume` does: the checkpoint and the batches
    made past it are kept for the trainer; the policy the stopped attempt's vLLM served is forgotten."""
    assert main(["rl", "@", str(SHIPPED), "--cluster", "slurm", "--output-dir", str(tmp_path), "--run-id", "r",
                 "--slurm.setup", "[]"]) == 0
    folder = RLFolder(tmp_path / "r")
    for step in range(3):
        folder.write_batch(step, [], state={"next_step": step + 1})
    checkpoint = folder.new_checkpoint(1)
    checkpoint.mkdir(parents=True)
    folder.complete(checkpoint, version=1)
    folder.publish_policy(2, "policy")
    with FakeOpenAIServer(rule=lambda request: "ok") as vllm:
        write_endpoints(folder.path, [vllm.base_url], {}, wait_s=30.0)
    assert folder.made_ahead(1) == [1, 2] and folder.resume_state() == {"next_step": 3}
    assert folder.policy("base") == (0, "base")
