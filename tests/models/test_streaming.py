"""Streamed model calls: the folded chunks parse to the response the unstreamed call gets, the reply is shown as it
grows, a failure before anything was shown is retried and one after is not (on one server or across a router's),
and an `error` event is the failure its code names."""

import json

import pytest
from aiohttp import web

import tracegym as tg
from tracegym.core.errors import ContextLengthError
from tracegym.core.messages import user
from tracegym.core.sampling import Sampling
from tracegym.core.tool_spec import ToolSpec
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import ChatMLRenderer
from tracegym.models.router import Router
from tracegym.models.token_client import TokenClient
from tracegym.models.transport import StreamCut, Unavailable
from tracegym.testing import FakeOpenAIServer, reply, tool_call
from tracegym.testing.char_tokenizer import CharTokenizer

SCRIPT = [reply("first, then a call", tool_call("add", {"a": 1}, id="c1"))]
TOOLS = [ToolSpec(name="add", description="Add.", parameters={"type": "object", "properties": {}})]


class Shown:
    """A ReplyStream that keeps every partial reply (and sets `release` at the first); `shows` False keeps it from
    counting as shown."""

    def __init__(self, shows: bool = True, release=None) -> None:
        self.partials: list[ModelResponse] = []
        self.shows, self.release = shows, release

    @property
    def shown(self) -> bool:
        return self.shows and bool(self.partials)

    async def update(self, partial: ModelResponse) -> None:
        self.partials.append(partial)
        if self.release is not None:
            self.release.set()


def endpoint(url: str, **settings) -> Endpoint:
    return Endpoint(base_url=url, model="fake-model", api_key_env=None, backoff=0.0, **settings)


def request(stream=None, **sampling) -> ModelRequest:
    return ModelRequest(messages=[user("go")], tools=TOOLS, sampling=Sampling(max_tokens=200, **sampling),
                        stream=stream)


@pytest.mark.parametrize("kind", ["chat", "tokens"])
async def test_a_streamed_reply_parses_to_the_response_the_unstreamed_call_gets(kind):
    renderer = ChatMLRenderer(CharTokenizer())
    with FakeOpenAIServer(SCRIPT, renderer=renderer) as server:
        server.hold_after = 1 if kind == "tokens" else 2  # the first character, until it was shown
        client = TokenClient(endpoint(server.base_url), renderer) if kind == "tokens" else ChatClient(
            endpoint(server.base_url))
        shown = Shown(release=server.release)
        streamed = await client.complete(request(shown))
        unstreamed = await client.complete(request())
        await client.aclose()
    calls = [(c.name, c.arguments) for r in (streamed, unstreamed) for c in r.message.tool_calls]
    assert calls[0] == calls[1] == ("add", '{"a": 1}')
    if kind == "tokens":  # its call ids are made up per parse
        streamed = ModelResponse(**{**vars(streamed), "message": unstreamed.message})
    assert streamed == unstreamed and streamed.completion_token_ids
    texts = [p.message.text for p in shown.partials]
    assert len(texts) >= 2 and texts[0] == "f" and texts[-1] == "first, then a call"


async def test_a_stop_string_cuts_the_streamed_message_as_it_cuts_the_unstreamed_one():
    renderer = ChatMLRenderer(CharTokenizer())
    with FakeOpenAIServer(["one END two"], renderer=renderer) as server:
        client = TokenClient(endpoint(server.base_url), renderer)
        streamed = await client.complete(request(Shown(), stop=["END"]))
        unstreamed = await client.complete(request(stop=["END"]))
        await client.aclose()
    assert streamed == unstreamed and streamed.message.text == "one "
    assert renderer.decode(streamed.completion_token_ids or []) == "one END"


async def test_a_cut_before_anything_was_shown_is_retried():
    with FakeOpenAIServer(["hello"]) as server:
        server.cut_after = 3
        client = ChatClient(endpoint(server.base_url, max_retries=2))
        with pytest.raises(Unavailable, match="after 3 attempts"):
            await client.complete(request(Shown(shows=False)))
        await client.aclose()
    assert len(server.requests) == 3


async def test_a_cut_after_part_of_the_reply_was_shown_is_not_retried():
    with FakeOpenAIServer(["hello"]) as server:
        server.cut_after = 3
        client = ChatClient(endpoint(server.base_url, max_retries=2))
        with pytest.raises(StreamCut, match="not retried"):
            await client.complete(request(Shown()))
        await client.aclose()
    assert len(server.requests) == 1


async def test_a_router_does_not_retry_a_stream_cut_on_another_server():
    servers = [FakeOpenAIServer(["hello"]).start(), FakeOpenAIServer(["hello"]).start()]
    servers[0].cut_after = servers[1].cut_after = 3
    try:
        router = tg.make_client(endpoint(servers[0].base_url, replicas=(servers[1].base_url,)))
        assert isinstance(router, Router)
        with pytest.raises(StreamCut):
            await router.complete(request(Shown()))
        await router.aclose()
    finally:
        for server in servers:
            server.stop()
    assert sorted(len(s.requests) for s in servers) == [0, 1]


@pytest.fixture
async def error_event_server():
    """A server whose streamed reply is an `error` event (vLLM's shape) naming a context overflow."""

    async def chat(http: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(http)
        event = {"error": {"message": "This model's maximum context length is 8 tokens", "type": "BadRequestError",
                           "code": 400}}
        await response.write(f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    await runner.cleanup()


async def test_an_error_event_in_the_stream_is_the_failure_its_code_names(error_event_server):
    client = ChatClient(endpoint(error_event_server))
    with pytest.raises(ContextLengthError, match="maximum context length"):
        await client.complete(request(Shown()))
    await client.aclose()
