"""Chat client: the model client for any OpenAI-compatible chat-completions endpoint (vLLM, OpenAI, others).

One aiohttp session per client and event loop is shared by every concurrent call. Connection errors,
attempts past `Endpoint.timeout`, HTTP 429 and 5xx are retried with exponential backoff; other 4xx are not (a
context-length 400 becomes ContextLengthError so the rollout ends as truncated). A caller's deadline (a
rollout's model stage) cancels the whole call, retries and backoff included, and is never retried. When the
endpoint returns them (vLLM with `return_token_ids` and `logprobs`), the exact prompt and completion token ids
and logprobs come back on the response. Tool calls are kept with their raw argument text: malformed JSON is
surfaced when the call runs. When the endpoint's tool parser fails (vLLM's hermes parser then returns the
`<tool_call>` blocks as plain content), the blocks are parsed here instead, so a malformed call still reaches
the rollout as a (failing) tool call.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tracegym.core.errors import ContextLengthError, InfrastructureError, ModelError
from tracegym.core.messages import Message
from tracegym.models import policy_version
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import parse_hermes

_CONTEXT_LENGTH = re.compile(
    r"maximum context length|max_model_len|longer than the maximum model length|context length exceeded|"
    r"context_length_exceeded|too many tokens",
    re.IGNORECASE,
)
_TOKEN_FIELDS = ("return_token_ids", "logprobs")
_TOOL_CALL_TAG = "<tool_call>"


class _Retryable(Exception):
    """Internal: a failure worth another try."""


class ChatClient:
    """`ChatClient(Endpoint(base_url=..., model=...))`; close with `await client.aclose()` or `async with`."""

    def __init__(self, endpoint: Endpoint, *, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """`sleep` waits out each retry's backoff (tests pass one that records the delays)."""
        self.endpoint = endpoint
        self._sleep = sleep
        self._url = endpoint.base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json"}
        if key := endpoint.api_key():
            self._headers["Authorization"] = f"Bearer {key}"
        self._ask_tokens = endpoint.tokens != "off"
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    @property
    def name(self) -> str:
        return self.endpoint.model

    # --- lifecycle ---------------------------------------------------------------------------------------
    def _session(self) -> aiohttp.ClientSession:
        """This event loop's session (a session cannot cross loops; each test or thread gets its own)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=self.endpoint.max_connections, ttl_dns_cache=300)
            # No aiohttp timeout: each attempt runs under `asyncio.timeout` instead. aiohttp's own timer, firing
            # with a caller's deadline (a rollout's model stage), reports the caller's cancellation as its own
            # TimeoutError, which was retried: the call outlived the deadline and ended as an infrastructure error.
            session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(),
                                            headers=self._headers)
            self._sessions = {lp: s for lp, s in self._sessions.items() if not lp.is_closed()}
            self._sessions[loop] = session
        return session

    async def aclose(self) -> None:
        """Close this loop's session."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    # --- the call ----------------------------------------------------------------------------------------
    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One chat completion, retried on transient failures; raises tracegym errors."""
        data = await self._retrying(lambda: self._post(request))
        return parse_response(data, require_tokens=self.endpoint.tokens == "on", tools_offered=bool(request.tools))

    async def _retrying(self, call: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Await `call()` until it succeeds, retrying transient failures with jittered exponential backoff.
        Only those are caught: a cancellation (a caller's deadline) ends the call at once, in flight or in backoff."""
        attempts = self.endpoint.max_retries + 1
        for attempt in range(attempts):
            try:
                return await call()
            except _Retryable as exc:
                if attempt == attempts - 1:
                    raise InfrastructureError(f"{self.endpoint.base_url}: {exc} (after {attempts} attempts)") from None
                delay = self.endpoint.backoff * 2**attempt
                await self._sleep(delay * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")

    async def _post(self, request: ModelRequest) -> dict[str, Any]:
        body = request_body(self.endpoint.model, request, tokens=self._ask_tokens)
        try:
            return await self._send(self._url, body)
        except ModelError as exc:
            rejected = str(exc).startswith("HTTP 400 ") and _mentions_token_fields(str(exc))
            if rejected and self.endpoint.tokens == "auto" and self._ask_tokens:
                self._ask_tokens = False  # this endpoint is not vLLM: stop asking for token ids and try again
                return await self._post(request)
            raise

    async def _send(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` and return the JSON reply; the one place HTTP failures become tracegym errors."""
        try:
            async with asyncio.timeout(self.endpoint.timeout), self._session().post(url, json=body) as http:
                text = await http.text()
                status, version = http.status, policy_version.read(http.headers)
        except TimeoutError:
            raise _Retryable(f"TimeoutError: no reply within {self.endpoint.timeout:g} s") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
        if status == 200:
            data = _json(text)
            if version is not None:
                data[policy_version.BODY_KEY] = version
            return data
        message = _error_message(text)
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}: {message}")
        if status == 400 and _CONTEXT_LENGTH.search(message):
            raise ContextLengthError(message)
        raise ModelError(f"HTTP {status} from {url}: {message}")


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


def parse_response(data: dict[str, Any], *, require_tokens: bool = False, tools_offered: bool = False) -> ModelResponse:
    """A ModelResponse from a chat-completions response body (vLLM's token fields read when present).

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
        policy_version=data.get(policy_version.BODY_KEY),
    )


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


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise _Retryable(f"response is not JSON: {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise ModelError(f"response is not a JSON object: {text[:200]!r}")
    return value


def _error_message(text: str) -> str:
    """The message of an OpenAI- or vLLM-shaped error body, else the body itself (shortened)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return text[:500]


def _mentions_token_fields(message: str) -> bool:
    return any(name in message for name in _TOKEN_FIELDS)
