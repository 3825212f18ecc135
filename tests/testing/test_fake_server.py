"""Fake OpenAI server: real HTTP on loopback in the vLLM response shape."""

import aiohttp

from tracegym.testing import FakeOpenAIServer


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
