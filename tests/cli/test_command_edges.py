"""Command-line edges: unwritable folders, bad env addresses and counts in every command, the env server's worker
timeout set from eval and rl, and an authentication failure reported as what it is."""

import pytest

from tracegym.cli.main import main
from tracegym.cli.serve import ServeConfig
from tracegym.config.command_line import parse_command
from tracegym.serve import local_server
from tracegym.serve.wire import SECRET_ENV
from tracegym.testing import FakeOpenAIServer


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(rule=lambda request: "ok") as fake:
        yield fake


def refused(capsys, args: list[str]) -> str:
    """Run the command, assert it exits 2 with one line on stderr and no traceback; return that line."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_an_eval_output_dir_that_cannot_be_made_exits_2_naming_the_flag(server, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    err = refused(capsys, ["eval", "reverse-text", "-n", "1", "--base-url", server.base_url, "--no-serve",
                           "--output-dir", str(tmp_path / "a-file" / "out")])
    assert "--output-dir" in err and "a-file" in err


def test_an_rl_output_dir_that_cannot_be_made_exits_2_naming_the_flag(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    err = refused(capsys, ["rl", "--output-dir", str(tmp_path / "a-file" / "out")])
    assert "--output-dir" in err and "a-file" in err


def test_an_rl_env_address_without_a_transport_exits_2_naming_its_key(tmp_path, capsys):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.envs]]\nid = "reverse-text"\naddress = "127.0.0.1:5555"\n')
    err = refused(capsys, ["rl", "@", str(config), "--dry-run"])
    assert "address" in err and "tcp://" in err


@pytest.mark.parametrize("value", ["0", "-1"])
def test_an_rl_concurrency_below_one_exits_2_naming_its_flag(value, capsys):
    err = refused(capsys, ["rl", "--orchestrator.concurrency", value, "--dry-run"])
    assert "--orchestrator.concurrency" in err


@pytest.mark.parametrize(("flag", "value"), [("--idle-seconds", "-1"), ("--worker-timeout", "0"),
                                             ("--grow-at", "0")])
def test_a_serve_number_out_of_range_exits_2_naming_its_flag(flag, value, capsys):
    err = refused(capsys, ["serve", "reverse-text", "--elastic", flag, value])
    assert flag in err


def test_eval_sets_the_worker_timeout_of_the_env_server_it_starts(server, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", "reverse-text", "-n", "1", "--base-url", server.base_url, "--no-rich",
                 "--output-dir", str(out), "--worker-timeout", "7"]) == 0
    [log] = out.rglob("env/server.log")
    assert "worker timeout 7 s" in log.read_text()


def test_rl_sets_the_worker_timeout_of_each_env_server_it_starts(tmp_path, capsys):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.envs]]\nid = "reverse-text"\nworker_timeout = 7\n')
    assert main(["rl", "@", str(config), "--dry-run"]) == 0
    assert "worker_timeout = 7" in capsys.readouterr().out


def test_a_wrong_shared_secret_is_reported_as_an_authentication_failure_not_a_task_error(tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "s3cret")
    with local_server("reverse-text", workers=1) as address:
        monkeypatch.setenv(SECRET_ENV, "guess")
        err = refused(capsys, ["eval", "reverse-text", "--env-address", address, "--output-dir", str(tmp_path)])
    assert "authentication failed" in err and SECRET_ENV in err and "task error" not in err


def test_serve_grow_at_sets_the_elastic_pools_threshold():
    config, _ = parse_command(ServeConfig, ["--taskset.id", "echo", "--elastic", "--grow-at", "3"], prog="serve")
    assert config.size().grow_at == 3
