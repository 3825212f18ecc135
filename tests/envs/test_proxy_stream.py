"""Streaming through the interception proxy: the endpoint's chunks reach the program while the model samples, the
trace records what the same calls record unstreamed, held-back markup and stop strings, and what a failure, a
timeout or a program that hangs up mid-stream does."""

import asyncio
import json
import time

import aiohttp
import openai
import pytest

from tracegym.core.errors import ErrorKind
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason, Trace
from tracegym.envs.program_reply import showable
from tracegym.envs.proxy import InterceptionProxy
from tracegym.envs.rollout import CALLS_ABANDONED, Rollout, Timeouts
from tracegym.envs.task import Task
from tracegym.models.chat_client import ChatClient
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import ChatMLRenderer
from tracegym.models.token_client import TokenClient
from tracegym.testing import FakeOpenAIServer, reply, tool_call
from tracegym.testing.char_tokenizer import CharTokenizer

QUESTION = [{"role": "user", "content": "q"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
SCRIPT = ["Let me see: 2 < 3, and <b>bold</b> stays.", reply("adding", tool_call("add", {"a": 2, "b": 3}, id="c1")),
          "It is 5."]


@pytest.fixture(scope="module")
def renderer() -> ChatMLRenderer:
    return ChatMLRenderer(CharTokenizer())


def a_client(server: FakeOpenAIServer, kind: str = "chat", renderer=None, **endpoint):
    settings = {"api_key_env": None, "backoff": 0.0, **endpoint}
    point = Endpoint(base_url=server.base_url, model=server.model, **settings)
    return TokenClient(point, renderer) if kind == "tokens" else ChatClient(point)


def a_rollout(client, max_turns: int = 10, **timeouts) -> Rollout:
    task = Task(TaskData(prompt="q"), max_turns=max_turns)
    return Rollout(task, client, Sampling(max_tokens=256, temperature=0.7), Timeouts(**timeouts),
                   Trace(task=task.data, model=client.name))


def sdk(lease) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=lease.base_url, api_key="k", max_retries=0)


async def converse(lease, stream: bool) -> list[dict]:
    """Three calls (a tool call and its result among them) as an agent makes them; per call, what the program
    read: the message it assembled, the finish reason, the usage, and its content deltas."""
    client, history, seen = sdk(lease), list(QUESTION), []
    for _ in range(3):
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model="m", messages=history, tools=TOOLS, stream=True, stream_options={"include_usage": True})]
            read = assembled(chunks)
        else:
            answer = await client.chat.completions.create(model="m", messages=history, tools=TOOLS)
            message = answer.choices[0].message.model_dump(exclude_none=True)
            read = {"message": message, "finish": answer.choices[0].finish_reason,
                    "usage": answer.usage.model_dump(exclude_none=True), "deltas": []}
        seen.append(read)
        message = read["message"]
        history.append(message)
        history.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "5"}
                       if message.get("tool_calls") else {"role": "user", "content": "and?"})
    await client.close()
    return seen


def assembled(chunks) -> dict:
    """What an agent assembles from a stream's chunks."""
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    message = {"role": "assistant", "content": "".join(d.content or "" for d in deltas)}
    calls = [t for d in deltas for t in d.tool_calls or []]
    if calls:
        message["tool_calls"] = [{"id": t.id, "type": "function", "function": {
            "name": t.function.name, "arguments": t.function.arguments}} for t in calls]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return {"message": message, "finish": finish[-1], "usage": chunks[-1].usage.model_dump(exclude_none=True),
            "deltas": [d.content for d in deltas if d.content]}


def recorded(rollout: Rollout) -> list[tuple]:
    """Each model node's tokens, mask, logprobs, temperature and message (tool call ids aside: the token
    client's are made up per parse)."""
    return [(n.token_ids, n.mask, n.logprobs, n.temperature, n.message.text,
             [(c.name, c.arguments) for c in n.message.tool_calls])
            for n in rollout.trace.graph.nodes if n.sampled]


