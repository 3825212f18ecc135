"""Renderer: turns messages (and tools) into a model's prompt token ids, and sampled ids back into a message.

Its bridge makes multi-turn prompts token-exact: the next prompt is the previous prompt ids + the sampled
completion ids + only the new messages rendered, then the generation prompt, so earlier turns are never
re-tokenized. A bridge returns None when it cannot prove that extension safe; the caller then renders the
whole conversation (and the message graph forks when that render does not extend the branch's tokens).

Two implementations: `ChatMLRenderer`, ours, for ChatML templates such as the embedded SmolLM2 (whose template
ignores tools, so the tool specs go into the system prompt in the Hermes style and calls are parsed from
`<tool_call>` JSON), and `LibraryRenderer`, which adapts a renderer of the `renderers` package for the model
families it ships hand-coded renderers for. `renderer_for(tokenizer)` picks one.

For a vision-language model (a model folder with an image processor) `ChatMLRenderer` renders each image part as
the processor's image token and expands it into the image's placeholder run (`models.image_prompt`), so the ids
are those the model's processor makes of the same chat; a renderer without `images` renders text only.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from tracegym.core.errors import UsageError
from tracegym.core.messages import Message, TextPart, ToolCall
from tracegym.core.tool_spec import ToolSpec
from tracegym.models.image_prompt import ImageTokens, load_image_tokens, message_images


@runtime_checkable
class Renderer(Protocol):
    """Message <-> token conversion for one model's chat format."""

    @property
    def stop_token_ids(self) -> list[int]:
        """Tokens that end an assistant turn."""
        ...

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *,
               add_generation_prompt: bool = True) -> list[int]:
        """The whole conversation as token ids (with the assistant header to sample after, by default)."""
        ...

    def bridge(self, prompt_ids: list[int], completion_ids: list[int], new_messages: Sequence[Message],
               tools: Sequence[ToolSpec] = ()) -> list[int] | None:
        """The next prompt: `prompt_ids + completion_ids` unchanged, then `new_messages` and the generation
        prompt; None when that cannot be proven equivalent to a render of the conversation."""
        ...

    def parse(self, completion_ids: list[int], *, stop: str | None = None) -> Message:
        """The assistant message in sampled ids: content and tool calls (malformed calls keep their raw text);
        with `stop`, the matched stop string the ids end with, the text is cut where it starts."""
        ...

    def completion_ids(self, message: Message) -> list[int]:
        """The ids of an assistant message as the model samples it (body and close); for fakes and tests."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Token ids to text, special tokens included."""
        ...


# --- ChatML ----------------------------------------------------------------------------------------------
TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
"""The Hermes / Qwen tool instructions, appended to the system prompt when the conversation has tools."""

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_CALL_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\n|\\n)(.*?)<\|im_end\|>", re.DOTALL)


class ChatMLRenderer:
    """`<|im_start|>role\\ncontent<|im_end|>\\n` turns; tools as Hermes `<tools>` in the system prompt, calls
    as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, results as `tool` turns in `<tool_response>`.

    Plain conversations render exactly as the tokenizer's own ChatML template (`default_system` is the
    system prompt that template inserts when the conversation has none, e.g. SmolLM2's). With `images` (a VLM's
    image placeholders) an image part renders where it stands in its message, as the processor expands it.
    """

    def __init__(self, tokenizer: Any, *, default_system: str | None = None, images: ImageTokens | None = None) -> None:
        self.tokenizer = tokenizer
        self.default_system = default_system
        self.images = images
        self.im_start = _special_id(tokenizer, "<|im_start|>")
        self.im_end = _special_id(tokenizer, "<|im_end|>")
        ends = [getattr(tokenizer, "eos_token_id", None), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
        unknown = getattr(tokenizer, "unk_token_id", None)
        self._stops = [self.im_end, *{t for t in ends if isinstance(t, int) and t not in (self.im_end, unknown)}]
        self.generation_prompt_ids = self.encode("<|im_start|>assistant\n")

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self._stops)

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *,
               add_generation_prompt: bool = True) -> list[int]:
        conversation = messages = list(messages)
        system = None
        if messages and messages[0].role == "system":
            system, messages = self._content(messages[0]), messages[1:]
        elif self.default_system is not None:
            system = self.default_system
        if tools:
            listed = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
            system = (system + "\n\n" if system else "") + TOOLS_PROMPT.format(tools=listed)
        text = _turn("system", system) if system is not None else ""
        text += "".join(self._turn_text(m) for m in messages)
        ids = self.encode(text + ("<|im_start|>assistant\n" if add_generation_prompt else ""))
        return self._with_images(ids, conversation)

    def bridge(self, prompt_ids: list[int], completion_ids: list[int], new_messages: Sequence[Message],
               tools: Sequence[ToolSpec] = ()) -> list[int] | None:
        """None (render in full) when there is no previous prompt or completion, no new message, a new
        assistant message (its tokens would not be the sampled ones), or tokens after the sampled close."""
        if not prompt_ids or not completion_ids or not new_messages:
            return None
        if any(m.role == "assistant" for m in new_messages):
            return None
        closes = [i for i, t in enumerate(completion_ids) if t in self._stops]
        if closes and closes[0] != len(completion_ids) - 1:
            return None
        close = [] if closes else [self.im_end]  # a truncated turn gets its close as unsampled prompt
        text = "\n" + "".join(self._turn_text(m) for m in new_messages) + "<|im_start|>assistant\n"
        return [*prompt_ids, *completion_ids, *close, *self._with_images(self.encode(text), new_messages)]

    def parse(self, completion_ids: list[int], *, stop: str | None = None) -> Message:
        ids = list(completion_ids)
        while ids and ids[-1] in self._stops:
            ids.pop()
        return parse_hermes(_cut(self.decode(ids), stop))

    def completion_ids(self, message: Message) -> list[int]:
        return [*self.encode(_assistant_body(message)), self.im_end]

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))

    def _turn_text(self, message: Message) -> str:
        if message.role == "assistant":
            return _turn("assistant", _assistant_body(message))
        if message.role == "tool":
            return _turn("tool", f"<tool_response>\n{self._content(message)}\n</tool_response>")
        return _turn(message.role, self._content(message))

    def _content(self, message: Message) -> str:
        """The message's text, each image part (when this renderer renders images) as the image token."""
        if self.images is None or not isinstance(message.content, list):
            return message.text
        token = self.images.image_token
        return "".join(p.text if isinstance(p, TextPart) else token for p in message.content)

    def _with_images(self, ids: list[int], messages: Sequence[Message]) -> list[int]:
        """`ids` (rendered from `messages`) with each image token expanded into its image's run."""
        images = message_images(messages)
        return self.images.expand(ids, images) if self.images is not None and images else ids

    def encode(self, text: str) -> list[int]:
        """Text to ids (special tokens in the text are recognised), as the template's render tokenizes it."""
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []


