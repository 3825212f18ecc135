"""`--env.runtime` (eval) and an rl environment's `runtime`: every task's sandbox opens in the runtime the config
names, in process and in the workers of the env server a command starts, over the runtime its task class chooses."""

import json
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.envs.registry import load_taskset
from tracegym.testing import FakeOpenAIServer
from tracegym.train.rl_config import parse_rl_args

PID_TASKSET = '''
from tracegym import Task, Taskset, metric


class PidTask(Task):
    @metric
    async def sandbox_pid(self, trace):
        """The pid a shell gets in this rollout's sandbox: small in a pid namespace (subprocess, the class's
        runtime), the host's own in `process-group`."""
        result = await (await self.sandbox()).run(["sh", "-c", "echo $$"])
        return float(result.stdout.strip())


class Pids(Taskset):
    id = "pids"
    task_class = PidTask


def pids():
    return Pids(data=[{"prompt": "hi"}])
'''


@pytest.fixture
def server():
    with FakeOpenAIServer(rule=lambda request: "hello") as fake:
        yield fake


def sandbox_pids(out: Path) -> list[float]:
    [traces] = list(out.glob("*/*/traces.jsonl"))
    return [json.loads(line)["metrics"]["sandbox_pid"] for line in traces.read_text().splitlines()]


def run_pids(server, tmp_path: Path, out: str, *flags: str) -> list[float]:
    path = tmp_path / "pids.py"
    path.write_text(PID_TASKSET)
    args = ["eval", f"{path}:pids", "--model.base-url", server.base_url, "--output-dir", str(tmp_path / out),
            "--no-rich", *flags]
    assert main(args) == 0
    return sandbox_pids(tmp_path / out)


def test_the_env_servers_workers_open_sandboxes_in_the_runtime_the_flag_names(server, tmp_path):
    [own] = run_pids(server, tmp_path, "own", "--env.workers", "1")
    [named] = run_pids(server, tmp_path, "named", "--env.workers", "1", "--env.runtime", "process-group")
    assert own < 100 < named  # the class's subprocess runtime has its own pid namespace; process-group has none


def test_in_process_rollouts_open_sandboxes_in_the_runtime_the_flag_names(server, tmp_path):
    [named] = run_pids(server, tmp_path, "named", "--no-serve", "--env.runtime", "process-group")
    assert named > 100


def test_the_named_runtime_keeps_the_limits_the_task_gives_its_programs():
    taskset = load_taskset("python-functions", {"memory_mb": 300}).with_runtime("process-group")
    task = taskset.task(taskset[0])
    assert task.sandbox_runtime().name == "process-group"
    assert task.sandbox_runtime().limits == task.runtime().limits


def test_an_unknown_runtime_is_one_line_naming_the_flag_and_writes_nothing(server, tmp_path, capsys):
    args = ["eval", "reverse-text", "--env.runtime", "gvisor", "--model.base-url", server.base_url,
            "--output-dir", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--env.runtime: Value error, unknown runtime 'gvisor'; known: subprocess" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_runtime_with_a_running_env_server_is_refused_naming_it(server, capsys):
    assert main(["eval", "reverse-text", "--env.address", "tcp://127.0.0.1:5555", "--env.runtime", "bubblewrap",
                 "--model.base-url", server.base_url]) == 2
    assert "`runtime` (for one started here) has no effect" in capsys.readouterr().err


def test_an_rl_environment_names_its_runtime_and_its_env_server_is_started_with_it(tmp_path):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.env]]\nid = "python-functions"\nruntime = "bubblewrap"\nworkers = 2\n'
                      '[trainer]\n')
    parsed, _ = parse_rl_args(["@", str(config)])
    [env] = parsed.orchestrator.train.envs
    assert env.serve_args() == ["--workers", "2", "--runtime", "bubblewrap"]
