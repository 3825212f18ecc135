"""Types reach users: a Taskset is generic over its config, a Task over its row and config, and the scorer
decorators keep the function's own signature. The `assert_type` lines are checked by a type checker (the last
test runs mypy on this file when it is installed) and are no-ops at run time."""

import inspect
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import assert_type

import pytest

import tracegym as tg
from tracegym.envs.taskset import seeded_rows


class CountConfig(tg.TasksetConfig):
    """Options of the typed test taskset."""

    num_tasks: int = 3
    """How many tasks."""
    bonus: float = 0.5
    """What a right answer earns beyond 1.0."""


class CountData(tg.TaskData):
    """A row with a typed field."""

    target: int
    """The number to say."""


class CountTask(tg.Task[CountData, CountConfig]):
    @tg.reward
    def said_it(self, trace: tg.Trace) -> float:
        return (1.0 + self.config.bonus) * float(trace.last_reply == str(self.data.target))

    @tg.metric(name="length")
    def reply_length(self, trace: tg.Trace) -> float:
        return float(len(trace.last_reply))


def make_row(rng: random.Random, cfg: CountConfig, index: int) -> CountData:
    return CountData(id=f"count-{index}", prompt="Say a number.", target=rng.randint(0, 9))


class Counting(tg.Taskset[CountConfig]):
    id = "counting"
    task_class = CountTask

    def load(self) -> Iterator[CountData]:
        return seeded_rows(make_row, self.config, self.config.num_tasks)


@tg.reward(weight=0.5)
def short(task: tg.Task, trace: tg.Trace) -> float:
    return float(len(trace.last_reply) < 10)


@tg.stop
async def never(task: tg.Task, trace: tg.Trace) -> bool:
    return False


def test_the_type_argument_is_the_config_class():
    taskset = Counting({"bonus": 2.0})
    assert Counting.Config is CountConfig
    assert_type(taskset.config, CountConfig)
    assert taskset.config.bonus == 2.0


def test_a_task_reads_its_row_type_and_its_tasksets_config():
    taskset = Counting({"bonus": 2.0})
    task = taskset.task(taskset[0])
    assert CountTask.data_class is CountData and taskset.data_class is CountData
    assert isinstance(task, CountTask) and task.config is taskset.config
    assert isinstance(task.data, CountData)


def test_a_row_read_back_from_a_trace_is_the_task_row_type_again():
    taskset = Counting()
    row = taskset[1]
    back = tg.Trace.model_validate_json(tg.Trace(task=row, taskset="counting").model_dump_json()).task
    assert type(back) is tg.TaskData and taskset.as_data(back) == row
    assert isinstance(taskset.task(back).data, CountData)


def test_a_task_built_without_a_taskset_reads_its_config_defaults():
    task = CountTask(CountData(prompt="x", target=1))
    assert task.config == CountConfig()
    assert tg.Task(tg.TaskData(prompt="x")).config == tg.TasksetConfig()


def test_a_taskset_built_from_parts_keeps_the_config_it_is_given():
    taskset = tg.Taskset(CountConfig(bonus=1.0), id="parts", description="From parts.", data=[{"prompt": "x"}])
    assert_type(taskset, tg.Taskset[CountConfig])
    assert taskset.config.bonus == 1.0 and taskset.description == "From parts."
    assert_type(tg.Taskset(id="plain", data=[]).config, tg.TasksetConfig)


def test_a_config_class_that_differs_from_the_type_argument_is_refused():
    with pytest.raises(TypeError, match="Config = TasksetConfig differs from its type argument CountConfig"):

        class Confused(tg.Taskset[CountConfig]):
            Config = tg.TasksetConfig


def test_seeded_rows_are_the_same_for_the_same_seed_and_endless_without_a_count():
    first = [r.target for r in seeded_rows(make_row, CountConfig(seed=3), 20)]
    assert first == [r.target for r in seeded_rows(make_row, CountConfig(seed=3), 20)]
    endless = seeded_rows(make_row, CountConfig(seed=3), None)
    assert [next(endless).target for _ in range(25)][:20] == first


def test_decorators_return_the_function_with_its_signature():
    def plain(task: tg.Task, trace: tg.Trace) -> float:
        return 1.0

    assert tg.reward(plain) is plain
    assert inspect.signature(short).parameters.keys() == {"task", "trace"}
    assert inspect.iscoroutinefunction(never)
    assert_type(CountTask.said_it(CountTask(CountData(prompt="x", target=1)), tg.Trace(task=tg.TaskData(prompt="x"))),
                float)
    assert_type(short(tg.Task(tg.TaskData(prompt="x")), tg.Trace(task=tg.TaskData(prompt="x"))), float)


def test_this_file_type_checks_under_mypy():
    pytest.importorskip("mypy", reason="mypy is not installed here")
    src = Path(__file__).parents[2] / "src"  # this checkout's sources, as the tests import them
    done = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--check-untyped-defs", __file__],
                          capture_output=True, text=True, env={**os.environ, "MYPYPATH": str(src)})
    assert done.returncode == 0, done.stdout
