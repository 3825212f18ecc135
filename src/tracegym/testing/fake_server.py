"""Fake OpenAI server: a real HTTP server on 127.0.0.1 answering chat completions from a Script.

It speaks the vLLM response shape: with `return_token_ids` it adds `prompt_token_ids` and each choice's
`token_ids`; with `logprobs` it adds per-token logprobs. Latency, a number of failing first calls and a context
limit (answered with vLLM's 400) are configurable; a scripted `Stall(None)` hangs a request (a hung endpoint),
`hung = True` hangs every request, probes included, until set False (a server that stopped answering), and stopping
the server cuts them; `start()` after `stop()` serves again on the same port. Given a renderer, it also answers
vLLM's `/v1/completions` with a token-id prompt: the script sees the decoded prompt as one user message (after one
empty assistant message per earlier turn, so list scripts advance), and the reply comes back as the renderer's
completion ids (or `completion_ids(message)`'s), cut at a `stop` string as vLLM cuts (ids kept through the stop
string, text cut before it, `stop_reason` set) and at `max_tokens`; and vLLM's `/inference/v1/generate` (token ids
plus images, answered the same way in that endpoint's shape). A request with `stream: true` is answered as
vLLM streams it: server-sent chunks (chat: the content one character a chunk with its UTF-8 bytes as the chunk's
`token_ids`, then the tool calls and the finish reason; completions: one token a chunk; the usage last when
`stream_options.include_usage`), `chunk_delay` seconds apart, held after `hold_after` chunks until `release` is
set, the connection dropped after `cut_after` chunks, when those are set. It runs its own event loop in a thread,
so sync and async tests can both use it.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from tracegym.core.messages import ImagePart, Message, assistant, user
from tracegym.core.tool_spec import ToolSpec
from tracegym.models import policy_version
from tracegym.models.client import ModelRequest
from tracegym.models.renderer import Renderer
from tracegym.testing.script import Entry, Fail, Script
from tracegym.testing.scripted_model import encode, render, render_body


class FakeOpenAIServer:
    """`with FakeOpenAIServer(["hi"]) as server: ... server.base_url ...`"""

    def __init__(self, script: Sequence[Entry] | None = None, rule: Callable[[ModelRequest], Entry] | None = None,
                 *, model: str = "fake-model", latency: float = 0.0, fail_first: int = 0, fail_status: int = 503,
                 context_length: int | None = None, token_fields: bool = True, port: int = 0,
                 renderer: Renderer | None = None,
                 completion_ids: Callable[[Message], list[int]] | None = None, host: str = "127.0.0.1") -> None:
        self.script = Script(script, rule)
        self.model = model
        self.latency = latency
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.context_length = context_length
        self.token_fields = token_fields
        """False: behave like a non-vLLM endpoint and reject `return_token_ids` with HTTP 400."""
        self.port = port
        self.host = host
        """The interface it listens on (loopback unless a test gives its own, e.g. one reachable from a netns)."""
        self.renderer = renderer
        """Answers token-prompt `/v1/completions` when set."""
        self.completion_ids = completion_ids
        """The sampled ids for a scripted reply; default: the renderer's canonical ones."""
        self.policy_version: int | None = None
        """When set, every reply carries it in vLLM's policy-version header (read when the request arrives, as
        `models.policy_version`'s middleware does); set it mid-test to move the policy on."""
        self.chunk_delay = 0.0
        """Seconds between the chunks of a streamed reply."""
        self.cut_after: int | None = None
        """When set, a streamed reply's connection is dropped after this many chunks (a server that died)."""
        self.hold_after: int | None = None
        """When set, a streamed reply waits after this many chunks until `release` is set (a model mid-sample)."""
        self.release = threading.Event()
        self.hung = False
        """While True, every request (a model call, `/models`, `/health`) waits, unanswered."""
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> FakeOpenAIServer:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True, name="fake-openai")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake OpenAI server did not start")
        return self

    def stop(self) -> None:
        if self._loop is None or self._runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)
        self._loop = None

    async def _shutdown(self) -> None:
        """Stop serving, then end the handlers still stalled (left pending, they would warn when collected)."""
        assert self._runner is not None
        await self._runner.cleanup()
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _serve(self, ready: threading.Event) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._unless_hung])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._token_completion)
        app.router.add_post("/inference/v1/generate", self._generate)
        app.router.add_get("/health", self._health)
        # A request still stalled at stop is cut after a moment rather than awaited (aiohttp's default: 60 s).
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, self.host, self.port)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        ready.set()
        self._loop.run_forever()

    # --- handlers ----------------------------------------------------------------------------------------
    @web.middleware
    async def _unless_hung(self, request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        while self.hung:
            await asyncio.sleep(0.02)
        response = await handler(request)
        while self.hung:  # a reply made before the hang is held too: in flight, it goes unanswered
            await asyncio.sleep(0.02)
        return response

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _admit(self, http: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        """Record a request and apply the configured latency and first failures; (body, error reply or None)."""
        body = await http.json()
        self.requests.append(body)
        self.headers.append(dict(http.headers))
        if self.latency:
            await asyncio.sleep(self.latency)
        if len(self.requests) <= self.fail_first:
            return body, _error(self.fail_status, "scripted failure")
        return body, None

    async def _chat(self, http: web.Request) -> web.StreamResponse:
        version = self.policy_version
        body, failed = await self._admit(http)
        if failed is not None:
            return failed
        if not self.token_fields and "return_token_ids" in body:
            return _error(400, "Unrecognized request argument supplied: return_token_ids")
        if body.get("model") != self.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        request = _to_request(body)
        prompt_ids = encode(render(request.messages))
        if self.context_length is not None and len(prompt_ids) > self.context_length:
            return _error(400, f"This model's maximum context length is {self.context_length} tokens. "
                               f"However, your request has {len(prompt_ids)} input tokens.")
        message = await self.script.resolve(request)
        if isinstance(message, Fail):
            return _error(message.status, message.message)
        reply = self._completion(body, message, prompt_ids)
        if body.get("stream"):
            return await self._stream(http, _chat_chunks(body, reply, message), _version_header(version))
        return web.json_response(reply, headers=_version_header(version))

    def _completion(self, body: dict[str, Any], message: Message, prompt_ids: list[int]) -> dict[str, Any]:
        completion_ids = encode(render_body(message))
        choice: dict[str, Any] = {
            "index": 0,
            "message": {k: v for k, v in message.to_openai().items() if v is not None},
            "finish_reason": "tool_calls" if message.tool_calls else "stop",
        }
        out: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                      "total_tokens": len(prompt_ids) + len(completion_ids)},
        }
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = completion_ids
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": -0.5, "top_logprobs": []}
                                              for t in completion_ids]}
        return out

    async def _token_completion(self, http: web.Request) -> web.StreamResponse:
        version = self.policy_version
        body, failed = await self._admit(http)
        if failed is not None:
            return failed
        prompt = body.get("prompt")
        if self.renderer is None or not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return _error(400, "this fake answers completions only for a token-id prompt, given a renderer")
        if self.context_length is not None and len(prompt) > self.context_length:
            return _error(400, f"This model's maximum context length is {self.context_length} tokens. "
                               f"However, your prompt contains {len(prompt)} input tokens.")
        message = await self.script.resolve(self._token_request(prompt))
        if isinstance(message, Fail):
            return _error(message.status, message.message)
        reply = self._token_choice(body, message, prompt)
        if body.get("stream"):
            return await self._stream(http, self._completion_chunks(body, reply, prompt), _version_header(version))
        return web.json_response(reply, headers=_version_header(version))

    async def _generate(self, http: web.Request) -> web.Response:
        """vLLM's token-in/token-out endpoint (`--enable-scale-out`), given a renderer: answered as a token-prompt
        completion, in its shape (the prompt's ids back when asked; each sampled id's logprob in
        `logprobs.content`). As vLLM does, it expands each image token into the image's run (with the renderer's
        `images`, a VLM's processor) and answers with the ids it made."""
        version = self.policy_version
        body, failed = await self._admit(http)
        if failed is not None:
            return failed
        prompt = body.get("token_ids")
        images = getattr(self.renderer, "images", None)
        if images is None or not isinstance(prompt, list):
            return _error(400, "this fake answers generate only for token ids, given a VLM's renderer")
        parts = [ImagePart(image_url={"url": p["url"]}) for p in body.get("content_parts") or []]
        prompt = images.expand(prompt, parts)
        message = await self.script.resolve(self._token_request(prompt))
        if isinstance(message, Fail):
            return _error(message.status, message.message)
        choice = self._token_choice(body.get("sampling_params") or {}, message, prompt)["choices"][0]
        content = [{"token_id": t, "logprob": lp, "top_logprobs": []}
                   for t, lp in zip(choice["token_ids"], choice["logprobs"]["token_logprobs"], strict=True)]
        reply = {"request_id": f"generate-{len(self.requests)}",
                 "choices": [{**choice, "logprobs": {"content": content}}],
                 "prompt_token_ids": prompt if body.get("return_token_ids") else None}
        return web.json_response(reply, headers=_version_header(version))

    async def _stream(self, http: web.Request, chunks: list[dict[str, Any]],
                      headers: dict[str, str]) -> web.StreamResponse:
        """`chunks` as server-sent events, `chunk_delay` apart (the connection dropped after `cut_after`)."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await response.prepare(http)
        for index, chunk in enumerate(chunks):
            if self.cut_after is not None and index >= self.cut_after:
                if http.transport is not None:
                    http.transport.close()
                return response
            if index and self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            while index == self.hold_after and not self.release.is_set():
                await asyncio.sleep(0.01)
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _completion_chunks(self, body: dict[str, Any], reply: dict[str, Any],
                           prompt: list[int]) -> list[dict[str, Any]]:
        """A completions reply as vLLM streams it: one sampled id a chunk (the prompt's ids in the first, when
        asked), the finish and stop reasons in the last."""
        assert self.renderer is not None
        choice, head = reply["choices"][0], {k: reply[k] for k in ("id", "object", "created", "model")}
        ids, text, chunks = choice["token_ids"], choice["text"], []
        shown = 0
        for k, token in enumerate(ids):
            last = k == len(ids) - 1
            upto = len(text) if last else min(len(self.renderer.decode(ids[: k + 1])), len(text))
            piece: dict[str, Any] = {"index": 0, "text": text[shown:upto], "token_ids": [token],
                                     "logprobs": {"tokens": [f"token_id:{token}"], "token_logprobs": [-0.5],
                                                  "top_logprobs": [], "text_offset": []},
                                     "finish_reason": choice["finish_reason"] if last else None,
                                     "stop_reason": choice["stop_reason"] if last else None}
            if k == 0 and body.get("return_token_ids"):
                piece["prompt_token_ids"] = prompt
            shown = max(shown, upto)
            chunks.append({**head, "choices": [piece]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": reply["usage"]})
        return chunks

    def _token_request(self, prompt: list[int]) -> ModelRequest:
        """The request a script sees: one empty assistant message per earlier turn (counted by the renderer's
        `generation_prompt_ids`, when it has them), then the decoded prompt as a user message."""
        assert self.renderer is not None
        opener = getattr(self.renderer, "generation_prompt_ids", None) or []
        turns = _count(prompt, opener) - 1 if opener else 0
        return ModelRequest(messages=[assistant("")] * max(turns, 0) + [user(self.renderer.decode(prompt))])

    def _token_choice(self, body: dict[str, Any], message: Message, prompt: list[int]) -> dict[str, Any]:
        assert self.renderer is not None
        ids = (self.completion_ids or self.renderer.completion_ids)(message)
        text, stop_reason = self.renderer.decode(ids), None
        matched = _stop_string(self.renderer, ids, body.get("stop"), bool(body.get("include_stop_str_in_output")))
        if matched is not None:
            kept, text, stop_reason = matched
            ids = ids[:kept]
        budget = body.get("max_tokens")
        finish = "stop"
        if budget is not None and len(ids) > budget:
            ids, finish, stop_reason = ids[:budget], "length", None
            text = self.renderer.decode(ids)
        choice = {"index": 0, "text": text, "token_ids": ids, "finish_reason": finish, "stop_reason": stop_reason,
                  "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids),
                               "top_logprobs": [], "text_offset": []}}
        return {"id": f"cmpl-{len(self.requests)}", "object": "text_completion", "created": int(time.time()),
                "model": self.model, "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "total_tokens": len(prompt) + len(ids)}}


def _chat_chunks(body: dict[str, Any], reply: dict[str, Any], message: Message) -> list[dict[str, Any]]:
    """A chat reply as vLLM streams it: the role (and the prompt's ids, when asked), the content one character
    a chunk with its bytes as ids, then the tool calls, the rest of the ids and the finish reason; the usage last
    when asked."""
    choice = reply["choices"][0]
    head = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    ids, logprobs = choice.get("token_ids"), choice.get("logprobs")

    def chunk(delta: dict[str, Any], taken: int, upto: int, **fields: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None, **fields}
        if ids is not None:
            out["token_ids"] = ids[taken:upto]
        if logprobs is not None:
            out["logprobs"] = {"content": logprobs["content"][taken:upto]}
        return {**head, "choices": [out]}

    first = chunk({"role": "assistant", "content": ""}, 0, 0)
    if "prompt_token_ids" in reply:
        first["prompt_token_ids"] = reply["prompt_token_ids"]
    chunks, taken = [first], 0
    for char in message.text:
        size = len(char.encode())
        chunks.append(chunk({"content": char}, taken, taken + size))
        taken += size
    calls = [{"index": i, **c} for i, c in enumerate(choice["message"].get("tool_calls") or [])]
    chunks.append(chunk({"tool_calls": calls} if calls else {}, taken, len(encode(render_body(message))),
                        finish_reason=choice["finish_reason"]))
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**head, "choices": [], "usage": reply["usage"]})
    return chunks


def _stop_string(renderer: Renderer, ids: list[int], stop: Any, include: bool) -> tuple[int, str, str] | None:
    """As vLLM's detokenizer: the earliest-ending stop string in the text (a final stop token excluded) ends
    the sampling; the ids are kept through the token completing it, the text is cut before it (or after it,
    with `include_stop_str_in_output`). (ids kept, text, the stop string), or None when none matched."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    body = ids[:-1] if ids and ids[-1] in renderer.stop_token_ids else ids
    text = renderer.decode(body)
    found = [(text.find(s) + len(s), text.find(s), s) for s in stops if s and s in text]
    if not found:
        return None
    end, start, matched = min(found)
    offsets = [len(renderer.decode(body[:k])) for k in range(len(body) + 1)]
    kept = bisect.bisect_left(offsets, end, lo=1)
    return kept, text[: end if include else start], matched


def _count(ids: list[int], pattern: list[int]) -> int:
    """How many times `pattern` occurs in `ids`."""
    n = len(pattern)
    return sum(1 for i in range(len(ids) - n + 1) if ids[i : i + n] == pattern)


def _to_request(body: dict[str, Any]) -> ModelRequest:
    tools = [ToolSpec.from_openai(t) for t in body.get("tools") or []]
    return ModelRequest(messages=[Message.from_openai(m) for m in body["messages"]], tools=tools)


def _version_header(version: int | None) -> dict[str, str]:
    return {} if version is None else {policy_version.HEADER: str(version)}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"object": "error", "message": message, "code": status}, status=status)
