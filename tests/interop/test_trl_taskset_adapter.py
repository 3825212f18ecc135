"""tracegym tasksets as TRL's `GRPOTrainer` takes them, driven here the way GRPOTrainer drives them (its reset,
tool-call and reward-function calls, replayed by `TrlLoop`); a real GRPOTrainer step is in test_trl_grpo_step.py."""

import inspect
import json
import math

import pytest
from transformers.utils import get_json_schema

import tracegym as tg
from tracegym.interop.trl import (
    TASK_COLUMN,
    environment_factory,
    observation,
    reward_functions,
    reward_weights,
    train_dataset,
)
from tracegym.testing import ScriptedModel, reply, tool_call


class TrlLoop:
    """GRPOTrainer's calls, as `_generate_and_score_completions`, `_tool_call_loop` and `_calculate_rewards` make
    them: one environment instance per row, `reset(**row)` (without `environment` when the factory is a dict),
    its text appended to the last prompt message, tool calls as `method(**arguments)` (an exception is the tool's
    `{"error": ...}`), then every reward function with every keyword argument."""

    def __init__(self, factory, rows):
        self.multiple = isinstance(factory, dict)
        self.environments = [(factory[row["environment"]] if self.multiple else factory)() for row in rows]
        self.rows, self.prompts, self.completions = rows, [], []
        for env, row in zip(self.environments, rows, strict=True):
            kwargs = {k: v for k, v in row.items() if k != "environment"} if self.multiple else row
            added = env.reset(**kwargs)
            prompt = [dict(m) for m in row["prompt"]]
            if added is not None:
                prompt[-1] = {**prompt[-1], "content": prompt[-1]["content"] + added}
            self.prompts.append(prompt)
            self.completions.append([])

    def turn(self, index, content="", calls=()):
        """The model's turn on row `index`: its message, then each tool call answered as TRL answers it."""
        calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
        self.completions[index].append({"role": "assistant", "content": content, **({"tool_calls": calls} if calls
                                                                                     else {})})
        for call in calls:
            try:
                result = getattr(self.environments[index], call["function"]["name"])(**call["function"]["arguments"])
            except Exception as exc:
                result = {"error": str(exc)}
            self.completions[index].append({"role": "tool", "name": call["function"]["name"], "content": str(result)})

    def rewards(self, functions, logged=None):
        columns = {k: [row[k] for row in self.rows] for k in self.rows[0] if k not in ("prompt", "completion")}
        return [fn(prompts=self.prompts, completions=self.completions, completion_ids=[[] for _ in self.rows],
                   trainer_state=None, log_extra=lambda column, values: None,
                   log_metric=lambda name, value: (logged if logged is not None else {}).__setitem__(name, value),
                   environments=self.environments, **columns) for fn in functions]


def test_the_dataset_holds_each_tasks_prompt_and_row():
    taskset = tg.load_taskset("tool-calculator")
    dataset = train_dataset(taskset, num_tasks=3)
    assert dataset.column_names == ["prompt", TASK_COLUMN] and len(dataset) == 3
    first = taskset[0]
    assert dataset[0]["prompt"] == [{"role": m.role, "content": m.text} for m in first.initial_messages()]
    assert taskset.as_data(json.loads(dataset[0][TASK_COLUMN])) == first


def test_several_tasksets_interleave_with_an_environment_column():
    dataset = train_dataset(tg.load_taskset("counter-env"), tg.load_taskset("reverse-text"), num_tasks=2)
    assert dataset["environment"] == ["counter-env", "reverse-text", "counter-env", "reverse-text"]


def test_an_infinite_taskset_needs_a_bound_and_ids_must_differ():
    with pytest.raises(tg.UsageError, match="'arithmetic' is infinite: give num_tasks"):
        train_dataset(tg.load_taskset("arithmetic"))
    with pytest.raises(tg.UsageError, match="distinct ids"):
        environment_factory(tg.load_taskset("reverse-text"), tg.load_taskset("reverse-text"))


def test_the_environment_class_offers_the_tasks_tools_exactly_as_trl_lists_and_describes_them():
    env_class = environment_factory(tg.load_taskset("tool-calculator"))
    listed = [n for n, _ in inspect.getmembers(env_class, inspect.isfunction)
              if n not in ("reset", "get_reward") and not n.startswith("_")]
    assert listed == ["add", "divide", "multiply", "subtract"]
    from tracegym.tasksets import tool_calculator
    env = env_class()
    assert [get_json_schema(getattr(env, n)) for n in listed] == [
        get_json_schema(getattr(tool_calculator, n)) for n in listed]  # the task's own functions, described


def test_reset_returns_what_the_tasks_setup_adds_to_the_prompt():
    taskset = tg.load_taskset("counter-env")
    loop = TrlLoop(environment_factory(taskset), train_dataset(taskset, num_tasks=1).to_list())
    data = taskset[0]
    assert loop.prompts[0][-1]["content"] == f"{data.prompt}\n\nThe counter starts at {data.start} and the target is " \
                                             f"{data.target}. Each call moves it by 1 to {data.max_step}."


async def test_rewards_from_the_environments_equal_tracegyms_own_rollout_of_the_same_conversation():
    taskset = tg.load_taskset("counter-env")
    data = taskset[0]
    name = "increment" if data.target > data.start else "decrement"
    step = abs(data.target - data.start)
    script = [reply(None, tool_call(name, {"amount": 99})), reply(None, tool_call(name, {"amount": step})), "done"]
    loop = TrlLoop(environment_factory(taskset), train_dataset(taskset, num_tasks=1).to_list())
    loop.turn(0, calls=[(name, {"amount": 99})])
    loop.turn(0, calls=[(name, {"amount": step})])
    loop.turn(0, "done")
    logged = {}
    [[trl_reward]] = loop.rewards(reward_functions(taskset), logged)
    [trace] = await tg.evaluate(taskset.head(1), ScriptedModel(script))
    assert step <= 5 and trl_reward == trace.rewards["reached_target"].score == 1.0
    assert loop.completions[0][1]["content"] == "{'error': 'amount must be from 1 to 5, got 99'}"  # as TRL reports it
    assert logged == {"counter-env/distance": 0.0}  # the taskset's metrics, logged once per batch
    assert reward_weights(taskset) == [1.0]


def test_reward_functions_of_several_tasksets_are_not_applicable_to_each_others_rows():
    tasksets = [tg.load_taskset("counter-env"), tg.load_taskset("reverse-text")]
    rows = train_dataset(*tasksets, num_tasks=2).to_list()
    loop = TrlLoop(environment_factory(*tasksets), rows)
    for index in range(len(rows)):
        loop.turn(index, "done")
    functions = reward_functions(*tasksets)
    assert [f.__name__ for f in functions] == ["counter-env/reached_target", "reverse-text/lcs"]
    counter, reverse = loop.rewards(functions)
    assert [r is None for r in counter] == [False, True, False, True]
    assert [r is None for r in reverse] == [True, False, True, False]
    # TRL: rewards_per_func with None as NaN, summed with nansum: every row gets a number
    totals = [math.fsum(r for r in row if r is not None) for row in zip(counter, reverse, strict=True)]
    assert not any(math.isnan(t) for t in totals) and counter[0] == 0.0


def test_a_setup_that_rewrites_the_prompt_is_refused_as_trl_cannot_express_it():
    before = [tg.Message(role="user", content="a")]
    assert observation(before, [tg.Message(role="user", content="ab")]) == "b"
    assert observation(before, before) is None
    with pytest.raises(tg.UsageError, match="beyond appending to the last message"):
        observation(before, [tg.Message(role="user", content="z")])
