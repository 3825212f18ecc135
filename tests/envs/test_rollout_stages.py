"""Rollout stages: the spans a rollout records, usage sums, and how a stage that hangs or raises ends it."""

import asyncio

import tracegym as tg
from tracegym.testing import ScriptedModel, Stall, reply, tool_call
from tracegym.testing.scripted_model import encode, render, render_body


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@tg.reward
def said_three(task, trace):
    return float(trace.last_reply == "3")


@tg.stop
def never(task, trace):
    return False


class AskOnce(tg.Task):
    """Answers the first reply without a tool call with a follow-up, then ends."""

    async def env_response(self, trace):
        return "sure?" if trace.num_turns == 2 else None


def taskset(task_class=AskOnce, stops=(never,), rewards=(said_three,), **options):
    class Stages(tg.Taskset):
        id = "stages"

    Stages.task_class = task_class
    return Stages(data=[{"prompt": "1+2?"}], rewards=list(rewards), stops=list(stops), tools=[add], **options)


def three_turns(stall=0.0):
    """A tool call, an answer the task questions, the answer again (each reply after `stall` seconds)."""
    return ScriptedModel([Stall(stall, reply(None, tool_call("add", {"a": 1, "b": 2}))), Stall(stall, "3"),
                          Stall(stall, "3")])


# --- spans, durations and usage --------------------------------------------------------------------------
async def test_a_multi_turn_tool_rollout_records_one_span_per_stage_in_order():
    [trace] = await tg.evaluate(taskset(), three_turns())
    assert [(s.name, s.turn) for s in trace.spans] == [
        ("setup", None),
        ("model", 0), ("tool:add", 0), ("stop:never", 0),
        ("model", 1), ("env_response", 1), ("stop:never", 1),
        ("model", 2), ("env_response", 2),
        ("scoring", None), ("total", None)]


async def test_spans_are_ordered_in_time_and_lie_within_the_total():
    [trace] = await tg.evaluate(taskset(), three_turns())
    total = trace.spans[-1]
    assert all(s.start <= s.end for s in trace.spans)
    assert [s.start for s in trace.spans[:-1]] == sorted(s.start for s in trace.spans[:-1])
    assert all(s.start >= 0.0 and s.end <= total.end for s in trace.spans)


async def test_duration_of_a_stage_sums_its_spans_and_the_total_covers_them():
    [trace] = await tg.evaluate(taskset(), three_turns(stall=0.05))
    model_spans = [s for s in trace.spans if s.name == "model"]
    assert trace.duration("model") == sum(s.duration for s in model_spans)
    assert trace.duration("model") >= 0.14  # three replies, each stalled 0.05 s
    assert trace.duration("stop") == sum(s.duration for s in trace.spans if s.name.startswith("stop:"))
    assert trace.duration() >= trace.duration("model") + trace.duration("tool") + trace.duration("scoring")


async def test_usage_sums_every_model_call_and_completion_length_is_its_sampled_tokens():
    model = three_turns()
    model.tokens = True
    [trace] = await tg.evaluate(taskset(), model)
    replies = [m for m in trace.messages if m.role == "assistant"]
    assert trace.usage.prompt_tokens == sum(len(encode(render(r.messages))) for r in model.requests)
    assert trace.usage.completion_tokens == sum(len(encode(render_body(m))) for m in replies)
    assert trace.completion_length == trace.usage.completion_tokens
    assert trace.completion_length == sum(sum(n.mask) for n in trace.graph.nodes if n.mask)


# --- stage timeouts --------------------------------------------------------------------------------------
class HangingResponse(tg.Task):
    async def env_response(self, trace):
        await asyncio.sleep(10)


async def test_env_response_that_hangs_ends_the_rollout_with_a_timeout_at_env_response():
    [trace] = await tg.evaluate(taskset(HangingResponse, stops=()), ScriptedModel(["3"]),
                                timeouts=tg.Timeouts(env_response=0.05))
    assert trace.stop_reason == tg.StopReason.TIMEOUT
    assert [(e.kind, e.stage, e.turn) for e in trace.errors] == [(tg.ErrorKind.TIMEOUT, "env_response", 0)]
    assert trace.rewards["said_three"].score is None


