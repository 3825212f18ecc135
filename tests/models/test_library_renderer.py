"""The `renderers` package adapter, against a fake package renderer: bridge checks, parsing, choosing one."""

import json
from dataclasses import dataclass, field

import pytest

from tracegym.core.graph import TokenPrefix
from tracegym.core.messages import assistant, tool, user
from tracegym.core.tool_spec import ToolSpec
from tracegym.models.client import ModelRequest
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import LibraryRenderer, renderer_for
from tracegym.models.token_client import TokenClient

ADD = ToolSpec(name="add", description="Add.", parameters={"type": "object", "properties": {}})
ROLES = {"system": 1, "user": 2, "assistant": 3, "tool": 4}


@dataclass
class Call:
    """Shaped like `renderers.base.ParsedToolCall`."""

    raw: str
    name: str | None = None
    arguments: object = None
    status: str = "ok"
    id: str | None = None


@dataclass
class Parsed:
    """Shaped like `renderers.base.ParsedResponse`."""

    content: str
    reasoning_content: str | None = None
    tool_calls: list[Call] = field(default_factory=list)


@dataclass
class Bridged:
    token_ids: list[int]


class FakePackageRenderer:
    """Duck-typed like a renderer of the `renderers` package: a message is its role id then one id per
    character (its code point); 9 is the generation prompt, 0 the stop token. `bridged` is what its bridge
    answers (default: the previous ids + the new messages), `parsed` what its parser answers."""

    def __init__(self, bridged: object = "extend", parsed: Parsed | None = None) -> None:
        self.bridged, self.parsed = bridged, parsed or Parsed(content="")
        self.calls: list[tuple] = []

    def get_stop_token_ids(self) -> list[int]:
        return [0]

    def render_ids(self, messages, *, tools=None, add_generation_prompt=False) -> list[int]:
        ids = [t for m in messages for t in (ROLES[m["role"]], *map(ord, m.get("content") or ""))]
        return [*ids, 9] if add_generation_prompt else ids

    def bridge_to_next_turn(self, prompt_ids, completion_ids, new_messages, *, tools=None):
        self.calls.append(("bridge", new_messages, tools))
        if self.bridged == "extend":
            return Bridged([*prompt_ids, *completion_ids, *self.render_ids(new_messages, add_generation_prompt=True)])
        return self.bridged

    def parse_response(self, token_ids, *, tools=None, prompt_ids=None) -> Parsed:
        return self.parsed


class Tokenizer:
    def decode(self, ids, skip_special_tokens=False) -> str:
        return "".join(chr(t) for t in ids)


def library(**fake) -> LibraryRenderer:
    return LibraryRenderer(FakePackageRenderer(**fake), Tokenizer())


PROMPT, COMPLETION = [2, 104, 105, 9], [111, 107, 0]


def test_a_bridge_that_extends_the_previous_ids_is_used():
    bridged = library().bridge(PROMPT, COMPLETION, [user("x")])
    assert bridged == [*PROMPT, *COMPLETION, 2, ord("x"), 9]


def test_a_bridge_that_does_not_start_with_the_previous_ids_is_refused():
    rewritten = Bridged([2, 104, 105, 9, 111, 108, 0, 2, ord("x"), 9])  # the completion re-tokenized
    assert library(bridged=rewritten).bridge(PROMPT, COMPLETION, [user("x")]) is None


def test_a_bridge_the_package_refuses_is_refused():
    assert library(bridged=None).bridge(PROMPT, COMPLETION, [user("x")]) is None


def test_the_package_bridge_gets_openai_messages_and_tool_functions():
    renderer = library()
    renderer.bridge(PROMPT, COMPLETION, [tool("3", "call_1")], [ADD])
    [(_, messages, tools)] = renderer.renderer.calls
    assert messages[0]["role"] == "tool" and messages[0]["tool_call_id"] == "call_1"
    assert tools == [ADD.to_openai()["function"]]


def test_a_refused_bridge_makes_the_token_client_render_in_full():
    renderer = library(bridged=Bridged([1, 2, 3]))
    request = ModelRequest(messages=[user("hi"), assistant("ok"), user("x")],
                           prefix=TokenPrefix([*PROMPT, *COMPLETION], 2, len(COMPLETION)))
    client = TokenClient(Endpoint(base_url="http://unused/v1", model="m"), renderer)
    assert client.prompt_ids(request) == renderer.render(request.messages)
    assert renderer.renderer.calls  # the bridge was asked first


@pytest.mark.parametrize(("arguments", "expected"), [({"a": 1, "b": [2]}, {"a": 1, "b": [2]}),
                                                     ('{"a":1}', {"a": 1})])
def test_tool_call_arguments_as_dict_or_string_become_json_text(arguments, expected):
    call = Call(raw="...", name="add", arguments=arguments, id="call_7")
    [parsed] = library(parsed=Parsed(content="", tool_calls=[call])).parse([1, 0]).tool_calls
    assert parsed.name == "add" and parsed.id == "call_7" and parsed.parsed_arguments() == expected
    if isinstance(arguments, str):
        assert parsed.arguments == arguments  # kept verbatim, as sampled


def test_a_call_the_package_could_not_parse_keeps_its_raw_text():
    call = Call(raw='{"name": "add", "arguments": {"a": 1,, }}', status="invalid_json")
    [parsed] = library(parsed=Parsed(content="", tool_calls=[call])).parse([1, 0]).tool_calls
    assert parsed.arguments == call.raw and parsed.id.startswith("call_")
    with pytest.raises(ValueError):
        json.loads(parsed.arguments)


def test_content_reasoning_and_a_missing_content_map_to_the_message():
    with_calls = library(parsed=Parsed(content="", reasoning_content="hmm", tool_calls=[Call(raw="", name="add")]))
    message = with_calls.parse([1, 0])
    assert message.content is None and message.reasoning_content == "hmm"
    assert library(parsed=Parsed(content="hi")).parse([1, 0]).content == "hi"


def test_a_stop_string_is_cut_from_the_parsed_content():
    assert library(parsed=Parsed(content="one END")).parse([1, 0], stop="END").content == "one "


def test_stop_tokens_come_from_the_package():
    assert library().stop_token_ids == [0]


def test_renderer_for_picks_the_packages_specific_renderer(monkeypatch):
    import renderers

    class Qwen3Renderer(FakePackageRenderer):
        """A specific renderer, as the package returns for a model it knows."""

    monkeypatch.setattr(renderers, "create_renderer", lambda tokenizer: Qwen3Renderer())
    chosen = renderer_for(Tokenizer())
    assert isinstance(chosen, LibraryRenderer) and isinstance(chosen.renderer, Qwen3Renderer)


def test_a_named_package_renderer_is_used_whatever_the_model_is_called(monkeypatch):
    import renderers

    made = []
    monkeypatch.setattr(renderers, "create_renderer", lambda tokenizer, config=None: made.append(config)
                        or FakePackageRenderer())
    chosen = renderer_for(Tokenizer(), "qwen3")
    assert isinstance(chosen, LibraryRenderer) and type(made[0]).__name__ == "Qwen3RendererConfig"


def test_an_unknown_renderer_name_is_a_usage_error_listing_the_known_ones():
    from tracegym.core.errors import UsageError

    with pytest.raises(UsageError, match=r"renderer 'qwen-nine'.*qwen3"):
        renderer_for(Tokenizer(), "qwen-nine")
