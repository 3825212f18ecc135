"""An environment whose server says how many rollouts its tasks can run at once (an OpenEnv server's sessions) caps
the RL run's concurrency, with a note; the env server says it in its `info`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))
from capacity_tasks import SPEC
from serve_helpers import running_server

from tracegym.serve.env_client import describe
from tracegym.serve.served_taskset import ServedTaskset
from tracegym.train.orchestrator import HeldOutEnv, within_capacity


def env(name: str, capacity: int | None) -> HeldOutEnv:
    return HeldOutEnv(name, ServedTaskset(id=name, capacity=capacity), [], None)  # type: ignore[arg-type]


def test_the_smallest_capacity_below_the_concurrency_caps_it_with_a_note(capsys):
    assert within_capacity(16, [env("wide", None), env("openenv:a", 8), env("openenv:b", 4)]) == 4
    assert "environment 'openenv:b' runs at most 4 rollouts at once" in capsys.readouterr().err


def test_a_capacity_at_or_above_the_concurrency_changes_nothing(capsys):
    assert within_capacity(4, [env("openenv:a", 4), env("wide", None)]) == 4
    assert capsys.readouterr().err == ""


def test_an_env_server_says_its_tasksets_capacity():
    with running_server(spec=SPEC) as server:
        served = describe(server.bound)
    assert served.capacity == 3
