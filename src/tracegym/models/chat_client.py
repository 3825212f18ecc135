"""Chat client: the model client for any OpenAI-compatible chat-completions endpoint (vLLM, OpenAI, others).

HTTP, retries and error mapping are the transport's (`models.transport`: connection errors, attempts past
`Endpoint.timeout`, 429 and 5xx retried with backoff; a context-length 400 a ContextLengthError, so the rollout
ends as truncated). With `tokens="auto"` a 400 naming the token fields makes the client stop asking for them
(the endpoint is not vLLM) and ask again. A caller's deadline (a rollout's model stage) cancels the whole call,
retries and backoff included, and is never retried. When the endpoint returns them (vLLM with
`return_token_ids` and `logprobs`), the exact prompt and completion token ids and logprobs come back on the
response. Tool calls are kept with their raw argument text: malformed JSON is surfaced when the call runs. When
the endpoint's tool parser fails (vLLM's hermes parser then returns the `<tool_call>` blocks as plain content),
the blocks are parsed here instead, so a malformed call still reaches the rollout as a (failing) tool call.
A request with a `stream` is streamed (`models.streaming`): vLLM's chunks (content, reasoning and tool-call
deltas, each chunk's `token_ids` and `logprobs`, the first's `prompt_token_ids`, the usage) are folded into the
body the unstreamed call returns, and parsed by the same `parse_response`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tracegym.core.errors import ModelError
from tracegym.core.messages import Message
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.models.endpoint import Endpoint
from tracegym.models.endpoint_client import EndpointClient
from tracegym.models.renderer import parse_hermes
from tracegym.models.streaming import StreamedReply
from tracegym.models.transport import Refused, Reply, Transport

_TOKEN_FIELDS = ("return_token_ids", "logprobs")
_TOOL_CALL_TAG = "<tool_call>"


class ChatClient(EndpointClient):
    """`ChatClient(Endpoint(base_url=..., model=...))`; close with `await client.aclose()` or `async with`."""

    def __init__(self, endpoint: Endpoint, *, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """`sleep` waits out each retry's backoff (tests pass one that records the delays)."""
        super().__init__(endpoint)
        self.transport = Transport(endpoint, sleep=sleep)
        self._ask_tokens = endpoint.tokens != "off"

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        await self.transport.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One chat completion, retried on transient failures (streamed to `request.stream` when it has one);
        raises tracegym errors."""
        reply = await self._post(request)
        return parse_response(reply.data, require_tokens=self.endpoint.tokens == "on",
                              tools_offered=bool(request.tools), policy_version=reply.policy_version)

    async def _post(self, request: ModelRequest) -> Reply:
        asked = self._ask_tokens  # concurrent requests may all be rejected: each that asked tries again
        body = request_body(self.endpoint.model, request, tokens=asked)
        reader = None
        if request.stream is not None:
            body.update(stream=True, stream_options={"include_usage": True})
            tools = bool(request.tools)
            reader = StreamedReply(request.stream, ChatChunks, lambda b: parse_response(b, tools_offered=tools))
        try:
            return await self.transport.post("/chat/completions", body, reader)
        except Refused as exc:
            rejected = exc.status == 400 and any(name in exc.detail for name in _TOKEN_FIELDS)
            if rejected and self.endpoint.tokens == "auto" and asked:
                self._ask_tokens = False  # this endpoint is not vLLM: stop asking for token ids and try again
                return await self._post(request)
            raise


def request_body(model: str, request: ModelRequest, *, tokens: bool) -> dict[str, Any]:
    """The JSON body of a chat-completions call."""
    s = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "messages": [m.to_openai() for m in request.messages],
        "temperature": s.temperature,
        "top_p": s.top_p,
    }
    if request.tools:
        body["tools"] = [t.to_openai() for t in request.tools]
    if s.max_tokens is not None:
        body["max_tokens"] = s.max_tokens
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if tokens:
        body["return_token_ids"] = True
        body["logprobs"] = True
    body.update(s.extra)
    return body


def parse_response(data: dict[str, Any], *, require_tokens: bool = False, tools_offered: bool = False,
                   policy_version: int | None = None) -> ModelResponse:
    """A ModelResponse from a chat-completions response body (vLLM's token fields read when present) and the
    policy version the reply's headers reported.

    With `tools_offered`, `<tool_call>` blocks left in the content (the server's tool parser failed on them)
    become tool calls carrying their raw text, so the rollout reports them to the model as tool errors.
    """
    try:
        choice = data["choices"][0]
        message = Message.from_openai({**choice["message"], "role": "assistant"})
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ModelError(f"malformed chat completion ({type(exc).__name__}: {exc}): {str(data)[:300]}") from None
    if tools_offered and not message.tool_calls and _TOOL_CALL_TAG in message.text:
        message = _unparsed_tool_calls(message)
    usage = data.get("usage") or {}
    completion_ids = choice.get("token_ids")
    prompt_ids = data.get("prompt_token_ids")
    if require_tokens and (completion_ids is None or prompt_ids is None):
        raise ModelError("endpoint returned no token ids (tokens='on'); is it vLLM with return_token_ids support?")
    return ModelResponse(
        message=message,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None,
        completion_token_ids=list(completion_ids) if completion_ids is not None else None,
        completion_logprobs=_logprobs(choice.get("logprobs")),
        policy_version=policy_version,
    )


class ChatChunks:
    """`chat.completion.chunk` events folded into the `chat.completion` body they stream (choice 0)."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.text: dict[str, list[str]] = {}
        """Each text field of the message (`content`, `reasoning`, `reasoning_content`): its pieces."""
        self.calls: dict[int, dict[str, Any]] = {}
        self.choice: dict[str, Any] = {"index": 0, "finish_reason": None}

    def add(self, chunk: dict[str, Any]) -> bool:
        for key in ("id", "created", "model", "prompt_token_ids", "usage"):
            if chunk.get(key) is not None:
                self.head[key] = chunk[key]
        grew = False
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                grew = self._add_choice(choice) or grew
        return grew

    def _add_choice(self, choice: dict[str, Any]) -> bool:
        delta = choice.get("delta") or {}
        grew = False
        for field in ("content", "reasoning", "reasoning_content"):
            if delta.get(field):
                self.text.setdefault(field, []).append(delta[field])
                grew = True
        for call in delta.get("tool_calls") or []:
            self._add_call(call)
            grew = True
        if choice.get("token_ids"):
            self.choice.setdefault("token_ids", []).extend(choice["token_ids"])
            grew = True
        entries = (choice.get("logprobs") or {}).get("content")
        if entries:
            self.choice.setdefault("logprobs", {"content": []})["content"].extend(entries)
        for key in ("finish_reason", "stop_reason"):
            if choice.get(key) is not None:
                self.choice[key] = choice[key]
        return grew

    def _add_call(self, delta: dict[str, Any]) -> None:
        call = self.calls.setdefault(delta.get("index", len(self.calls)),
                                     {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        if delta.get("id"):
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None}
        message.update({field: "".join(pieces) for field, pieces in self.text.items()})
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return {**self.head, "object": "chat.completion", "choices": [{**self.choice, "message": message}]}


def _unparsed_tool_calls(message: Message) -> Message:
    """`message` with the `<tool_call>` blocks of its text turned into tool calls (raw text kept as arguments
    when a block is not valid JSON)."""
    parsed = parse_hermes(message.text)
    return message.model_copy(update={"content": parsed.content, "tool_calls": parsed.tool_calls})


def _logprobs(block: dict[str, Any] | None) -> list[float] | None:
    content = (block or {}).get("content")
    if not content:
        return None
    return [float(entry["logprob"]) for entry in content]