async def test_reward_past_the_scoring_timeout_is_none_with_a_timeout_error_and_the_others_score():
    @tg.reward
    async def slow(task, trace):
        await asyncio.sleep(10)
        return 1.0

    ts = taskset(tg.Task, stops=(), rewards=(slow, said_three))
    [trace] = await tg.evaluate(ts, ScriptedModel(["3"]), timeouts=tg.Timeouts(scoring=0.5))  # said_three's too
    assert trace.rewards["slow"].score is None and trace.rewards["said_three"].score == 1.0
    assert [(e.kind, e.stage) for e in trace.errors] == [(tg.ErrorKind.TIMEOUT, "scoring:slow")]
    assert trace.stop_reason == tg.StopReason.COMPLETED and trace.reward is None


# --- a stop that fails -----------------------------------------------------------------------------------
@tg.stop
def broken(task, trace):
    raise RuntimeError("no board")


async def test_stop_that_raises_ends_the_rollout_with_a_task_error_naming_the_stop():
    [trace] = await tg.evaluate(taskset(stops=(never, broken)), three_turns())
    assert trace.stop_reason == tg.StopReason.ERROR and trace.num_turns == 1
    assert [(e.kind, e.stage, e.message, e.turn) for e in trace.errors] == [
        (tg.ErrorKind.TASK, "stop:broken", "RuntimeError: no board", 0)]


async def test_stop_that_raises_leaves_rewards_and_metrics_unscored():
    @tg.metric
    def turns(task, trace):
        return trace.num_turns

    [trace] = await tg.evaluate(taskset(stops=(broken,), metrics=[turns]), three_turns())
    assert trace.rewards["said_three"].score is None and trace.metrics["turns"] is None and not trace.ok


async def test_stop_past_the_scoring_timeout_ends_the_rollout_with_a_timeout_naming_the_stop():
    @tg.stop
    async def stuck(task, trace):
        await asyncio.sleep(10)

    [trace] = await tg.evaluate(taskset(stops=(stuck,)), three_turns(), timeouts=tg.Timeouts(scoring=0.05))
    assert trace.stop_reason == tg.StopReason.TIMEOUT
    assert [(e.kind, e.stage) for e in trace.errors] == [(tg.ErrorKind.TIMEOUT, "stop:stuck")]


# --- a TimeoutError the stage raises itself --------------------------------------------------------------
async def test_a_timeout_error_raised_by_a_reward_is_a_task_error_saying_how_long_it_took():
    @tg.reward
    def remote(task, trace):
        raise TimeoutError("socket")

    ts = taskset(tg.Task, stops=(), rewards=(remote, said_three))
    [trace] = await tg.evaluate(ts, ScriptedModel(["3"]))
    assert trace.rewards["remote"].score is None and trace.rewards["said_three"].score == 1.0
    [error] = trace.errors
    assert (error.kind, error.stage) == (tg.ErrorKind.TASK, "scoring:remote")
    assert error.message.startswith("TimeoutError: socket (raised by the stage itself after 0.")
    assert "within its 60 s limit" in error.message


async def test_a_timeout_error_raised_by_the_env_response_is_a_task_error_not_a_stage_timeout():
    class Flaky(tg.Task):
        async def env_response(self, trace):
            raise TimeoutError("socket")

    [trace] = await tg.evaluate(taskset(Flaky, stops=()), ScriptedModel(["3"]))
    assert trace.stop_reason == tg.StopReason.ERROR and trace.failure == "task_error"
    [error] = trace.errors
    assert (error.kind, error.stage) == (tg.ErrorKind.TASK, "env_response")
    assert error.message.startswith("TimeoutError: socket (raised by the stage itself")


def fetch(url: str) -> str:
    """Fetch a page.

    Args:
        url: Where.
    """
    raise TimeoutError("socket")


async def test_a_timeout_error_raised_by_a_tool_is_a_tool_error_the_model_sees():
    ts = tg.Taskset(id="t", data=[{"prompt": "1+2?"}], rewards=[said_three], tools=[fetch])
    [trace] = await tg.evaluate(ts, ScriptedModel([reply(None, tool_call("fetch", {"url": "x"})), "3"]))
    assert trace.ok and trace.reward == 1.0
    [error] = trace.errors
    assert (error.kind, error.stage) == (tg.ErrorKind.TOOL, "tool:fetch")
    assert trace.messages[2].text.startswith("Error: TimeoutError: socket (raised by the stage itself")


async def test_a_stage_past_its_deadline_says_which_stage_and_the_limit():
    [trace] = await tg.evaluate(taskset(HangingResponse, stops=()), ScriptedModel(["3"]),
                                timeouts=tg.Timeouts(env_response=0.05))
    assert trace.errors[0].message == "env_response timed out: the stage ran past 0.05 s"
