"""Messages: the chat turns a rollout exchanges (system, user, assistant, tool), in OpenAI shape."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict, Field

from tracegym.core.record import Record

Role = Literal["system", "user", "assistant", "tool"]


class TextPart(Record):
    """A text content part."""

    model_config = ConfigDict(frozen=True)
    type: Literal["text"] = "text"
    text: str


class ImagePart(Record):
    """An image content part: a URL or a `data:` URI, as OpenAI's `image_url`."""

    model_config = ConfigDict(frozen=True)
    type: Literal["image_url"] = "image_url"
    image_url: dict[str, str]


ContentPart = TextPart | ImagePart


class ToolCall(Record):
    """A tool call as the model emitted it; `arguments` is the raw JSON text, parsed only when run."""

    model_config = ConfigDict(frozen=True)
    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; raises ValueError naming the problem when they are not a JSON object."""
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments of tool call {self.name!r} are not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"arguments of tool call {self.name!r} must be a JSON object, got {value!r}")
        return value


class Message(Record):
    """One chat message. Content is text, a list of parts, or None (an assistant turn with only tool calls)."""

    model_config = ConfigDict(frozen=True)
    role: Role
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    @property
    def text(self) -> str:
        """The text of the message, parts joined; images are left out."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> Message:
        """A message from an OpenAI chat-completions message (request or response shape); its reasoning from
        `reasoning_content`, else `reasoning` (the field vLLM 0.32 answers with)."""
        calls = [  # a call without a function name is kept (named "") so that running it fails as one bad call
            ToolCall(id=c.get("id") or f"call_{i}", name=(c.get("function") or {}).get("name") or "",
                     arguments=(c.get("function") or {}).get("arguments") or "{}")
            for i, c in enumerate(data.get("tool_calls") or [])
        ]
        return cls(
            role=data["role"],
            content=data.get("content"),
            tool_calls=calls,
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            reasoning_content=data.get("reasoning_content") if data.get("reasoning_content") is not None
            else data.get("reasoning"),
        )

    def to_openai(self) -> dict[str, Any]:
        """This message as an OpenAI chat-completions request message."""
        out: dict[str, Any] = {"role": self.role}
        if isinstance(self.content, list):
            out["content"] = [p.model_dump() for p in self.content]
        else:
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def system(text: str) -> Message:
    """A system message."""
    return Message(role="system", content=text)


def user(content: str | list[ContentPart]) -> Message:
    """A user message."""
    return Message(role="user", content=content)


def assistant(text: str | None = None, tool_calls: list[ToolCall] | None = None) -> Message:
    """An assistant message."""
    return Message(role="assistant", content=text, tool_calls=tool_calls or [])


def tool(content: str | list[ContentPart], tool_call_id: str, name: str | None = None) -> Message:
    """A tool-result message answering the call `tool_call_id` (text, or parts when the tool returned images)."""
    return Message(role="tool", content=content, tool_call_id=tool_call_id, name=name)
