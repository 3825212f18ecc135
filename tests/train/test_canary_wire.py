"""The canary tripwire: the gold and no-op agents played on an env server (`RunRequest.agent`), and a task whose
checks held at the baseline and fail later firing `canary`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))
from canary_tasks import SPEC
from serve_helpers import running_server

from tracegym import Endpoint, TaskData
from tracegym.serve.env_client import EnvClient
from tracegym.serve.run_request import RunRequest
from tracegym.train.canary_wire import CanaryCheck, CanaryEnv, CanaryWire
from tracegym.train.tripwire import TripwireConfig, Tripwires

ENDPOINT = Endpoint(base_url="http://127.0.0.1:9/v1", model="never-called", api_key_env=None, max_retries=0)


def check(key: str, gold: float | None, noop: float | None) -> CanaryCheck:
    return CanaryCheck("env", key, gold, noop, has_gold=True)


def wire_with_baseline(*checks: CanaryCheck) -> CanaryWire:
    wire = CanaryWire([], every=2)
    wire.baseline = {(c.env, c.key): c for c in checks}
    return wire


def test_a_gold_reply_that_stops_passing_trips_the_canary():
    [trip] = wire_with_baseline(check("t0", 1.0, 0.0)).trips(4, [check("t0", 0.0, 0.0)])
    assert (trip.wire, trip.step) == ("canary", 4) and "gold reply now earns 0" in trip.message


def test_an_empty_reply_that_starts_paying_trips_the_canary():
    [trip] = wire_with_baseline(check("t0", 1.0, 0.0)).trips(4, [check("t0", 1.0, 1.0)])
    assert "empty reply now earns 1" in trip.message


def test_a_task_that_failed_its_checks_at_the_baseline_is_not_watched():
    assert wire_with_baseline(check("t0", 0.0, 1.0)).trips(4, [check("t0", 0.0, 1.0)]) == []


def test_a_failed_canary_rollout_is_not_a_trip():
    assert wire_with_baseline(check("t0", 1.0, 0.0)).trips(4, [CanaryCheck("env", "t0", None, None, False)]) == []


def test_the_canary_runs_at_the_first_step_then_every_n():
    wire = CanaryWire([CanaryEnv("env", None, [])], every=3)  # type: ignore[arg-type]
    assert wire.due(5)  # no baseline yet: the first step the run makes
    wire.baseline = {}
    assert [s for s in range(1, 10) if wire.due(s)] == [3, 6, 9]


def test_the_canary_is_armed_only_with_canary_every():
    assert "canary" not in Tripwires(TripwireConfig()).armed()
    assert "canary" in Tripwires(TripwireConfig(canary_every=5)).armed()


def test_canary_agents_play_on_the_env_server_without_calling_the_model():
    with running_server(spec=SPEC) as server:
        async def play() -> tuple[float | None, float | None]:
            async with EnvClient(server.bound) as client:
                [gold] = await client.run(TaskData(id="t1", prompt="Say 1.", answer="1"), ENDPOINT, agent="gold")
                [noop] = await client.run(TaskData(id="t1", prompt="Say 1.", answer="1"), ENDPOINT, agent="noop")
                return gold.reward, noop.reward

        assert asyncio.run(play()) == (1.0, 0.0)


def test_a_gold_canary_on_a_task_without_gold_replies_runs_nothing():
    with running_server(spec=SPEC) as server:
        async def play() -> list:
            async with EnvClient(server.bound) as client:
                return await client.run(TaskData(id="t1", prompt="Say 1."), ENDPOINT, agent="gold")

        assert asyncio.run(play()) == []


def test_a_grader_changed_under_the_run_trips_the_canary(tmp_path):
    leak = tmp_path / "leak"
    with running_server({"leak": str(leak)}, spec=SPEC) as server:
        async def run() -> list:
            async with EnvClient(server.bound) as client:
                rows = [TaskData(id="t0", prompt="Say 0.", answer="0")]
                wire = CanaryWire([CanaryEnv("leaky", client, rows)], every=1)
                assert await wire.check(0, ENDPOINT) == []  # the baseline: gold passes, the empty reply earns 0
                leak.write_text("the policy wrote here")
                return await wire.check(1, ENDPOINT)

        [trip] = asyncio.run(run())
    assert trip.wire == "canary" and "leaky task t0: an empty reply now earns 1" in trip.message


def test_a_canary_agent_cannot_play_episodes():
    with pytest.raises(ValueError, match="canary agent plays a single-agent"):
        RunRequest(data=TaskData(id="t", prompt="Say t."), endpoint=ENDPOINT, agent="noop", episodes=True)


def test_the_canary_tasks_are_the_first_read_tasks_of_each_single_agent_env():
    from tracegym.train.orchestrator import TrainEnv, canary_wire
    from tracegym.train.task_stream import TaskStream

    rows = [TaskData(id=str(i), prompt=f"Say {i}.") for i in range(6)]

    def env(name: str, seating: object = None) -> TrainEnv:
        stream = TaskStream(name, 6, 0, None, rows)  # type: ignore[arg-type]
        return TrainEnv(name, 1.0, None, stream, None, seating)  # type: ignore[arg-type]

    wire = canary_wire(TripwireConfig(canary_every=2, canary_tasks=3), [env("solo"), env("game", seating=object())])
    assert wire is not None
    assert [(c.id, [r.key for r in c.rows]) for c in wire.envs] == [("solo", [rows[i].key for i in range(3)])]
    assert canary_wire(TripwireConfig(), [env("solo")]) is None
