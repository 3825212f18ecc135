"""Command-line settings of the env servers a command starts: the worker pool and timeout from eval (`--env.*`) and
rl (each environment's entry), the elastic pool's growth threshold from serve."""

import contextlib
import io
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.cli.serve import ServeConfig
from tracegym.cli.serve import config_class as serve_config_class
from tracegym.cli.serve import run as serve
from tracegym.config.command_line import parse_command
from tracegym.core.errors import UsageError
from tracegym.testing import FakeOpenAIServer
from tracegym.train.launcher import start_env_servers
from tracegym.train.rl_config import env_servers, parse_rl_args
from tracegym.train.rl_folder import RLFolder


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(rule=lambda request: "ok") as fake:
        yield fake


def test_eval_sets_the_pool_and_worker_timeout_of_the_env_server_it_starts(server, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", "reverse-text", "-n", "1", "--model.base-url", server.base_url, "--no-rich",
                 "--output-dir", str(out), "--env.worker-timeout", "7", "--env.workers", "2"]) == 0
    [log] = out.rglob("env/server.log")
    assert "with 2+ workers (worker timeout 7 s)" in log.read_text()


def test_rl_sets_the_worker_timeout_of_each_env_server_it_starts(tmp_path, capsys):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.envs]]\nid = "reverse-text"\nworker_timeout = 7\n')
    assert main(["rl", "@", str(config), "--dry-run"]) == 0
    assert "worker_timeout = 7" in capsys.readouterr().out


def test_rls_pool_and_worker_timeout_reach_the_env_server_it_starts(tmp_path):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.envs]]\nid = "reverse-text"\nworker_timeout = 7\nworkers = 2\n')
    rl_config, _ = parse_rl_args(["@", str(config)])
    with contextlib.ExitStack() as stack:
        [key] = start_env_servers(env_servers(rl_config.orchestrator), tmp_path, stack, io.StringIO())
    [log] = RLFolder(tmp_path).env_log_dir(key).glob("server.log")
    assert "with 2+ workers (worker timeout 7 s)" in log.read_text()


def test_serve_grow_at_sets_the_elastic_pools_threshold():
    config, _ = parse_command(ServeConfig, ["--taskset.id", "echo", "--elastic", "--grow-at", "3"], prog="serve")
    assert config.size().grow_at == 3


def test_serve_parses_a_tasksets_typed_flags_as_eval_does():
    spec = f"{Path(__file__).parents[1] / 'envs' / 'trl_classes.py'}:GuessTheWordEnvironment"
    args = ["--taskset.id", spec, "--taskset.rewards", "reward_len", "--taskset.reward-weights", "2"]
    config, _ = parse_command(serve_config_class(spec), args, prog="serve")
    assert (config.options()["rewards"], config.options()["reward_weights"]) == (["reward_len"], [2.0])


def test_serve_names_a_misspelled_taskset_flag():
    with pytest.raises(UsageError, match=r"--taskset.max-word: unknown option; did you mean --taskset.max-words\?"):
        serve(["reverse-text", "--taskset.max-word", "3"])
