"""Program reply: the model's reply to an agent program's call, in OpenAI's shape: one `chat.completion` body, or
(`stream: true`) its server-sent chunks, relayed while the model samples it (`Relay`).

The interception proxy hands a Relay to the rollout's model client as the call's `ModelRequest.stream`. A client
that streams (the chat and token clients) updates it with the reply parsed so far, chunk by chunk, and the relay
sends the program what of it can no longer change: the text (content, reasoning) up to a held-back tail, which is
a stop string's start, an unfinished markup tag (`<tool_c...`, `<|im_...`), a split UTF-8 character, or trailing
whitespace (a tool call may follow, and the content is then stripped). When the call returns, `finish` sends the
rest of the reply the trace records: its text past what was shown, its tool calls, the finish reason and (when
asked) the usage, so the program assembles the message the trace holds and its next call extends the branch. A
client that does not stream never updates it: the whole reply goes in one piece at the end. A failure after the
first chunk is sent as an OpenAI-style `error` event (a status can no longer be); the program closing its
connection mid-stream cancels the model call (the model stops sampling; the reply is not recorded).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from tracegym.core.messages import Message
from tracegym.models.client import ModelResponse

_ids = itertools.count(1)
_OPEN_TAG = re.compile(r"<[^\s<>]*\Z")
"""A markup tag still being sampled at the end of the text: `<`, `<tool_c`, `<|im_`."""
_TEXT_FIELDS = ("content", "reasoning_content")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def usage_of(response: ModelResponse) -> dict[str, int]:
    """The call's usage block."""
    return {"prompt_tokens": response.prompt_tokens, "completion_tokens": response.completion_tokens,
            "total_tokens": response.prompt_tokens + response.completion_tokens}


def finish_of(response: ModelResponse) -> str:
    """The finish reason the program hears (`stop` or `tool_calls` when the client did not say)."""
    return response.finish_reason or ("tool_calls" if response.message.tool_calls else "stop")


def completion_body(response: ModelResponse, model: str) -> dict[str, Any]:
    """A `chat.completion` body for the model's reply."""
    return {"id": f"chatcmpl-tg{next(_ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": _reply_message(response.message),
                                         "finish_reason": finish_of(response), "logprobs": None}],
            "usage": usage_of(response)}


def _reply_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.text if message.content is not None else None}
    if message.tool_calls:
        out["tool_calls"] = _tool_calls(message)
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    return out


def _tool_calls(message: Message) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls]


def showable(text: str, stops: Sequence[str] = ()) -> str:
    """The part of `text`, a reply's text so far, that sampling more cannot change (see the module)."""
    for stop in stops:
        at = text.find(stop) if stop else -1
        if at >= 0:
            text = text[:at]
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                text = text[:-k]
                break
    tag = _OPEN_TAG.search(text)
    if tag is not None:
        text = text[: tag.start()]
    return text.rstrip().rstrip("\ufffd").rstrip()


class Relay:
    """The `ReplyStream` of one program call with `stream: true`: `update` sends what can be shown as it comes,
    `finish` the rest, `fail` an error event; `response` is the HTTP response once anything was sent."""

    def __init__(self, http: web.Request, model: str) -> None:
        self.http, self.model = http, model
        self.head = {"id": f"chatcmpl-tg{next(_ids)}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model}
        self.stops: Sequence[str] = ()
        """The call's stop strings (a text ending in one's start is held back)."""
        self.call: asyncio.Task[Any] | None = None
        """The model call, cancelled when the program goes."""
        self.response: web.StreamResponse | None = None
        self.sent = dict.fromkeys(_TEXT_FIELDS, "")
        """The text of each field sent so far."""
        self.gone = False
        """The program closed its connection before the reply was whole."""
        self.diverged = False
        """The recorded reply's text does not extend what was shown (it could not be taken back)."""
        self._opened = False

    @property
    def shown(self) -> bool:
        return self.response is not None

    async def update(self, partial: ModelResponse) -> None:
        """Send the part of the reply so far that can no longer change (nothing when nothing new can)."""
        delta = self._delta(partial.message, final=False)
        if delta:
            await self._send([self._chunk(delta)])

    async def finish(self, response: ModelResponse, usage: dict[str, int] | None) -> None:
        """Send the rest of the recorded reply, its tool calls, finish reason and usage, then `[DONE]`."""
        delta = self._delta(response.message, final=True)
        chunks = [self._chunk(delta)] if delta or not self._opened else []
        if response.message.tool_calls:
            calls = [{"index": i, **call} for i, call in enumerate(_tool_calls(response.message))]
            chunks.append(self._chunk({"tool_calls": calls}))
        chunks.append(self._chunk({}, finish_of(response)))
        if usage is not None:
            chunks.append({**self.head, "choices": [], "usage": usage})
        await self._send(chunks, done=True)

    async def fail(self, body: dict[str, Any]) -> None:
        """End the stream with an OpenAI-style `error` event (`body`: `{"error": {...}}`)."""
        await self._send([body], done=True)

    def _delta(self, message: Message, *, final: bool) -> dict[str, str]:
        texts = {"content": message.text if message.content is not None else "",
                 "reasoning_content": message.reasoning_content or ""}
        delta = {}
        for field, text in texts.items():
            now, was = (text if final else showable(text, self.stops)), self.sent[field]
            if not now.startswith(was):
                self.diverged = self.diverged or final
                continue
            if len(now) > len(was):
                delta[field], self.sent[field] = now[len(was):], now
        return delta

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        if not self._opened:  # the first chunk names the role, as OpenAI's do
            delta, self._opened = {"role": "assistant", "content": "", **delta}, True
        return {**self.head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    async def _send(self, chunks: list[dict[str, Any]], *, done: bool = False) -> None:
        """Write `chunks` as events (and `[DONE]`); a program gone mid-stream cancels the model call."""
        if self.gone:
            return
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
        try:
            if self.response is None:
                response = web.StreamResponse(headers=SSE_HEADERS)
                await response.prepare(self.http)
                self.response = response
            await self.response.write(data + (b"data: [DONE]\n\n" if done else b""))
            if done:
                await self.response.write_eof()
        except ConnectionError:  # the program closed its connection
            self.gone = True
            if self.call is not None and not done:
                self.call.cancel()
