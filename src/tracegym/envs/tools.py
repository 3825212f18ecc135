"""Tool: a Python callable offered to the model, with the JSON schema derived from its hints and docstring."""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from tracegym.core.errors import UsageError
from tracegym.core.tool_spec import ToolSpec
from tracegym.envs.thread_lane import TOOLS

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class Tool:
    """A callable and its spec; `call` runs it with JSON arguments and returns its result as text."""

    fn: Callable[..., Any]
    spec: ToolSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None, skip_self: bool = False) -> Tool:
        """Derive the spec; raises UsageError naming the tool and the missing hint or docstring entry."""
        return cls(fn, tool_spec(fn, name=name, skip_self=skip_self))

    def bound_to(self, fn: Callable[..., Any]) -> Tool:
        """The same spec over another callable (a class tool bound to one environment instance)."""
        return Tool(fn, self.spec)

    async def call(self, arguments: dict[str, Any]) -> str:
        """Run the tool; its return value becomes text (strings as they are, anything else as JSON). A sync tool
        runs on a daemon thread of the tool lane: one that hangs past its timeout is abandoned (Python cannot
        kill a thread) and neither holds a slot nor blocks exit, see `thread_lane`."""
        result = await TOOLS.call(self.fn, **arguments)
        if isinstance(result, str):
            return result
        return json.dumps(result, default=str)


def tool_spec(fn: Callable[..., Any], name: str | None = None, skip_self: bool = False) -> ToolSpec:
    """The ToolSpec of a function with type hints and a Google-style docstring."""
    tool_name = name or fn.__name__
    doc = inspect.getdoc(fn)
    if not doc:
        raise UsageError(f"tool {tool_name!r} has no docstring; describe it and its arguments under 'Args:'")
    summary, arg_docs = parse_docstring(doc)
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    if skip_self and params:
        params = params[1:]
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name not in hints:
            raise UsageError(f"tool {tool_name!r}: argument {param.name!r} has no type hint")
        if param.name not in arg_docs:
            raise UsageError(f"tool {tool_name!r}: argument {param.name!r} is not described under 'Args:'")
        schema = TypeAdapter(hints[param.name]).json_schema()
        schema.pop("title", None)
        properties[param.name] = {**schema, "description": arg_docs[param.name]}
        if param.default is param.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return ToolSpec(name=tool_name, description=summary, parameters=parameters)


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The summary and the `Args:` descriptions of a Google-style docstring."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    args_indent = 0
    for line in doc.splitlines():
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1), None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            match = _ARG_LINE.match(line)
            if match and (current is None or _indent(line) <= args_indent):
                current, args_indent = match.group(1).lstrip("*"), _indent(line)
                args[current] = match.group(3).strip()
            elif current is not None:
                args[current] = (args[current] + " " + line.strip()).strip()
    return " ".join(s.strip() for s in summary if s.strip()), args


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())