def _turn(role: str, body: str) -> str:
    return f"<|im_start|>{role}\n{body}<|im_end|>\n"


def _assistant_body(message: Message) -> str:
    """Content, then each tool call as a `<tool_call>` block with its raw argument text."""
    blocks = [f'<tool_call>\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}\n</tool_call>'
              for c in message.tool_calls]
    return "\n".join(([message.text] if message.text else []) + blocks)


def _cut(text: str, stop: str | None) -> str:
    """`text` up to the first `stop` (where vLLM's stop-string check ended the sampling)."""
    at = text.find(stop) if stop else -1
    return text[:at] if at >= 0 else text


def parse_hermes(text: str) -> Message:
    """An assistant message from text with `<tool_call>` JSON blocks (an unclosed last block counts)."""
    calls = [_tool_call(match.group(1).strip()) for match in _TOOL_CALL.finditer(text)]
    content = _TOOL_CALL.sub("", text).strip() if calls else text
    return Message(role="assistant", content=content or (None if calls else ""), tool_calls=calls)


def _tool_call(raw: str) -> ToolCall:
    """One call; when it is not a JSON object with a name, its raw text becomes the arguments, so running it
    fails as a tool error the model is told about."""
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        found = _CALL_NAME.search(raw)
        return ToolCall(id=call_id, name=found.group(1) if found else "", arguments=raw)
    arguments = value.get("arguments", {})
    raw_arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=call_id, name=value["name"], arguments=raw_arguments)


def _special_id(tokenizer: Any, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int) or found == getattr(tokenizer, "unk_token_id", None):
        raise UsageError(f"the tokenizer has no {token!r} token: its chat template is not ChatML")
    return found


# --- the renderers package -------------------------------------------------------------------------------
class LibraryRenderer:
    """A renderer of the `renderers` package behind our protocol (its messages and tools are OpenAI dicts)."""

    def __init__(self, renderer: Any, tokenizer: Any) -> None:
        self.renderer = renderer
        self.tokenizer = tokenizer

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.renderer.get_stop_token_ids())

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *,
               add_generation_prompt: bool = True) -> list[int]:
        return list(self.renderer.render_ids([m.to_openai() for m in messages], tools=_tool_dicts(tools),
                                             add_generation_prompt=add_generation_prompt))

    def bridge(self, prompt_ids: list[int], completion_ids: list[int], new_messages: Sequence[Message],
               tools: Sequence[ToolSpec] = ()) -> list[int] | None:
        """The package's bridge; None also when its result does not start with the previous ids unchanged."""
        if not prompt_ids or not completion_ids or not new_messages:
            return None
        bridged = self.renderer.bridge_to_next_turn(prompt_ids, completion_ids, [m.to_openai() for m in new_messages],
                                                    tools=_tool_dicts(tools))
        if bridged is None:
            return None
        ids = list(bridged.token_ids)
        previous = len(prompt_ids) + len(completion_ids)
        return ids if ids[:previous] == [*prompt_ids, *completion_ids] else None

    def parse(self, completion_ids: list[int], *, stop: str | None = None) -> Message:
        """The package's parse; a stop string is cut from the content it parsed (its parser reads ids)."""
        parsed = self.renderer.parse_response(list(completion_ids))
        calls = [ToolCall(id=call.id or f"call_{uuid.uuid4().hex[:12]}", name=call.name or "",
                          arguments=_raw_arguments(call)) for call in parsed.tool_calls]
        content = _cut(parsed.content, stop) if parsed.content else parsed.content
        return Message(role="assistant", content=content or (None if calls else ""), tool_calls=calls,
                       reasoning_content=parsed.reasoning_content)

    def completion_ids(self, message: Message) -> list[int]:
        """The assistant turn's tokens in a full render, after the generation prompt."""
        opener = [{"role": "user", "content": "."}]
        before = self.renderer.render_ids(opener, add_generation_prompt=True)
        after = self.renderer.render_ids([*opener, message.to_openai()])
        return list(after[len(before):])

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))


