"""ToolSpec: a tool as the model sees it (name, description, JSON-schema parameters)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ToolSpec(BaseModel):
    """The OpenAI `function` description of one tool."""

    model_config = ConfigDict(frozen=True)
    name: str
    description: str
    parameters: dict[str, Any]
    returns: dict[str, Any] | None = None
    """The schema of what the tool returns, where its description gives one (transformers' `get_json_schema`
    puts it under `return`, and TRL offers the model that schema); sent as `return`."""

    def to_openai(self) -> dict[str, Any]:
        """This tool in the OpenAI chat-completions `tools` shape."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        if self.returns is not None:
            function["return"] = self.returns
        return {"type": "function", "function": function}
