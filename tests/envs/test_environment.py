"""Class-based environments (TRL `environment_factory` shape), pinned on counter-env's CounterEnv."""

from typing import ClassVar

import tracegym as tg
from tracegym.envs.environment import environment_tools
from tracegym.tasksets.counter_env import PROMPT, CounterEnv, reached_target, rules
from tracegym.testing import ScriptedModel, Stall, reply, tool_call

ROW = {"id": "c", "prompt": PROMPT, "start": 0, "target": 3, "max_step": 5}


class Recorded(CounterEnv):
    """CounterEnv that keeps every instance it makes (the test resets the list)."""

    made: ClassVar[list["Recorded"]] = []

    def __init__(self) -> None:
        super().__init__()
        Recorded.made.append(self)


def _taskset(rewards=(reached_target,)) -> tg.EnvironmentTaskset:
    Recorded.made = []
    return tg.EnvironmentTaskset(Recorded, id="counter", data=[ROW], rewards=list(rewards))


def test_only_public_methods_become_tools():
    assert sorted(t.name for t in environment_tools(CounterEnv)) == ["decrement", "get_count", "increment"]


async def test_model_is_offered_exactly_the_environment_tools():
    model = ScriptedModel(["done"])
    await tg.evaluate(_taskset(), model)
    assert sorted(s.name for s in model.requests[0].tools) == ["decrement", "get_count", "increment"]


async def test_reset_text_is_appended_to_the_prompt():
    [trace] = await tg.evaluate(_taskset(), ScriptedModel(["done"]))
    assert trace.prompt_length == 1
    assert trace.prompt[0].text == f"{PROMPT}\n\n{rules(0, 3, 5)}"


async def test_each_concurrent_rollout_gets_its_own_instance():
    script = [Stall(0.01, reply(None, tool_call("increment", {"amount": 3}))), "done"]
    traces = await tg.evaluate(_taskset(), ScriptedModel(script), rollouts=4)
    assert len({id(env) for env in Recorded.made}) == len(Recorded.made) == 4
    assert [env.count for env in Recorded.made] == [3] * 4  # a shared instance would have counted to 12
    assert [t.reward for t in traces] == [1.0] * 4


async def test_trl_reward_gets_the_rollouts_instance_and_columns_as_lists():
    seen = {}

    def record(prompts, completions, environments, **columns):
        seen.update(prompts=prompts, completions=completions, environments=environments, columns=columns)
        return [1.0]

    [trace] = await tg.evaluate(_taskset([record]), ScriptedModel(["done"]))
    assert seen["environments"] == Recorded.made and len(Recorded.made) == 1
    assert seen["columns"]["target"] == [3] and "prompt" not in seen["columns"]
    assert seen["prompts"][0][0]["role"] == "user" and seen["completions"][0][-1]["content"] == "done"
    assert trace.rewards["record"].score == 1.0


async def test_tool_that_raises_is_reported_to_the_model_and_the_rollout_goes_on():
    script = [reply(None, tool_call("increment", {"amount": 99})), reply(None, tool_call("increment", {"amount": 3})),
              "done"]
    [trace] = await tg.evaluate(_taskset(), ScriptedModel(script))
    tool_texts = [m.text for m in trace.messages if m.role == "tool"]
    assert tool_texts == ["{'error': 'amount must be from 1 to 5, got 99'}", "The counter is now 3."]  # TRL's text
    assert trace.metrics["tool_errors"] == 1 and trace.errors[0].kind == tg.ErrorKind.TOOL
    assert trace.ok and trace.reward == 1.0
