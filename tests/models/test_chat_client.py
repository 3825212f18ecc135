"""Chat client against the fake OpenAI server: replies, tokens, tool calls, retries, errors, timeouts."""

import socket

import pytest

import tracegym as tg
from tracegym.core.messages import user
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelRequest
from tracegym.models.endpoint import Endpoint
from tracegym.testing import FakeOpenAIServer
from tracegym.testing.script import Fail, Stall, reply, tool_call

HELLO = ModelRequest(messages=[user("hello")])


@pytest.fixture
def server():
    with FakeOpenAIServer(["hi there"]) as fake:
        yield fake


def client_for(server: FakeOpenAIServer, **options) -> ChatClient:
    options = {"backoff": 0.0, **options}
    return ChatClient(Endpoint(base_url=server.base_url, model=server.model, **options))


async def test_reply_text_usage_and_finish_reason(server):
    async with client_for(server) as client:
        response = await client.complete(HELLO)
    assert response.message.text == "hi there"
    assert response.finish_reason == "stop"
    assert response.prompt_tokens > 0 and response.completion_tokens > 0


async def test_token_ids_and_logprobs_come_back_from_a_vllm_shaped_server(server):
    async with client_for(server) as client:
        response = await client.complete(HELLO)
    assert response.prompt_token_ids and response.completion_token_ids
    assert len(response.completion_logprobs) == len(response.completion_token_ids)
    assert server.requests[0]["return_token_ids"] is True


async def test_token_fields_are_dropped_when_the_endpoint_rejects_them():
    with FakeOpenAIServer(["hi"], token_fields=False) as fake:
        async with client_for(fake) as client:
            first = await client.complete(HELLO)
            await client.complete(HELLO)
    assert first.message.text == "hi" and first.completion_token_ids is None
    assert "return_token_ids" not in fake.requests[-1]
    assert len(fake.requests) == 3  # one rejected call, then two without the fields


async def test_tokens_on_makes_their_absence_an_error():
    with FakeOpenAIServer(["hi"], token_fields=False) as fake:
        async with client_for(fake, tokens="on") as client:
            with pytest.raises(tg.ModelError):
                await client.complete(HELLO)


async def test_tool_calls_keep_their_raw_arguments():
    calls = [tool_call("add", {"a": 1, "b": 2}, id="c1"), tool_call("add", "{not json", id="c2")]
    with FakeOpenAIServer([reply(None, *calls)]) as fake:
        async with client_for(fake) as client:
            response = await client.complete(HELLO)
    assert [c.arguments for c in response.message.tool_calls] == ['{"a": 1, "b": 2}', "{not json"]
    assert response.finish_reason == "tool_calls"


async def test_sampling_and_tools_are_sent():
    spec = tg.Tool.from_function(_add).spec
    request = ModelRequest(messages=[user("x")], tools=[spec],
                           sampling=tg.Sampling(temperature=0.3, max_tokens=7, seed=1, extra={"top_k": 5}))
    with FakeOpenAIServer(["ok"]) as fake:
        async with client_for(fake) as client:
            await client.complete(request)
    body = fake.requests[0]
    assert (body["temperature"], body["max_tokens"], body["seed"], body["top_k"]) == (0.3, 7, 1, 5)
    assert body["tools"][0]["function"]["name"] == "_add"


def _add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: first.
        b: second.
    """
    return a + b


async def test_5xx_is_retried_until_it_succeeds():
    with FakeOpenAIServer(["ok"], fail_first=2, fail_status=503) as fake:
        async with client_for(fake, max_retries=3) as client:
            response = await client.complete(HELLO)
    assert response.message.text == "ok" and len(fake.requests) == 3


async def test_429_is_retried():
    with FakeOpenAIServer(["ok"], fail_first=1, fail_status=429) as fake:
        async with client_for(fake, max_retries=1) as client:
            assert (await client.complete(HELLO)).message.text == "ok"


async def test_retries_are_bounded_and_end_in_an_infrastructure_error():
    with FakeOpenAIServer(["ok"], fail_first=10, fail_status=502) as fake:
        async with client_for(fake, max_retries=2) as client:
            with pytest.raises(tg.InfrastructureError, match="after 3 attempts"):
                await client.complete(HELLO)
    assert len(fake.requests) == 3


async def test_4xx_is_not_retried():
    with FakeOpenAIServer([Fail(status=422, message="bad field")]) as fake:
        async with client_for(fake, max_retries=3) as client:
            with pytest.raises(tg.ModelError, match="bad field"):
                await client.complete(HELLO)
    assert len(fake.requests) == 1


async def test_context_length_400_is_a_context_length_error():
    with FakeOpenAIServer(["ok"], context_length=3) as fake:
        async with client_for(fake) as client:
            with pytest.raises(tg.ContextLengthError):
                await client.complete(HELLO)


async def test_a_call_slower_than_the_timeout_fails_after_its_retries():
    with FakeOpenAIServer([Stall(5.0, "late")]) as fake:
        async with client_for(fake, timeout=0.2, max_retries=1) as client:
            with pytest.raises(tg.InfrastructureError, match="TimeoutError"):
                await client.complete(HELLO)
    assert len(fake.requests) == 2


async def test_connection_refused_is_an_infrastructure_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ChatClient(Endpoint(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, backoff=0))
    async with client:
        with pytest.raises(tg.InfrastructureError, match="after 2 attempts"):
            await client.complete(HELLO)


async def test_api_key_is_read_from_the_named_variable(server, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sekret")
    async with client_for(server, api_key_env="MY_KEY") as client:
        await client.complete(HELLO)
    assert server.headers[0]["Authorization"] == "Bearer sekret"


async def test_rollouts_through_the_client_carry_tokens_on_their_traces():
    with FakeOpenAIServer(rule=lambda r: r.messages[-1].text[::-1]) as fake:
        async with client_for(fake) as client:
            traces = await tg.evaluate("reverse-text", client, num_tasks=3, rollouts=2)
    assert [t.reward for t in traces] == [1.0] * 6
    for trace in traces:
        node = trace.graph.nodes[-1]
        assert node.sampled and node.token_ids and len(node.logprobs) == len(node.token_ids)


async def test_a_truncating_context_limit_ends_the_rollout_as_truncated():
    with FakeOpenAIServer(["ok"], context_length=3) as fake:
        async with client_for(fake) as client:
            [trace] = await tg.evaluate("reverse-text", client, num_tasks=1, rollouts=1)
    assert trace.stop_reason == tg.StopReason.TRUNCATED and trace.is_truncated
