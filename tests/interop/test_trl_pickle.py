"""The TRL adapter's environment classes and reward functions pickle (TRL's AsyncGRPOTrainer sends them to a spawned
process) and score there as here; what cannot cross, and a multi-agent taskset, are refused by name."""

import json
import multiprocessing
import pickle

import pytest
from test_trl_taskset_adapter import TrlLoop

import tracegym as tg
from tracegym.interop.trl import environment_factory, reward_functions, train_dataset
from tracegym.tasksets.counter_env import CounterEnv


def play(factory, functions, rows):
    """Every row played to the target by its right tool, as GRPOTrainer would drive it; the rewards."""
    loop = TrlLoop(factory, rows)
    for index, row in enumerate(rows):
        data = tg.load_taskset("counter-env").as_data(json.loads(row["tracegym_task"]))
        name = "increment" if data.target > data.start else "decrement"
        loop.turn(index, calls=[(name, {"amount": abs(data.target - data.start)})])
        loop.turn(index, "done")
    return loop.rewards(functions)


def play_pickled(blob, rows):
    factory, functions = pickle.loads(blob)
    return play(factory, functions, rows)


def test_the_class_and_reward_functions_round_trip_through_pickle_and_score_alike():
    taskset = tg.load_taskset("counter-env")
    rows = train_dataset(taskset, num_tasks=3).to_list()
    factory, functions = environment_factory(taskset), reward_functions(taskset)
    again, functions_again = pickle.loads(pickle.dumps((factory, functions)))
    assert again.__name__ == factory.__name__ and [f.__name__ for f in functions_again] == ["reached_target"]
    assert pickle.loads(pickle.dumps(factory)) is again  # one class per recipe in a process
    assert play(again, functions_again, rows) == play(factory, functions, rows)


def test_a_spawned_process_scores_the_pickled_class_as_this_one_does():
    taskset = tg.load_taskset("counter-env", {"seed": 3})
    rows = train_dataset(taskset, num_tasks=2).to_list()
    blob = pickle.dumps((environment_factory(taskset), reward_functions(taskset)))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        theirs = pool.apply(play_pickled, (blob, rows))
    assert theirs == play(environment_factory(taskset), reward_functions(taskset), rows)


def test_a_taskset_built_in_code_whose_id_does_not_load_is_refused_at_pickling_naming_it():
    taskset = tg.EnvironmentTaskset(CounterEnv, id="my-counter", data=[{"prompt": "Go.", "start": 0, "target": 1,
                                                                         "max_step": 2}])
    with pytest.raises(pickle.PicklingError, match="taskset 'my-counter' cannot be rebuilt from its id"):
        pickle.dumps(environment_factory(taskset))


def test_a_multi_agent_taskset_is_refused_naming_its_seats():
    with pytest.raises(tg.UsageError, match=r"taskset 'kuhn-poker' is multi-agent \(seats '.+', '.+'\)"):
        environment_factory(tg.load_taskset("kuhn-poker"))


def test_reward_functions_called_without_environments_replay_the_tool_calls_and_score_alike():
    """TRL's AsyncGRPOTrainer calls reward functions with the dataset's columns but no `environments`."""
    taskset = tg.load_taskset("counter-env")
    rows = train_dataset(taskset, num_tasks=3).to_list()
    data = taskset.as_data(json.loads(rows[0]["tracegym_task"]))
    name = "increment" if data.target > data.start else "decrement"
    loop = TrlLoop(environment_factory(taskset), rows)
    loop.turn(0, calls=[(name, {"amount": 99}), (name, {"amount": abs(data.target - data.start)})])  # 1st fails
    for index in range(len(rows)):
        loop.turn(index, "done")
    [with_environments] = loop.rewards(reward_functions(taskset))
    assert with_environments == [1.0, 0.0, 0.0]
    [function] = reward_functions(taskset)
    columns = {k: [row[k] for row in rows] for k in rows[0] if k != "prompt"}
    without = function(prompts=loop.prompts, completions=loop.completions, completion_ids=[[] for _ in rows],
                       **columns)
    assert without == with_environments and len(without) == 3
