"""The interception proxy over HTTP: streamed replies (SSE) as agent SDKs read them, OpenAI-style refusals of
unknown and finished keys and of malformed bodies, per-call timeouts, and calls after the rollout fail fast."""

import asyncio
import json
import time

import aiohttp
import openai
import pytest

from tracegym.core.errors import ErrorKind, InfrastructureError
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason, Trace
from tracegym.envs.proxy import InterceptionProxy
from tracegym.envs.rollout import Rollout, Timeouts
from tracegym.envs.task import Task
from tracegym.testing import Fail, ScriptedModel, Stall, reply, tool_call

QUESTION = [{"role": "user", "content": "q"}]


def a_rollout(client, max_turns: int = 10, **timeouts) -> Rollout:
    task = Task(TaskData(prompt="q"), max_turns=max_turns)
    return Rollout(task, client, Sampling(max_tokens=64), Timeouts(**timeouts), Trace(task=task.data))


async def post(url: str, body, headers=None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.post(url, data=body if isinstance(body, bytes) else
                                                          json.dumps(body), headers=headers) as answer:
        return answer.status, await answer.json(content_type=None)


async def test_streaming_carries_content_tool_calls_finish_reason_and_usage():
    call = tool_call("lookup", {"q": "x"}, id="call_1")
    rollout = a_rollout(ScriptedModel([reply("thinking", call), "done"], tokens=True))
    async with InterceptionProxy.shared().lease(rollout) as lease:
        client = openai.AsyncOpenAI(base_url=lease.base_url, api_key="k", max_retries=0)
        stream = await client.chat.completions.create(model="m", messages=QUESTION, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        # the SDK's stream helper assembles the same reply
        async with client.chat.completions.stream(model="m", messages=[
                *QUESTION, {"role": "assistant", "content": "thinking", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "found"}]) as helper:
            final = await helper.get_final_completion()
        await client.close()
    assert text == "thinking" and finish == ["tool_calls"]
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [("call_1", "lookup", '{"q": "x"}')]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert final.choices[0].message.content == "done"
    assert len(rollout.trace.graph.branches()) == 1 and rollout.trace.num_turns == 2


async def test_unknown_and_finished_keys_are_refused_with_openai_error_bodies():
    proxy = InterceptionProxy.shared()
    rollout = a_rollout(ScriptedModel(["ok"]))
    async with proxy.lease(rollout) as lease:
        root = lease.base_url.split("/r/")[0]
        status, body = await post(f"{root}/r/not-a-key/v1/chat/completions", {"messages": QUESTION})
        assert (status, body["error"]["code"], body["error"]["type"]) == (401, "invalid_api_key",
                                                                           "invalid_request_error")
        client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(model="m", messages=QUESTION)
        await client.close()
        async with proxy.lease(a_rollout(ScriptedModel(["other"]))) as other:
            pass  # another rollout, finished while this one runs
        status, body = await post(other.base_url + "/chat/completions", {"messages": QUESTION})
        assert (status, body["error"]["code"]) == (404, "rollout_finished")
        status, body = await post(f"{root}/elsewhere", {})
        assert status == 404 and "chat/completions" in body["error"]["message"]
    assert not rollout.trace.errors and not rollout.trace.graph.nodes  # refusals touch no rollout


@pytest.mark.parametrize(("body", "param"), [
    (b"{not json", None),
    ({"model": "m"}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages[0]"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ({"messages": QUESTION, "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": QUESTION, "max_tokens": -3}, "max_tokens"),
    ({"messages": QUESTION, "n": 2}, "n"),
])
async def test_a_malformed_body_is_a_400_and_ends_the_rollout_with_an_error_at_the_model_stage(body, param):
    rollout = a_rollout(ScriptedModel(["never"]))
    async with InterceptionProxy.shared().lease(rollout) as lease:
        status, answer = await post(lease.base_url + "/chat/completions", body)
        assert lease.ended.result() == StopReason.ERROR
        again, _ = await post(lease.base_url + "/chat/completions", {"messages": QUESTION})
    assert status == 400 and answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == param
    assert again == 404  # the rollout has ended: nothing more is answered
    [error] = rollout.trace.errors
    assert (error.kind, error.stage) == (ErrorKind.TASK, "model") and "malformed" in error.message


async def test_a_call_past_the_model_timeout_is_a_504_and_ends_the_rollout_as_a_timeout():
    rollout = a_rollout(ScriptedModel([Stall(None)]), model=0.2)
    async with InterceptionProxy.shared().lease(rollout) as lease:
        start = time.monotonic()
        status, body = await post(lease.base_url + "/chat/completions", {"messages": QUESTION})
        took = time.monotonic() - start
    assert status == 504 and body["error"]["code"] == "model_timeout" and took < 20  # the stall is endless
    assert lease.ended.result() == StopReason.TIMEOUT
    [error] = rollout.trace.errors
    assert (error.kind, error.stage) == (ErrorKind.TIMEOUT, "model")
    assert [s.name for s in rollout.trace.spans] == ["model"]


async def test_a_failed_model_call_is_classified_as_the_loop_classifies_it():
    model = ScriptedModel([Fail(503, "endpoint down")])
    rollout = a_rollout(model)
    async with InterceptionProxy.shared().lease(rollout) as lease:
        status, body = await post(lease.base_url + "/chat/completions", {"messages": QUESTION})
    assert status == 502 and "endpoint down" in body["error"]["message"]
    [error] = rollout.trace.errors
    assert (error.kind, error.stage) == (ErrorKind.INFRASTRUCTURE, "model")
    assert isinstance(Fail(503).error, InfrastructureError)


async def test_a_call_in_flight_when_the_rollout_ends_is_cut_and_later_calls_fail_fast():
    proxy = InterceptionProxy.shared()
    async with proxy.lease(a_rollout(ScriptedModel())):  # another rollout keeps the server up
        rollout = a_rollout(ScriptedModel([Stall(None)]))
        async with proxy.lease(rollout) as lease:
            pending = asyncio.create_task(post(lease.base_url + "/chat/completions", {"messages": QUESTION}))
            await asyncio.sleep(0.2)  # the call is with the model; then the rollout ends (its deadline, say)
        status, body = await asyncio.wait_for(pending, 5)
        assert (status, body["error"]["code"]) == (404, "rollout_finished")
        start = time.monotonic()
        status, _ = await post(lease.base_url + "/chat/completions", {"messages": QUESTION})
        assert status == 404 and time.monotonic() - start < 10  # not held like the cut call
    assert [s.name for s in rollout.trace.spans] == ["model"] and not rollout.trace.errors


async def test_calls_past_max_turns_are_refused_and_end_the_rollout_normally():
    rollout = a_rollout(ScriptedModel(rule=lambda r: "again"), max_turns=2)
    async with InterceptionProxy.shared().lease(rollout) as lease:
        history = list(QUESTION)
        for _ in range(2):
            status, body = await post(lease.base_url + "/chat/completions", {"messages": history})
            history += [body["choices"][0]["message"], {"role": "user", "content": "more"}]
        status, body = await post(lease.base_url + "/chat/completions", {"messages": history})
    assert (status, body["error"]["code"]) == (429, "max_turns")
    assert lease.ended.result() == StopReason.MAX_TURNS and rollout.trace.num_turns == 2


async def test_the_request_may_lower_max_tokens_and_add_stops_but_not_change_the_rollouts_sampling():
    model = ScriptedModel(["ok", "ok"])
    rollout = a_rollout(model)
    async with InterceptionProxy.shared().lease(rollout) as lease:
        await post(lease.base_url + "/chat/completions", {"messages": QUESTION, "max_tokens": 8, "stop": "END",
                                                          "temperature": 0.0})
        await post(lease.base_url + "/chat/completions", {"messages": QUESTION, "max_completion_tokens": 4096})
    first, second = (r.sampling for r in model.requests)
    assert (first.max_tokens, first.stop, first.temperature) == (8, ["END"], 1.0)
    assert second.max_tokens == 64


async def test_the_server_runs_while_leases_are_open_and_stops_after_the_last():
    proxy = InterceptionProxy.shared()
    async with proxy.lease(a_rollout(ScriptedModel())) as one:
        async with proxy.lease(a_rollout(ScriptedModel())) as two:
            assert one.base_url.split("/r/")[0] == two.base_url.split("/r/")[0]
            assert one.key != two.key
        assert proxy.port is not None
    assert proxy.port is None
