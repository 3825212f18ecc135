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

    def to_openai(self) -> dict[str, Any]:
        """This tool in the OpenAI chat-completions `tools` shape."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }
