"""Script: what a fake model answers, by rule or by turn, shared by the scripted model and the fake server.

A script entry is a reply (text or an assistant Message), a `Stall` (wait, then answer), a `Fail` (raise or
answer with an HTTP error) or a callable taking the request and returning any of these. With a list, the reply
for a request is entry number k, where k counts the assistant messages already in the conversation, so
concurrent rollouts each follow the script from the start.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from tracegym.core.errors import InfrastructureError, ModelError
from tracegym.core.messages import Message, ToolCall, assistant
from tracegym.models.client import ModelRequest

_ids = itertools.count()


@dataclass(frozen=True)
class Stall:
    """Wait `seconds` (forever when None) before answering with `then`."""

    seconds: float | None = None
    then: Entry = ""


@dataclass(frozen=True)
class Fail:
    """Fail this call: the scripted model raises `error`; the fake server answers HTTP `status`."""

    status: int = 503
    message: str = "scripted failure"

    @property
    def error(self) -> Exception:
        cls = InfrastructureError if self.status >= 500 or self.status == 429 else ModelError
        return cls(f"HTTP {self.status}: {self.message}")


Entry = Union[str, Message, Stall, Fail, Callable[[ModelRequest], "Entry"]]  # noqa: UP007 (recursive alias)


def tool_call(name: str, arguments: dict[str, Any] | str | None = None, id: str | None = None) -> ToolCall:
    """A tool call; a string `arguments` is sent raw (to script malformed JSON)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(id=id or f"call_{next(_ids)}", name=name, arguments=raw)


def reply(text: str | None = None, *calls: ToolCall) -> Message:
    """An assistant reply with optional tool calls."""
    return assistant(text, list(calls))


class Script:
    """Resolves a request to the scripted reply, applying stalls; failures are returned, not raised."""

    def __init__(self, entries: Sequence[Entry] | None = None, rule: Callable[[ModelRequest], Entry] | None = None,
                 default: Entry = "") -> None:
        self.entries = list(entries or [])
        self.rule = rule
        self.default = default

    def entry_for(self, request: ModelRequest) -> Entry:
        turn = sum(1 for m in request.messages if m.role == "assistant")
        if turn < len(self.entries):
            return self.entries[turn]
        return self.rule if self.rule is not None else self.default

    async def resolve(self, request: ModelRequest) -> Message | Fail:
        """The reply message (or the failure) for this request, after any stall."""
        entry = self.entry_for(request)
        for _ in range(16):  # callables and stalls may nest; bounded so a cycle cannot spin
            if isinstance(entry, Stall):
                await asyncio.sleep(entry.seconds if entry.seconds is not None else 10**9)
                entry = entry.then
            elif callable(entry) and not isinstance(entry, Message | Fail):
                entry = entry(request)
            else:
                break
        if isinstance(entry, Fail | Message):
            return entry
        return assistant(str(entry))
