"""The orchestrator runs without any taskset's code: a taskset whose module imports a package only its env server's
host has still dry-runs and trains, its tasks drawn from the env server by position."""

import asyncio
import itertools
import json
import sys

import pytest

from tracegym.cli.main import main
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for

TASKSET = '''
import envhost_only  # installed only where the env server runs

import tracegym as tg


class Say(tg.Task):
    @tg.reward
    def said(self, trace):
        return float(trace.last_reply.strip() == envhost_only.WORD)


class Elsewhere(tg.Taskset):
    id = "elsewhere"
    task_class = Say

    def load(self):
        return [{"prompt": f"Say {envhost_only.WORD} ({i})."} for i in range(6)]
'''


@pytest.fixture
def taskset_here(tmp_path):
    """The taskset's file (importable here only as far as its own import, which fails) and the folder holding the
    package it needs (on the env server's path alone)."""
    path = tmp_path / "elsewhere.py"
    path.write_text(TASKSET)
    deps = tmp_path / "env_host_packages"
    deps.mkdir()
    (deps / "envhost_only.py").write_text('WORD = "ping"\n')
    return path, deps


def test_a_dry_run_needs_no_taskset_code(taskset_here, tmp_path, capsys):
    path, _ = taskset_here
    envs = json.dumps([{"id": f"{path}:Elsewhere", "options": {}}])
    assert main(["rl", "--orchestrator.train.envs", envs, "--dry-run", "--output-dir", str(tmp_path / "out")]) == 0
    assert f"{path}:Elsewhere" in capsys.readouterr().out and "envhost_only" not in sys.modules


def test_steps_run_with_a_taskset_whose_module_cannot_be_imported_in_the_orchestrators_process(taskset_here,
                                                                                                tmp_path):
    path, deps = taskset_here
    spec = f"{path}:Elsewhere"
    with pytest.raises(ModuleNotFoundError):
        __import__("envhost_only")
    config = RLConfig.model_validate({
        "steps": 2, "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 2, "group_size": 2, "max_async_steps": 1,
                         "train": {"envs": [{"id": spec}]}}})
    replies = itertools.cycle(["ping", "pong"])
    with FakeOpenAIServer(rule=lambda request: next(replies)) as server, \
            local_server(spec, workers=1, under=["env", f"PYTHONPATH={deps}"]) as address:
        endpoints = Endpoints(base_url=server.base_url, base_model=server.model, envs={spec: address})
        orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)

        async def two_steps():
            try:
                return [await orchestrator.collect(step, 0, server.model) for step in range(2)]
            finally:
                await orchestrator.aclose()

        steps = asyncio.run(two_steps())
    assert [metrics["rollouts"] for _, metrics in steps] == [4, 4]
    assert all(samples and metrics["reward"] == 0.5 for samples, metrics in steps)
    assert orchestrator.envs[spec].stream.drawn == 4 and "envhost_only" not in sys.modules
