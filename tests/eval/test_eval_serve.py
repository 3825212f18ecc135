"""`tracegym eval` through an env server (the default), in process (`--no-serve`) and at `--env-address`."""

import json
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.core.trace import Trace
from tracegym.serve import local_server
from tracegym.testing import FakeOpenAIServer

VOLATILE = {"id", "started_at", "spans"}


def reverse(request) -> str:
    return request.messages[-1].text[::-1]


@pytest.fixture
def fake():
    with FakeOpenAIServer(rule=reverse) as server:
        yield server


def run_eval(fake, out: Path, *extra: str) -> Path:
    args = ["eval", "reverse-text", "-n", "3", "-r", "2", "--model.base-url", fake.base_url, "--output-dir", str(out),
            "--no-rich", "--sampling.temperature", "0", *extra]
    assert main(args) == 0
    [run] = list(out.glob("*/*"))
    return run


def contents(run: Path) -> list[dict]:
    traces = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    return sorted(({k: v for k, v in t.items() if k not in VOLATILE} for t in traces),
                  key=lambda t: (t["task_key"], t["rollout_index"]))


def test_eval_through_the_env_server_matches_in_process(fake, tmp_path):
    served = run_eval(fake, tmp_path / "served")
    local = run_eval(fake, tmp_path / "local", "--no-serve")
    assert contents(served) == contents(local) and len(contents(served)) == 6
    assert (served / "logs" / "env" / "worker-w1.log").is_file()
    assert not (local / "logs" / "env").exists()


def test_eval_uses_a_running_env_server_at_env_address(fake, tmp_path):
    with local_server("reverse-text", {}, workers=1) as address:
        run = run_eval(fake, tmp_path, "--env-address", address)
    assert [t["rewards"]["lcs"]["score"] for t in contents(run)] == [1.0] * 6


def eval_exit(fake, out: Path, *extra: str) -> int:
    return main(["eval", "reverse-text", "-n", "3", "--model.base-url", fake.base_url, "--output-dir", str(out),
                 "--no-rich", *extra])


def test_an_env_server_of_another_taskset_is_refused_by_name_before_any_run_folder(fake, tmp_path, capsys):
    with local_server("arithmetic", {}, workers=1) as address:
        assert eval_exit(fake, tmp_path / "out", "--env-address", address) == 2
    assert "serves taskset 'arithmetic', not 'reverse-text'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_env_server_with_other_taskset_options_is_refused_naming_the_option(fake, tmp_path, capsys):
    with local_server("reverse-text", {"seed": 7}, workers=1) as address:
        assert eval_exit(fake, tmp_path, "--env-address", address) == 2
    assert "seed = 7, not 0" in capsys.readouterr().err


def poisoned_eval(out: Path, how: str, *extra: str) -> tuple[int, list[Trace]]:
    """30 echo tasks, task echo-7 ending its process in setup (`how`); the exit code and the traces."""
    with FakeOpenAIServer(rule=lambda request: request.messages[-1].text.removeprefix("Say ")) as fake:
        code = main(["eval", "tracegym.testing.echo:Echo", "-n", "30", "--taskset.poison-task", "echo-7",
                     "--taskset.poison-how", how, "--model.base-url", fake.base_url, "--output-dir", str(out),
                     "--no-rich", *extra])
    [run] = list(out.glob("*/*"))
    return code, [Trace.model_validate_json(line) for line in (run / "traces.jsonl").read_text().splitlines()]


def test_a_task_that_kills_its_worker_costs_only_its_own_rollout(tmp_path):
    code, traces = poisoned_eval(tmp_path, "exit")
    failed = [t for t in traces if not t.ok]
    assert code == 0 and len(traces) == 30 and [t.task.id for t in failed] == ["echo-7"]
    assert failed[0].failure == "worker_died" and "alone" in failed[0].errors[0].message


@pytest.mark.parametrize("where", ["--serve", "--no-serve"])
def test_a_task_calling_sys_exit_ends_only_its_own_rollout(tmp_path, where):
    code, traces = poisoned_eval(tmp_path, "sys.exit", where)
    failed = [t for t in traces if not t.ok]
    assert code == 0 and len(traces) == 30 and [t.task.id for t in failed] == ["echo-7"]
    assert [(e.kind, e.stage, e.message) for e in failed[0].errors] == [("task", "setup", "SystemExit: 3")]
