"""Chat client against the fake OpenAI server: replies, tokens, tool calls, retries, errors, timeouts."""

import asyncio
import socket
import threading
import time
from collections.abc import Callable

import pytest
from aiohttp import web

import tracegym as tg
from tracegym.core.messages import assistant, user
from tracegym.envs.tools import Tool
from tracegym.models.chat_client import ChatClient, parse_response
from tracegym.models.client import ModelRequest
from tracegym.models.endpoint import Endpoint
from tracegym.testing import FakeOpenAIServer
from tracegym.testing.script import Fail, Stall, reply, tool_call
from tracegym.testing.scripted_model import encode, render, render_body

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
    fake_usage = (len(encode(render(HELLO.messages))), len(encode(render_body(assistant("hi there")))))
    assert (response.prompt_tokens, response.completion_tokens) == fake_usage


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
    spec = Tool.from_function(_add).spec
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


class Delays(list):
    """A stand-in for `asyncio.sleep` that records each backoff instead of waiting it out."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


async def test_retries_back_off_exponentially_with_bounded_jitter():
    delays = Delays()
    with FakeOpenAIServer(["ok"], fail_first=4, fail_status=503) as fake:
        endpoint = Endpoint(base_url=fake.base_url, model=fake.model, max_retries=4, backoff=0.1)
        async with ChatClient(endpoint, sleep=delays) as client:
            assert (await client.complete(HELLO)).message.text == "ok"
    assert len(delays) == 4  # one wait before each retry, none before the first call or after success
    for attempt, delay in enumerate(delays):
        assert 0.05 * 2**attempt <= delay <= 0.15 * 2**attempt  # 0.1 s doubling, jittered by 0.5x-1.5x


async def test_no_backoff_follows_the_last_failed_attempt():
    delays = Delays()
    with FakeOpenAIServer(["ok"], fail_first=10, fail_status=503) as fake:
        endpoint = Endpoint(base_url=fake.base_url, model=fake.model, max_retries=2, backoff=1.0)
        async with ChatClient(endpoint, sleep=delays) as client:
            with pytest.raises(tg.InfrastructureError):
                await client.complete(HELLO)
    assert len(delays) == 2 and len(fake.requests) == 3


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


# --- tool calls the server's parser gave up on -------------------------------------------------------------
BAD_CALL = "<tool_call>{bad</tool_call>"


async def test_tool_call_blocks_left_in_the_content_become_tool_calls_when_tools_were_offered():
    spec = Tool.from_function(_add).spec
    with FakeOpenAIServer([BAD_CALL]) as fake:
        async with client_for(fake) as client:
            response = await client.complete(ModelRequest(messages=[user("x")], tools=[spec]))
    [call] = response.message.tool_calls
    assert call.arguments == "{bad" and response.message.content is None


async def test_tool_call_text_stays_text_when_no_tools_were_offered():
    with FakeOpenAIServer([BAD_CALL]) as fake:
        async with client_for(fake) as client:
            response = await client.complete(HELLO)
    assert response.message.text == BAD_CALL and not response.message.tool_calls


async def test_a_malformed_tool_call_in_the_content_is_a_tool_error_the_model_sees():
    with FakeOpenAIServer([BAD_CALL, "The answer is 3"]) as fake:
        async with client_for(fake) as client:
            [trace] = await tg.evaluate("tool-calculator", client, num_tasks=1, rollouts=1)
    tool_messages = [m for m in trace.graph.messages() if m.role == "tool"]
    assert len(tool_messages) == 1 and tool_messages[0].text.startswith("Error:")
    assert trace.metrics["tool_errors"] == 1 and trace.errors[0].kind == tg.ErrorKind.TOOL
    assert any(m.get("role") == "tool" and "Error" in m["content"] for m in fake.requests[1]["messages"])


def test_a_tool_call_without_a_function_name_is_one_bad_call_not_a_malformed_reply():
    calls = [{"id": "a", "function": {"name": "add", "arguments": "{}"}}, {"id": "b", "function": {"arguments": "{}"}}]
    data = {"choices": [{"message": {"content": None, "tool_calls": calls}, "finish_reason": "tool_calls"}]}
    response = parse_response(data, tools_offered=True)
    assert [c.name for c in response.message.tool_calls] == ["add", ""]


# --- finish reasons and replies that are not JSON --------------------------------------------------------
async def test_a_length_finish_reason_ends_the_rollout_as_truncated():
    tiny = TinyServer(lambda: web.json_response(_completion("partial", finish_reason="length")))
    async with tiny as base_url, ChatClient(Endpoint(base_url=base_url, model="m", backoff=0)) as client:
        [trace] = await tg.evaluate("reverse-text", client, num_tasks=1, rollouts=1)
    assert trace.stop_reason == tg.StopReason.TRUNCATED and trace.is_truncated


async def test_a_200_reply_that_is_not_json_is_retried():
    answers = iter([web.Response(text="<html>proxy hiccup</html>"), web.json_response(_completion("ok"))])
    tiny = TinyServer(lambda: next(answers))
    async with tiny as base_url, ChatClient(Endpoint(base_url=base_url, model="m", backoff=0)) as client:
        response = await client.complete(HELLO)
    assert response.message.text == "ok" and tiny.calls == 2


class TinyServer:
    """A chat-completions route on 127.0.0.1 in the test's own loop, answering `answer()`; it records the client
    port of every call (one port per TCP connection)."""

    def __init__(self, answer: Callable[[], web.Response], latency: float = 0.0) -> None:
        self.answer = answer
        self.latency = latency
        self.ports: list[int] = []
        self._runner: web.AppRunner | None = None

    @property
    def calls(self) -> int:
        return len(self.ports)

    async def _chat(self, request: web.Request) -> web.Response:
        await request.read()
        self.ports.append(request.transport.get_extra_info("peername")[1])
        if self.latency:
            await asyncio.sleep(self.latency)
        return self.answer()

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def _completion(text: str, finish_reason: str = "stop") -> dict:
    message = {"role": "assistant", "content": text}
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2}}


# --- the connection pool ---------------------------------------------------------------------------------
async def test_sequential_calls_share_one_connection():
    tiny = TinyServer(lambda: web.json_response(_completion("ok")))
    async with tiny as base_url, ChatClient(Endpoint(base_url=base_url, model="m")) as client:
        for _ in range(20):
            await client.complete(HELLO)
    assert tiny.calls == 20 and len(set(tiny.ports)) == 1


async def test_concurrent_calls_open_no_more_connections_than_the_concurrency():
    tiny = TinyServer(lambda: web.json_response(_completion("ok")), latency=0.02)
    async with tiny as base_url, ChatClient(Endpoint(base_url=base_url, model="m")) as client:
        for _ in range(5):
            await asyncio.gather(*(client.complete(HELLO) for _ in range(4)))
    assert tiny.calls == 20 and len(set(tiny.ports)) <= 4


async def test_max_connections_caps_the_pool():
    tiny = TinyServer(lambda: web.json_response(_completion("ok")), latency=0.02)
    endpoint = Endpoint(base_url="http://unused/v1", model="m", max_connections=2)
    async with tiny as base_url, ChatClient(endpoint.model_copy(update={"base_url": base_url})) as client:
        await asyncio.gather(*(client.complete(HELLO) for _ in range(10)))
    assert tiny.calls == 10 and len(set(tiny.ports)) <= 2


# --- the model stage's deadline and cancellation ---------------------------------------------------------
def hung_endpoint() -> tuple[FakeOpenAIServer, threading.Event]:
    """A fake endpoint that never answers, and an event set when a request has reached it."""
    arrived = threading.Event()

    def hang(request):
        arrived.set()
        return Stall(None)

    return FakeOpenAIServer(rule=hang), arrived


async def test_a_model_timeout_through_the_http_client_ends_the_rollout_as_a_timeout_at_its_deadline():
    fake, _ = hung_endpoint()
    with fake:
        endpoint = Endpoint(base_url=fake.base_url, model=fake.model, timeout=0.5, max_retries=30)
        async with ChatClient(endpoint) as client:
            start = time.monotonic()
            [trace] = await tg.evaluate("reverse-text", client, num_tasks=1, timeouts=tg.Timeouts(model=0.5))
            elapsed = time.monotonic() - start
    assert elapsed < 10  # the stage's 0.5 s (a loaded machine's lag aside), not 31 attempts of 0.5 s
    assert trace.stop_reason == tg.StopReason.TIMEOUT
    [error] = trace.errors
    assert (error.kind, error.stage) == (tg.ErrorKind.TIMEOUT, "model")
    assert "ran past 0.5 s" in error.message and "attempts" not in error.message


async def test_the_model_timeout_bounds_the_retries_and_their_backoff():
    with FakeOpenAIServer(["ok"], fail_first=100, fail_status=503) as fake:
        endpoint = Endpoint(base_url=fake.base_url, model=fake.model, max_retries=60, backoff=0.2)
        async with ChatClient(endpoint) as client:
            start = time.monotonic()
            [trace] = await tg.evaluate("reverse-text", client, num_tasks=1, timeouts=tg.Timeouts(model=0.5))
            elapsed = time.monotonic() - start
    assert elapsed < 10 and trace.stop_reason == tg.StopReason.TIMEOUT  # not 60 backoffs of 0.2 s or more
    assert [(e.kind, e.stage) for e in trace.errors] == [(tg.ErrorKind.TIMEOUT, "model")]


async def test_a_caller_deadline_equal_to_the_http_timeout_is_not_retried_past():
    fake, _ = hung_endpoint()
    with fake:
        async with client_for(fake, timeout=0.5, backoff=0.5) as client:
            start = time.monotonic()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.complete(HELLO), 0.5)
            elapsed = time.monotonic() - start
    assert elapsed < 10 and len(fake.requests) == 1


async def test_cancelling_a_call_in_flight_ends_it_at_once():
    fake, arrived = hung_endpoint()
    with fake:
        async with client_for(fake) as client:
            call = asyncio.create_task(client.complete(HELLO))
            assert await asyncio.to_thread(arrived.wait, 10)
            call.cancel()
            await asyncio.wait({call}, timeout=2)
    assert call.cancelled() and len(fake.requests) == 1


class StuckBackoff:
    """A backoff that says when it starts and then waits until it is cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.started.set()
        await asyncio.Event().wait()


async def test_cancelling_a_call_in_its_backoff_ends_it_without_another_attempt():
    backoff = StuckBackoff()
    with FakeOpenAIServer(["ok"], fail_first=100, fail_status=503) as fake:
        async with ChatClient(Endpoint(base_url=fake.base_url, model=fake.model), sleep=backoff) as client:
            call = asyncio.create_task(client.complete(HELLO))
            await backoff.started.wait()
            call.cancel()
            await asyncio.wait({call}, timeout=2)
    assert call.cancelled() and len(fake.requests) == 1


def test_by_default_one_http_attempt_never_outlives_the_model_stage():
    from tracegym.models.model_choice import ModelChoice

    stage = tg.Timeouts().model
    assert Endpoint(base_url="http://x/v1", model="m").timeout <= stage and ModelChoice().timeout <= stage
