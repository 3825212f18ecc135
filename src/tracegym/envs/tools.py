"""Tool: a Python callable offered to the model, with the JSON schema derived from its hints and docstring, and
its arguments validated and converted by those same hints."""

from __future__ import annotations

import base64
import dataclasses
import inspect
import io
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, PydanticUserError, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python
from typing_extensions import TypedDict  # pydantic reads a typing.TypedDict only from Python 3.12

from tracegym.core.errors import ToolError, UsageError
from tracegym.core.messages import ContentPart, ImagePart, TextPart
from tracegym.core.tool_spec import ToolSpec
from tracegym.envs.task_sandbox import sandboxed_source
from tracegym.envs.thread_lane import TOOLS

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class Tool:
    """A callable, its spec, and the adapter that checks the model's arguments against the callable's hints (the
    spec's parameter schema is that adapter's schema, so what the model is told and what is accepted agree)."""

    fn: Callable[..., Any]
    spec: ToolSpec
    arguments: TypeAdapter[dict[str, Any]]
    sandboxed: bool = False
    """Runs in the rollout's sandbox, not in the worker (`envs.task_sandbox.sandboxed`)."""
    text: Callable[[Any], str] | None = None
    """How a result that is neither an image nor content blocks becomes the text the model reads; None: `as_text`
    (a TRL environment class's tools: `str`, as TRL does)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None, skip_self: bool = False) -> Tool:
        """Derive the spec and the argument adapter once; raises UsageError naming the tool and the missing hint
        or docstring entry."""
        tool_name = name or fn.__name__
        doc = inspect.getdoc(fn)
        if not doc:
            raise UsageError(f"tool {tool_name!r} has no docstring; describe it and its arguments under 'Args:'")
        summary, arg_docs = parse_docstring(doc)
        adapter = arguments_adapter(fn, tool_name, arg_docs, skip_self)
        spec = ToolSpec(name=tool_name, description=summary, parameters=_schema(adapter))
        return cls(fn, spec, adapter, sandboxed_source(fn) is not None)

    def bound_to(self, fn: Callable[..., Any]) -> Tool:
        """The same spec over another callable (a class tool bound to one environment instance)."""
        return dataclasses.replace(self, fn=fn)

    async def call(self, arguments: dict[str, Any]) -> str | list[ContentPart]:
        """Run the tool on its arguments, validated and converted by its hints (ToolError naming each argument
        at fault otherwise); the result becomes text, or parts when it holds images, see `as_content`. A sync
        tool runs on a daemon thread of the tool lane: one that hangs past its timeout is abandoned (Python
        cannot kill a thread) and neither holds a slot nor blocks exit, see `thread_lane`."""
        try:
            kwargs = self.arguments.validate_python(arguments)
        except ValidationError as exc:
            problems = "; ".join(_problem(e) for e in exc.errors(include_url=False))
            raise ToolError(f"invalid arguments for tool {self.name!r}: {problems}") from None
        return as_content(await TOOLS.call(self.fn, **kwargs), self.text or as_text)


def as_content(result: Any, text: Callable[[Any], str] | None = None) -> str | list[ContentPart]:
    """A tool's result as the tool message's content: an image (a PIL image), or a list of content blocks as
    TRL's multimodal tools return them (`[{"type": "image", "image": img}, {"type": "text", "text": ...}]`),
    becomes content parts, each image a `data:` URI; anything else becomes text, by `text` (`as_text`)."""
    if _is_image(result):
        return [image_part(result)]
    if isinstance(result, list) and result and all(_is_block(item) for item in result):
        return content_parts(result)
    return (text or as_text)(result)


def content_parts(blocks: list[Any]) -> list[ContentPart]:
    """Content blocks (TRL's `{"type": "text" | "image", ...}` dicts, OpenAI's `image_url` ones, parts, images)
    as content parts."""
    parts: list[ContentPart] = []
    for block in blocks:
        if isinstance(block, TextPart | ImagePart):
            parts.append(block)
        elif _is_image(block):
            parts.append(image_part(block))
        elif block["type"] == "text":
            parts.append(TextPart(text=str(block["text"])))
        elif block["type"] == "image_url":
            parts.append(ImagePart(image_url=dict(block["image_url"])))
        else:
            image = block["image"]
            parts.append(image_part(image) if _is_image(image) else ImagePart(image_url={"url": str(image)}))
    return parts


def image_part(image: Any) -> ImagePart:
    """A PIL image as an image part holding it as a PNG `data:` URI (encoded in memory)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return ImagePart(image_url={"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()})


def _is_image(value: Any) -> bool:
    """A PIL image, known by its class's module (PIL is not a dependency, so it is never imported here)."""
    return type(value).__module__.startswith("PIL.") and callable(getattr(value, "save", None))


def _is_block(value: Any) -> bool:
    if isinstance(value, TextPart | ImagePart) or _is_image(value):
        return True
    kind = value.get("type") if isinstance(value, dict) else None
    return (kind == "text" and "text" in value) or (kind == "image" and "image" in value) or (
        kind == "image_url" and isinstance(value.get("image_url"), dict))


def as_text(result: Any) -> str:
    """A tool's result as the model reads it: a string as it is; data (pydantic models, dataclasses, dicts, lists,
    numbers, bools, None) as JSON; anything else as its `str` inside JSON."""
    if isinstance(result, str):
        return result
    return json.dumps(to_jsonable_python(result, fallback=str))


def arguments_adapter(fn: Callable[..., Any], tool_name: str, arg_docs: dict[str, str],
                      skip_self: bool = False) -> TypeAdapter[dict[str, Any]]:
    """A TypeAdapter of the tool's keyword arguments, a TypedDict of its hinted parameters (those with a default
    not required; unknown arguments refused unless the function takes `**kwargs`)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())
    if skip_self and params:
        params = params[1:]
    fields: dict[str, Any] = {}
    extra: Literal["allow", "forbid"] = "forbid"
    for param in params:
        if param.kind == param.VAR_KEYWORD:
            extra = "allow"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name not in hints:
            raise UsageError(f"tool {tool_name!r}: argument {param.name!r} has no type hint")
        if param.name not in arg_docs:
            raise UsageError(f"tool {tool_name!r}: argument {param.name!r} is not described under 'Args:'")
        hint: Any = Annotated[hints[param.name], Field(description=arg_docs[param.name])]  # a value, not a hint
        fields[param.name] = hint if param.default is param.empty else NotRequired[hint]
    typed_dict: Any = TypedDict  # its functional form, with a name and fields known only at run time
    arguments = typed_dict(f"{tool_name}_arguments", fields)
    arguments.__pydantic_config__ = ConfigDict(extra=extra)
    try:
        adapter = TypeAdapter(arguments)
        adapter.json_schema()
    except PydanticUserError as exc:  # a hint pydantic cannot validate or describe: name the argument
        bad = next((n for n in fields if not _describable(hints[n])), None)  # the bare hint: NotRequired[] alone fails
        what = f"argument {bad!r}" if bad else "an argument"
        raise UsageError(f"tool {tool_name!r}: {what} has a type hint that cannot be validated or described "
                         f"as JSON: {str(exc).splitlines()[0]}") from None
    return adapter


def _describable(hint: Any) -> bool:
    try:
        TypeAdapter(hint).json_schema()
    except PydanticUserError:
        return False
    return True


def _schema(adapter: TypeAdapter[Any]) -> dict[str, Any]:
    """The adapter's JSON schema as a tool's `parameters`, without the titles pydantic adds to it and to each
    argument (nested models' schemas under `$defs` keep theirs); `properties` and `required` always present."""
    schema = {"type": "object", "properties": {}, "required": [], **adapter.json_schema()}
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def _problem(error: Any) -> str:
    """One validation error as `path: what` (with the value given, shortened, where there was one)."""
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    if error["type"] == "extra_forbidden":
        return f"{where}: unexpected argument"
    if error["type"] == "missing":
        return f"{where}: {error['msg']}"
    given = repr(error["input"])
    given = given if len(given) <= 60 else given[:57] + "..."
    return f"{where}: {error['msg']} (got {given})"


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
