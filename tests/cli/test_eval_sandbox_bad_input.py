"""Bad sandbox input to `tracegym eval`, `tracegym rl` and `tracegym serve`: one line naming the flag or setting
and its value, exit 2, before any rollout starts and before any run folder is made."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.runtimes import cgroup
from tracegym.runtimes.bubblewrap import probe
from tracegym.testing import FakeOpenAIServer
from tracegym.train.rl_config import EnvChoice


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(rule=lambda request: "never asked") as fake:
        yield fake


def refused(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """Run the command, assert it exits 2 with one line on stderr and no traceback; return that line."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def evaluate(server: FakeOpenAIServer, out: Path, *flags: str) -> list[str]:
    return ["eval", "python-functions", "-n", "1", *flags, "--model.base-url", server.base_url,
            "--output-dir", str(out)]


@pytest.mark.parametrize(("flags", "said"), [
    (["--taskset.egress", "nohost.invalid:80"], "egress entry 'nohost.invalid:80' does not resolve on this host"),
    (["--taskset.egress", "nohost.invalid"], "--taskset.egress: Value error, egress entry 'nohost.invalid' is not "
                                             "HOST:PORT"),
    (["--taskset.read-only", "/no/such/path"], "--taskset.read-only: Value error, '/no/such/path' is not an "
                                               "existing absolute path on this host"),
    (["--taskset.devices", "/no/such/device"], "--taskset.devices: Value error, '/no/such/device' does not exist"),
    (["--taskset.runtime", "container", "--taskset.egress", "127.0.0.1:80"],
     "runtime 'container': this runtime cannot enforce limits.egress ['127.0.0.1:80']"),
    (["--env.workers", "2", "--env.sandbox.max-starting", "2"],
     "--env.sandbox: Value error, sandbox.max_starting=2 is below the 3 worker processes"),
    (["--env.sandbox.setup-budget-s", "0"], "--env.sandbox.setup-budget-s: Input should be greater than 0"),
])
def test_bad_sandbox_input_to_eval_exits_2_naming_it_and_makes_no_folder(flags, said, server, tmp_path, capsys):
    out = tmp_path / "out"
    if "container" in flags and (why := _no_container()):
        pytest.skip(why)
    assert said in refused(capsys, evaluate(server, out, *flags))
    assert not out.exists()


def _no_container() -> str | None:
    from tracegym.runtimes.catalog import runtime_for

    return runtime_for("container").unavailable()


def test_a_runtime_this_host_lacks_exits_2_naming_it(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    probe.cache_clear()
    try:
        err = refused(capsys, evaluate(server, tmp_path / "out", "--taskset.runtime", "bubblewrap"))
    finally:
        probe.cache_clear()
    assert "runtime 'bubblewrap' cannot run on this host: bwrap is not installed" in err


def test_strict_caps_this_host_cannot_give_exit_2_naming_them(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cgroup, "placement", lambda: "no cgroup can be made here (the test says so)")
    err = refused(capsys, evaluate(server, tmp_path / "out", "--taskset.strict-caps"))
    assert "strict_caps: memory_mb=512 and processes=32 cannot cap the sandbox's processes together" in err


def test_serve_refuses_an_egress_hostname_that_does_not_resolve_before_any_worker_starts(capsys):
    err = refused(capsys, ["serve", "python-functions", "--taskset-json", '{"egress": ["nohost.invalid:80"]}'])
    assert "taskset 'python-functions': egress entry 'nohost.invalid:80' does not resolve" in err


def test_rl_refuses_an_environment_whose_egress_hostname_does_not_resolve_before_anything_starts(tmp_path, capsys):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.envs]]\nid = "python-functions"\n'
                      'options = { egress = ["nohost.invalid:80"] }\n')
    out = tmp_path / "out"
    err = refused(capsys, ["rl", "@", str(config), "--output-dir", str(out)])
    assert "taskset 'python-functions': egress entry 'nohost.invalid:80' does not resolve" in err
    assert not out.exists()


def test_rl_passes_an_environment_s_sandbox_settings_to_its_env_server(tmp_path, capsys):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.envs]]\nid = "python-functions"\nsandbox = { max_starting = 12 }\n')
    assert main(["rl", "@", str(config), "--dry-run"]) == 0
    server = tomllib.loads(capsys.readouterr().out)["env_servers"]["python-functions"]
    assert server["sandbox"]["max_starting"] == 12
    assert EnvChoice.model_validate(server).serve_args() == ["--sandbox.max-starting", "12"]