@pytest.mark.parametrize("kind", ["chat", "tokens"])
async def test_a_streamed_call_records_what_the_same_call_unstreamed_records(kind, request):
    renderer = request.getfixturevalue("renderer") if kind == "tokens" else None
    traces, reads = [], []
    for stream in (True, False):
        with FakeOpenAIServer(SCRIPT, renderer=renderer) as server:
            server.chunk_delay = 0.002  # mostly one chunk a read, so the proxy sees the replies grow
            client = a_client(server, kind, renderer)
            rollout = a_rollout(client)
            async with InterceptionProxy.shared().lease(rollout) as lease:
                reads.append(await converse(lease, stream))
            await client.aclose()
        traces.append(rollout)
    streamed, unstreamed = traces
    assert recorded(streamed) == recorded(unstreamed) and len(recorded(streamed)) == 3
    assert streamed.trace.usage == unstreamed.trace.usage
    assert [r["finish"] for r in reads[0]] == [r["finish"] for r in reads[1]] == ["stop", "tool_calls", "stop"]
    assert [r["usage"] for r in reads[0]] == [r["usage"] for r in reads[1]]
    for read, node in zip(reads[0], (n for n in streamed.trace.graph.nodes if n.sampled), strict=True):
        assert read["message"]["content"] == node.message.text  # the program assembled the recorded reply
    assert len(streamed.trace.graph.branches()) == 1  # so each resent history extended the branch
    assert all("<tool" not in d for r in reads[0] for d in r["deltas"])  # markup never shown as content


async def test_a_streamed_reply_reaches_the_program_while_the_model_is_still_sampling():
    with FakeOpenAIServer(["one two three four five"]) as server:
        server.hold_after = 4  # the role and three characters, then the model "samples" until released
        client = a_client(server)
        rollout = a_rollout(client)
        async with InterceptionProxy.shared().lease(rollout) as lease:
            program = sdk(lease)
            stream = await program.chat.completions.create(model="m", messages=QUESTION, stream=True)
            text = ""
            async for chunk in stream:
                text += chunk.choices[0].delta.content or ""
                if text:
                    break
            held = not server.release.is_set() and not rollout.trace.graph.nodes[-1].sampled
            server.release.set()
            async for chunk in stream:
                text += chunk.choices[0].delta.content or ""
            await program.close()
        await client.aclose()
    assert held and text == "one two three four five" == rollout.trace.last_reply


@pytest.mark.parametrize(("text", "stops", "shown"), [
    ("Sure, <tool_c", (), "Sure,"),
    ("a < b and <b>c</b>", (), "a < b and <b>c</b>"),
    ("x <|im_", (), "x"),
    ("done. ST", ("STOP",), "done."),
    ("done. STOP and more", ("STOP",), "done."),
    ("caf\ufffd", (), "caf"),
    ("line one\n\n", (), "line one"),
])
def test_markup_a_stop_strings_start_and_a_split_character_are_held_back(text, stops, shown):
    assert showable(text, stops) == shown


async def test_a_stream_cut_after_its_first_chunk_is_not_retried_and_ends_in_an_error_event():
    with FakeOpenAIServer(["a reply cut short by a dying server"]) as server:
        server.cut_after = 5
        client = a_client(server, max_retries=3)
        rollout = a_rollout(client)
        async with InterceptionProxy.shared().lease(rollout) as lease:
            program = sdk(lease)
            text = ""
            with pytest.raises(openai.APIError, match="not retried"):
                async for chunk in await program.chat.completions.create(model="m", messages=QUESTION, stream=True):
                    text += chunk.choices[0].delta.content or ""
            await program.close()
        await client.aclose()
    assert text and len(server.requests) == 1
    [error] = rollout.trace.errors
    assert (error.kind, error.stage) == (ErrorKind.INFRASTRUCTURE, "model") and lease.ended.done()
    assert not any(n.sampled for n in rollout.trace.graph.nodes)


async def test_a_failure_before_anything_was_shown_is_retried_unseen():
    with FakeOpenAIServer(["second time lucky"], fail_first=1) as server:
        client = a_client(server, max_retries=2)
        rollout = a_rollout(client)
        async with InterceptionProxy.shared().lease(rollout) as lease:
            program = sdk(lease)
            chunks = [c async for c in await program.chat.completions.create(model="m", messages=QUESTION,
                                                                             stream=True)]
            await program.close()
        await client.aclose()
    assert len(server.requests) == 2 and not rollout.trace.errors
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "second time lucky"


