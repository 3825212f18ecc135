"""Environment instances pooled as TRL pools them: made once, reset per rollout, at most one per concurrent rollout,
closed (by the class's own hooks) when the taskset is closed, and never reused after a failed reset or while a
call on them still runs."""

import gc
import threading
from typing import ClassVar

import tracegym as tg
from tracegym.envs.rollout import Timeouts
from tracegym.testing import ScriptedModel, Stall, reply, tool_call

ROWS = [{"prompt": f"Count to {n}.", "target": n} for n in range(8)]


class Counter:
    """A TRL-shaped class that records every instance, reset and close."""

    made: ClassVar[list["Counter"]] = []

    def __init__(self) -> None:
        self.resets = 0
        self.closed = 0
        self.count = 0
        type(self).made.append(self)

    def reset(self, **row) -> str:
        self.resets += 1
        self.count = 0
        return ""

    def increment(self) -> int:
        """Add one to the counter."""
        self.count += 1
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


def _fresh(env_class):
    env_class.made = []
    return env_class


def _taskset(env_class, rows=ROWS) -> tg.EnvironmentTaskset:
    return tg.EnvironmentTaskset(_fresh(env_class), id="pooled", data=rows)


async def test_sequential_rollouts_reuse_one_instance_reset_before_each():
    traces = await tg.evaluate(_taskset(Counter), ScriptedModel(["done"]), concurrency=1)
    assert len(traces) == 8 and all(t.ok for t in traces)
    assert len(Counter.made) == 1 and Counter.made[0].resets == 8


async def test_concurrent_rollouts_hold_at_most_one_instance_each_and_reuse_them_later():
    script = [Stall(0.01, reply(None, tool_call("increment", {}))), "done"]
    taskset = _taskset(Counter)
    first = await tg.evaluate(taskset, ScriptedModel(script), concurrency=4)
    second = await tg.evaluate(taskset, ScriptedModel(script), concurrency=4)
    assert len(Counter.made) <= 4
    assert sum(env.resets for env in Counter.made) == 16
    assert [t.reward for t in first + second] == [1.0] * 16  # reset between rollouts: no count carried over


class Closing(Counter):
    def close(self) -> None:
        self.closed += 1


async def test_closing_the_taskset_calls_close_on_every_instance_once():
    taskset = _taskset(Closing)
    await tg.evaluate(taskset, ScriptedModel(["done"]), concurrency=2)
    assert all(env.closed == 0 for env in Closing.made)
    taskset.close()
    taskset.close()
    assert [env.closed for env in Closing.made] == [1] * len(Closing.made)


class Managed(Counter):
    entered: ClassVar[int] = 0

    def __enter__(self) -> "Managed":
        Managed.entered += 1
        return self

    def __exit__(self, *exc) -> None:
        self.closed += 1


async def test_a_context_manager_class_is_entered_when_made_and_exited_at_close():
    Managed.entered = 0
    taskset = _taskset(Managed)
    await tg.evaluate(taskset, ScriptedModel(["done"]), concurrency=1)
    taskset.close()
    assert Managed.entered == 1 and [env.closed for env in Managed.made] == [1]


class Deleted(Counter):
    deleted: ClassVar[int] = 0

    def __del__(self) -> None:
        Deleted.deleted += 1


async def test_a_class_with_only_del_is_dropped_at_close_so_del_runs():
    Deleted.deleted = 0
    taskset = _taskset(Deleted)
    await tg.evaluate(taskset, ScriptedModel(["done"]), concurrency=1)
    Deleted.made = []  # the test's own reference
    taskset.close()
    gc.collect()
    assert Deleted.deleted == 1


class FailsFirstReset(Closing):
    def reset(self, **row) -> str:
        super().reset(**row)
        if len(FailsFirstReset.made) == 1:
            raise ConnectionError("server busy")
        return ""


async def test_an_instance_whose_reset_failed_is_closed_and_not_reused():
    traces = await tg.evaluate(_taskset(FailsFirstReset, ROWS[:2]), ScriptedModel(["done"]), concurrency=1)
    assert [t.ok for t in traces] == [False, True]
    first, second = FailsFirstReset.made
    assert first.closed == 1 and first.resets == 1 and second.closed == 0 and second.resets == 1


class Hangs(Closing):
    release = threading.Event()

    def wait(self) -> str:
        """Wait for the test to release the call."""
        Hangs.release.wait(30)
        return "released"


async def test_an_instance_with_a_call_abandoned_at_its_timeout_is_closed_not_reused():
    Hangs.release.clear()
    script = [reply(None, tool_call("wait", {})), "done"]
    try:
        traces = await tg.evaluate(_taskset(Hangs, ROWS[:2]), ScriptedModel(script), concurrency=1,
                                   timeouts=Timeouts(tool=0.05))
    finally:
        Hangs.release.set()
    assert all(t.metrics.get("tool_errors") == 1 for t in traces)
    assert len(Hangs.made) == 2 and [env.closed for env in Hangs.made] == [1, 1]


async def test_a_factory_probe_is_closed_at_load_and_rollouts_take_their_own_instance():
    factory = _fresh(Closing)
    taskset = tg.EnvironmentTaskset(lambda: factory(), id="factory", data=ROWS[:2])
    [probe] = Closing.made
    assert probe.closed == 1
    await tg.evaluate(taskset, ScriptedModel(["done"]), concurrency=1)
    assert len(Closing.made) == 2 and Closing.made[1].resets == 2 and probe.resets == 0
