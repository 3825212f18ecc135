"""A trace says how a rollout was cut short or misread (`Trace.cut`): overlong (the prompt no longer fit), length
(a reply ran into `max_tokens`) and unparsable (a reply that did not parse) are three different things."""

import asyncio

import tracegym as tg
from tracegym.core.errors import ContextLengthError
from tracegym.core.trace import Cut
from tracegym.envs.seats import Seat
from tracegym.testing import ScriptedModel, reply, tool_call


@tg.reward
def answered(task, trace):
    return float(bool(trace.last_reply))


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


TASKSET = tg.Taskset(id="cuts", data=[{"prompt": "q"}], rewards=[answered], tools=[add], max_turns=3)


def rollout(model: ScriptedModel) -> tg.Trace:
    [data] = list(TASKSET)
    return asyncio.run(tg.run_rollout(TASKSET, data, model))


def overflow(request):
    raise ContextLengthError("This model's maximum context length is 2048 tokens; your prompt has 70412")


def test_a_prompt_that_no_longer_fits_is_overlong():
    trace = rollout(ScriptedModel([reply(None, tool_call("add", {"a": 1, "b": 2})), overflow]))
    assert trace.stop_reason == tg.StopReason.TRUNCATED and trace.cut == Cut.OVERLONG


def test_a_reply_cut_at_max_tokens_is_length():
    trace = rollout(ScriptedModel(["a long answer that ran"], finish_reason="length"))
    assert trace.stop_reason == tg.StopReason.TRUNCATED and trace.cut == Cut.LENGTH


def test_a_tool_call_that_is_not_json_is_unparsable_and_the_rollout_goes_on():
    trace = rollout(ScriptedModel([reply(None, tool_call("add", '{"a": 1, "b": ')), "3"]))
    assert trace.cut == Cut.UNPARSABLE and trace.unparsable_turns == 1
    assert trace.stop_reason == tg.StopReason.COMPLETED and trace.reward == 1.0


def test_a_tool_call_without_a_name_is_unparsable():
    trace = rollout(ScriptedModel([reply(None, tool_call("", {"a": 1})), "3"]))
    assert trace.cut == Cut.UNPARSABLE


def test_a_rollout_that_ended_on_its_own_terms_is_not_cut():
    trace = rollout(ScriptedModel([reply(None, tool_call("add", {"a": 1, "b": 2})), "3"]))
    assert trace.cut is None and trace.unparsable_turns == 0


def test_the_end_comes_before_a_turn_along_the_way():
    trace = rollout(ScriptedModel([reply(None, tool_call("add", "[1, 2]")), "and then"], finish_reason=None))
    trace_cut = rollout(ScriptedModel([reply(None, tool_call("add", "[1, 2]")), overflow]))
    assert (trace.cut, trace_cut.cut) == (Cut.UNPARSABLE, Cut.OVERLONG)


class Duel(tg.MultiAgentTask):
    """Two members, one move each."""

    seats = (tg.Member(id="a", system_prompt="You are a."), tg.Member(id="b", system_prompt="You are b."))

    def schedule(self):
        yield tg.Slot("a")
        yield tg.Slot("b")

    def act(self, member, move):
        pass

    @tg.reward
    def moved(self, trace):
        return 1.0


def test_a_members_move_cut_at_max_tokens_is_length_though_the_episode_goes_on():
    class Duels(tg.Taskset):
        id = "duel"
        task_class = Duel

    taskset = Duels(data=[{"prompt": "go"}])
    rambler = Seat(model=ScriptedModel(["a move that ran on"], finish_reason="length"))
    episode = asyncio.run(tg.run_episode(taskset, taskset[0], ScriptedModel(["b moves"]), seats={"a": rambler}))
    assert episode.stop_reason == tg.StopReason.COMPLETED
    assert (episode.traces["a"].cut, episode.traces["b"].cut) == (Cut.LENGTH, None)