async def test_a_timeout_mid_stream_ends_the_stream_with_an_error_event_and_the_rollout_as_a_timeout():
    with FakeOpenAIServer(["a reply the model never finishes"]) as server:
        server.hold_after = 4
        client = a_client(server)
        rollout = a_rollout(client, model=0.5)
        async with InterceptionProxy.shared().lease(rollout) as lease:
            program = sdk(lease)
            text = ""
            with pytest.raises(openai.APIError, match="timed out"):
                async for chunk in await program.chat.completions.create(model="m", messages=QUESTION, stream=True):
                    text += chunk.choices[0].delta.content or ""
            await program.close()
        server.release.set()
        await client.aclose()
    assert text == "a r" and lease.ended.result() == StopReason.TIMEOUT
    [error] = rollout.trace.errors
    assert (error.kind, error.stage) == (ErrorKind.TIMEOUT, "model")


async def first_content_then_hang_up(url: str) -> str:
    """Read a streamed call's events until the first content, then close the connection."""
    body = json.dumps({"model": "m", "messages": QUESTION, "stream": True})
    async with aiohttp.ClientSession() as http, http.post(url, data=body) as answer:
        async for line in answer.content:
            if line.startswith(b"data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    return delta["content"]
    raise AssertionError("no content came")


async def test_a_program_hanging_up_mid_stream_cancels_the_call_and_the_rollout_goes_on():
    with FakeOpenAIServer(["a long reply the program stops reading"]) as server:
        server.hold_after = 4
        client = a_client(server)
        rollout = a_rollout(client)
        async with InterceptionProxy.shared().lease(rollout) as lease:
            url = lease.base_url + "/chat/completions"
            assert "a long reply".startswith(await first_content_then_hang_up(url))
            server.release.set()  # the next chunk finds the program gone
            deadline = time.monotonic() + 10
            while not rollout.trace.metrics.get(CALLS_ABANDONED) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert not any(n.sampled for n in rollout.trace.graph.nodes)  # the reply was not recorded
            program = sdk(lease)
            again = await program.chat.completions.create(model="m", messages=QUESTION)
            await program.close()
            assert not lease.ended.done()
        await client.aclose()
    assert rollout.trace.metrics[CALLS_ABANDONED] == 1 and not rollout.trace.errors
    assert again.choices[0].message.content == rollout.trace.last_reply and rollout.trace.num_turns == 1


async def test_a_streamed_call_past_max_turns_is_refused_with_an_http_status():
    with FakeOpenAIServer(["once"]) as server:
        client = a_client(server)
        rollout = a_rollout(client, max_turns=1)
        async with InterceptionProxy.shared().lease(rollout) as lease:
            program = sdk(lease)
            [c async for c in await program.chat.completions.create(model="m", messages=QUESTION, stream=True)]
            with pytest.raises(openai.RateLimitError):
                await program.chat.completions.create(model="m", messages=QUESTION, stream=True)
            await program.close()
        await client.aclose()
    assert lease.ended.result() == StopReason.MAX_TURNS and rollout.trace.num_turns == 1


async def test_a_rollout_ending_mid_stream_ends_the_stream_with_an_error_event():
    with FakeOpenAIServer(["a reply the rollout's end cuts"]) as server:
        server.hold_after = 4
        client = a_client(server)
        proxy = InterceptionProxy.shared()
        async with proxy.lease(a_rollout(client)):  # another rollout keeps the server up
            rollout = a_rollout(client)
            async with proxy.lease(rollout) as lease:
                program = sdk(lease)
                stream = await program.chat.completions.create(model="m", messages=QUESTION, stream=True)
                first = await anext(aiter(stream))
            with pytest.raises(openai.APIError, match="has finished"):  # the lease ended: its deadline, say
                async for _ in stream:
                    pass
            await program.close()
        server.release.set()
        await client.aclose()
    assert first.choices[0].delta.content and not rollout.trace.errors