def _tool_dicts(tools: Sequence[ToolSpec]) -> list[dict[str, Any]] | None:
    return [t.to_openai()["function"] for t in tools] or None


def _raw_arguments(call: Any) -> str:
    """A parsed call's arguments as JSON text; a call the package could not parse keeps its raw text, so
    running it fails as a tool error the model is told about (as `ChatMLRenderer` does)."""
    if isinstance(call.arguments, str):
        return call.arguments
    if call.arguments is None:
        return "{}" if str(getattr(call, "status", "ok")) == "ok" else str(call.raw)
    return json.dumps(call.arguments, ensure_ascii=False)


# --- choosing one ----------------------------------------------------------------------------------------
def renderer_for(tokenizer: Any, name: str = "auto", images: ImageTokens | None = None) -> Renderer:
    """The renderer `name` chooses: `chatml` (ours), a `renderers` package name (`qwen3`, `llama-3`, ...), or
    `auto`: the package's hand-coded renderer when it knows the model by its hub id; else ours for a ChatML
    template; else the package's generic renderer (no bridge: every turn is rendered in full). A local copy or
    fine-tune of a known model is not matched by `auto` (the package matches hub ids only): name its renderer.
    `images` (a VLM's) goes to ours, chosen first for a ChatML template; the package's render text only."""
    from renderers import config_from_name, create_renderer

    if name == "chatml":
        return ChatMLRenderer(tokenizer, default_system=_default_system(tokenizer), images=images)
    if name != "auto":
        try:
            config = config_from_name(name)
        except ValueError as exc:
            raise UsageError(f"renderer {name!r}: {exc} (or `chatml`, `auto`)") from None
        return LibraryRenderer(create_renderer(tokenizer, config), tokenizer)
    if images is not None and "<|im_start|>" in _template(tokenizer):  # the package refuses a VLM it does not know
        return ChatMLRenderer(tokenizer, default_system=_default_system(tokenizer), images=images)
    library = create_renderer(tokenizer)
    if type(library).__name__ != "DefaultRenderer":
        return LibraryRenderer(library, tokenizer)
    if "<|im_start|>" in _template(tokenizer):
        return ChatMLRenderer(tokenizer, default_system=_default_system(tokenizer), images=images)
    return LibraryRenderer(library, tokenizer)


def _template(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "chat_template", None) or "")


def _default_system(tokenizer: Any) -> str | None:
    """The system prompt a ChatML template inserts when the conversation has none."""
    found = _DEFAULT_SYSTEM.search(_template(tokenizer))
    return found.group(1) if found else None


def load_renderer(name_or_path: str, renderer: str = "auto") -> Renderer:
    """The renderer for a Hugging Face model directory or hub id (loads its tokenizer: `load_tokenizer`, and a
    model folder's image processor: `load_image_tokens`); see `renderer_for`."""
    return renderer_for(load_tokenizer(name_or_path), renderer, load_image_tokens(name_or_path))


_tokenizers: dict[str, Any] = {}
"""Each tokenizer this process loaded, or the UsageError saying why it could not, by the name it was asked by."""


def load_tokenizer(name_or_path: str) -> Any:
    """A Hugging Face tokenizer from a model folder, the local cache, or the hub when it answers; asked once per
    process (a failure too: every rollout of a worker then fails at once, not after its own download attempt).
    One that cannot be loaded is a UsageError naming `--model.tokenizer`."""
    if name_or_path not in _tokenizers:
        _tokenizers[name_or_path] = _tokenizer(name_or_path)
    found = _tokenizers[name_or_path]
    if isinstance(found, UsageError):
        raise found
    return found


def _tokenizer(name: str) -> Any:
    """The tokenizer, or the UsageError saying why it cannot be had: the hub is tried only when it answers."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        return UsageError(f"rendering locally needs `transformers` for the tokenizer: {exc}")
    hint = (f"--model.tokenizer {name!r}: cannot load a tokenizer from it ({{}}); name a model folder with its "
            "tokenizer files, or a hub id this machine can download")
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:
        local = exc
    unreachable = _hub_unreachable()
    if unreachable or os.path.isdir(name):
        return UsageError(hint.format(unreachable or _first_line(local)))
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:
        return UsageError(hint.format(_first_line(exc)))


def _hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached from here (offline mode, no route, no name), or None."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "not in the local cache, and HF_HUB_OFFLINE is set"
    host = urlsplit(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
    except OSError as exc:
        return f"not in the local cache, and the hub ({host}) cannot be reached: {exc}"
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
