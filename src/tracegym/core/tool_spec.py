"""ToolSpec: a tool as the model sees it (name, description, JSON-schema parameters)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

from tracegym.core.record import Record


class ToolSpec(Record):
    """The OpenAI `function` description of one tool."""

    model_config = ConfigDict(frozen=True)
    name: str
    description: str
    parameters: dict[str, Any]
    returns: dict[str, Any] | None = None
    """The schema of what the tool returns, where its description gives one (transformers' `get_json_schema`
    puts it under `return`, and TRL offers the model that schema); sent as `return`."""

    @classmethod
    def from_openai(cls, tool: dict[str, Any]) -> ToolSpec:
        """A tool from the OpenAI `tools` shape (`to_openai`'s inverse: its schema of returns read from `return`)."""
        function = tool["function"]
        return cls(name=function["name"], description=function.get("description", ""),
                   parameters=function.get("parameters") or {}, returns=function.get("return"))

    def to_openai(self) -> dict[str, Any]:
        """This tool in the OpenAI chat-completions `tools` shape."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        if self.returns is not None:
            function["return"] = self.returns
        return {"type": "function", "function": function}
