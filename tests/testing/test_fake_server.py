"""Fake OpenAI server: real HTTP on loopback in the vLLM response shape."""

import asyncio
import contextlib
import threading
import time

import aiohttp

from tracegym.testing import FakeOpenAIServer, Stall


async def test_returns_scripted_reply_with_token_ids_and_logprobs():
    with FakeOpenAIServer(["hello"]) as server:
        async with aiohttp.ClientSession() as http:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                    "return_token_ids": True, "logprobs": True}
            async with http.post(server.base_url + "/chat/completions", json=body) as resp:
                data = await resp.json()
    choice = data["choices"][0]
    assert choice["message"]["content"] == "hello"
    assert data["prompt_token_ids"] and len(choice["token_ids"]) == len(choice["logprobs"]["content"])


async def test_fails_the_first_calls_when_asked():
    with FakeOpenAIServer(["x"], fail_first=1, fail_status=503) as server:
        async with aiohttp.ClientSession() as http:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(server.base_url + "/chat/completions", json=body) as resp:
                assert resp.status == 503


class CharRenderer:
    """One token per character (its code point); token 0 closes a turn."""

    stop_token_ids = [0]

    def completion_ids(self, message) -> list[int]:
        return [*map(ord, message.text), 0]

    def decode(self, token_ids) -> str:
        return "".join(chr(t) for t in token_ids if t)


async def token_completion(server: FakeOpenAIServer, **fields) -> dict:
    async with aiohttp.ClientSession() as http:
        body = {"model": "fake-model", "prompt": [104, 105], "logprobs": 1, "return_token_ids": True, **fields}
        async with http.post(server.base_url + "/completions", json=body) as resp:
            return (await resp.json())["choices"][0]


async def test_a_stop_string_keeps_the_ids_through_it_and_cuts_the_text_before_it():
    with FakeOpenAIServer(["one END two"], renderer=CharRenderer()) as server:
        choice = await token_completion(server, stop=["END", "two"])
    assert choice["token_ids"] == [*map(ord, "one END")]
    assert choice["text"] == "one " and choice["stop_reason"] == "END" and choice["finish_reason"] == "stop"
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])


async def test_without_a_matching_stop_string_the_turn_ends_on_its_stop_token():
    with FakeOpenAIServer(["one two"], renderer=CharRenderer()) as server:
        choice = await token_completion(server, stop=["END"])
    assert choice["token_ids"] == [*map(ord, "one two"), 0] and choice["stop_reason"] is None


async def test_include_stop_str_in_output_keeps_the_stop_string_in_the_text():
    with FakeOpenAIServer(["one END two"], renderer=CharRenderer()) as server:
        choice = await token_completion(server, stop=["END"], include_stop_str_in_output=True)
    assert choice["text"] == "one END" and choice["token_ids"] == [*map(ord, "one END")]


async def test_stop_returns_promptly_while_a_request_hangs():
    arrived = threading.Event()

    def hang(request):
        arrived.set()
        return Stall(None)

    with FakeOpenAIServer(rule=hang) as server:
        async with aiohttp.ClientSession() as http:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
            request = asyncio.create_task(http.post(server.base_url + "/chat/completions", json=body))
            assert await asyncio.to_thread(arrived.wait, 10)
            start = time.monotonic()
            server.stop()
            assert time.monotonic() - start < 30  # the stall is endless: stop() cut it
            with contextlib.suppress(aiohttp.ClientError):
                await request
