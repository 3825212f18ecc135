"""`tracegym rl` with env servers already running elsewhere: used when they serve what the config says."""

import contextlib
import io

import pytest

from tracegym.core.errors import UsageError
from tracegym.serve import local_server
from tracegym.train.launcher import start_env_servers
from tracegym.train.rl_config import RLConfig, env_servers


def config(address: str, **options) -> RLConfig:
    env = {"id": "reverse-text", "options": options, "address": address}
    return RLConfig.model_validate({"trainer": {"model": "m"},
                                    "orchestrator": {"train": {"envs": [env]}, "eval": {"envs": []}}})


def test_an_env_with_an_address_uses_the_running_server_and_starts_none(tmp_path):
    out = io.StringIO()
    with local_server("reverse-text", {"seed": 3}, workers=1) as address, contextlib.ExitStack() as stack:
        envs = env_servers(config(address, seed=3).orchestrator)
        assert start_env_servers(envs, tmp_path, stack, out) == {"reverse-text": [address]}
    assert "running elsewhere" in out.getvalue() and not (tmp_path / "logs").exists()


def test_a_running_server_with_other_options_is_refused_naming_them(tmp_path):
    with (local_server("reverse-text", {"seed": 3}, workers=1) as address, contextlib.ExitStack() as stack,
          pytest.raises(UsageError, match="seed = 3, not 0")):
        start_env_servers(env_servers(config(address).orchestrator), tmp_path, stack, io.StringIO())
