"""Tools: JSON schema from hints and Google docstrings, async tools, concurrent and ordered calls, bad tools."""

import asyncio
import dataclasses
import json
from typing import Literal

import pydantic
import pytest

import tracegym as tg
from tracegym.envs.tools import Tool
from tracegym.testing import ScriptedModel, reply, tool_call


def search(query: str, limit: int, scale: float = 1.0, exact: bool = False, tags: list[str] | None = None,
           mode: Literal["fast", "slow"] = "fast") -> str:
    """Search the notes.

    Looks through every note the user wrote.

    Args:
        query: The text to look for.
        limit: Most results to return,
            counted after ranking.
        scale: How much to boost recent notes.
        exact: Match the whole query only.
        tags (list[str]): Only notes with these tags.
        mode: How hard to look.

    Returns:
        The matching notes, one a line.
    """
    return query


async def shout(text: str) -> str:
    """Say it loudly.

    Args:
        text: What to say.
    """
    await asyncio.sleep(0)
    return text.upper()


def pair(a: int, b: int) -> dict:
    """Make a pair.

    Args:
        a: First.
        b: Second.
    """
    return {"a": a, "b": b}


def spec_of(fn):
    return Tool.from_function(fn).spec


def properties_of(fn):
    return spec_of(fn).parameters["properties"]


# --- schema ----------------------------------------------------------------------------------------------
def test_description_is_the_docstring_before_its_sections():
    assert spec_of(search).description == "Search the notes. Looks through every note the user wrote."


def test_schema_types_follow_the_type_hints():
    props = properties_of(search)
    assert [props[k]["type"] for k in ("query", "limit", "scale", "exact")] == ["string", "integer", "number",
                                                                                 "boolean"]


def test_list_and_optional_hints_become_array_schemas():
    assert {"type": "array", "items": {"type": "string"}} in properties_of(search)["tags"]["anyOf"]


def test_literal_hint_becomes_an_enum():
    assert properties_of(search)["mode"]["enum"] == ["fast", "slow"]


def test_arguments_without_defaults_are_required():
    params = spec_of(search).parameters
    assert params["type"] == "object" and params["required"] == ["query", "limit"]


def test_argument_descriptions_come_from_args_including_continuation_lines():
    props = properties_of(search)
    assert props["query"]["description"] == "The text to look for."
    assert props["limit"]["description"] == "Most results to return, counted after ranking."
    assert props["tags"]["description"] == "Only notes with these tags."


def test_spec_has_the_openai_tools_shape():
    assert spec_of(shout).to_openai() == {
        "type": "function",
        "function": {
            "name": "shout",
            "description": "Say it loudly.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "What to say."}},
                           "required": ["text"], "additionalProperties": False},
        },
    }


async def test_model_is_offered_the_tool_specs():
    model = ScriptedModel(["ok"])
    await tg.evaluate(tg.Taskset(id="t", data=[{"prompt": "p"}], tools=[shout]), model)
    assert [t.name for t in model.requests[0].tools] == ["shout"]


# --- bad tools -------------------------------------------------------------------------------------------
def test_missing_type_hint_is_a_usage_error_at_load():
    def untyped(x) -> int:
        """Do it.

        Args:
            x: The input.
        """
        return x

    with pytest.raises(tg.UsageError, match=r"tool 'untyped': argument 'x' has no type hint"):
        tg.Taskset(id="t", data=[], tools=[untyped])


def test_an_undescribable_hint_after_an_optional_argument_is_named_at_load():
    def connect(retries: int = 1, sock: asyncio.Lock | None = None) -> str:
        """Connect.

        Args:
            retries: How often to try.
            sock: Not something JSON can describe.
        """
        return "ok"

    with pytest.raises(tg.UsageError, match=r"tool 'connect': argument 'sock' has a type hint"):
        tg.Taskset(id="t", data=[], tools=[connect])


def test_missing_docstring_is_a_usage_error_at_load():
    def bare(x: int) -> int:
        return x

    with pytest.raises(tg.UsageError, match=r"tool 'bare' has no docstring"):
        tg.Taskset(id="t", data=[], tools=[bare])


def test_bad_tool_on_a_task_class_fails_when_the_taskset_loads():
    def untyped(x):
        """Do it.

        Args:
            x: The input.
        """

    class BadTask(tg.Task):
        tools = (untyped,)

    class BadTaskset(tg.Taskset):
        id = "bad"
        task_class = BadTask

    with pytest.raises(tg.UsageError, match=r"'x' has no type hint"):
        BadTaskset(data=[])


# --- running tools ---------------------------------------------------------------------------------------
async def run(tools, calls, task_class=None):
    class Tools(tg.Taskset):
        id = "tools"

    if task_class is not None:
        Tools.task_class = task_class
    model = ScriptedModel([reply(None, *calls), "done"])
    [trace] = await tg.evaluate(Tools(data=[{"prompt": "p"}], tools=tools), model, timeouts=tg.Timeouts(tool=5))
    return trace, model


async def test_async_tool_result_becomes_a_tool_message():
    trace, _ = await run([shout], [tool_call("shout", {"text": "hi"}, id="c1")])
    assert (trace.messages[2].role, trace.messages[2].text, trace.messages[2].tool_call_id) == ("tool", "HI", "c1")


async def test_non_string_result_is_sent_as_json():
    trace, _ = await run([pair], [tool_call("pair", {"a": 1, "b": 2})])
    assert trace.messages[2].text == '{"a": 1, "b": 2}'


async def test_several_calls_in_one_turn_run_concurrently():
    ping_seen, pong_seen = asyncio.Event(), asyncio.Event()

    async def ping() -> str:
        """Wait for pong.

        Args:
        """
        ping_seen.set()
        await pong_seen.wait()
        return "ping"

    async def pong() -> str:
        """Wait for ping.

        Args:
        """
        pong_seen.set()
        await ping_seen.wait()
        return "pong"

    trace, _ = await run([ping, pong], [tool_call("ping", id="a"), tool_call("pong", id="b")])
    assert [m.text for m in trace.messages[2:4]] == ["ping", "pong"] and trace.errors == []


async def test_results_are_appended_in_call_order_whatever_finishes_first():
    async def slow() -> str:
        """Slow.

        Args:
        """
        await asyncio.sleep(0.05)
        return "slow"

    trace, _ = await run([slow, shout], [tool_call("slow", id="a"), tool_call("shout", {"text": "x"}, id="b")])
    assert [(m.tool_call_id, m.text) for m in trace.messages[2:4]] == [("a", "slow"), ("b", "X")]


async def test_parallel_tools_false_runs_the_calls_one_after_another():
    events = []

    async def step(n: int) -> str:
        """One step.

        Args:
            n: Which step.
        """
        events.append(f"start {n}")
        await asyncio.sleep(0.01)
        events.append(f"end {n}")
        return str(n)

    class InOrder(tg.Task):
        parallel_tools = False

    await run([step], [tool_call("step", {"n": 1}), tool_call("step", {"n": 2})], task_class=InOrder)
    assert events == ["start 1", "end 1", "start 2", "end 2"]


async def test_unknown_tool_becomes_an_error_message_the_model_sees():
    trace, model = await run([shout], [tool_call("nope", id="c1")])
    seen = model.requests[1].messages[-1]
    assert (seen.role, seen.tool_call_id) == ("tool", "c1")
    assert seen.text == "Error: ValueError: unknown tool 'nope' (tools: shout)"
    assert trace.metrics["tool_errors"] == 1 and trace.errors[0].kind == tg.ErrorKind.TOOL
    assert trace.stop_reason == tg.StopReason.COMPLETED


async def test_wrong_argument_name_becomes_an_error_message():
    trace, _ = await run([shout], [tool_call("shout", {"txt": "hi"})])
    assert trace.messages[2].text.startswith("Error: ToolError") and trace.metrics["tool_errors"] == 1


# --- arguments are validated and converted by their hints; results that are data reach the model as JSON -----
class Point(pydantic.BaseModel):
    x: int
    y: int


@dataclasses.dataclass
class Size:
    width: int
    height: int


def place(p: Point, size: Size, times: int = 1) -> str:
    """Place a box.

    Args:
        p: Where its corner goes.
        size: How big it is.
        times: How many copies.
    """
    return f"{type(p).__name__}({p.x},{p.y}) {type(size).__name__}({size.width}x{size.height}) x{times}"


def origin() -> Point:
    """The origin.

    Args:
    """
    return Point(x=0, y=0)


def corners() -> list[Size]:
    """Two sizes.

    Args:
    """
    return [Size(1, 2), Size(3, 4)]


def nothing() -> None:
    """Nothing.

    Args:
    """


async def test_a_model_and_a_dataclass_argument_arrive_as_instances():
    call = tool_call("place", {"p": {"x": 1, "y": 2}, "size": {"width": 3, "height": 4}})
    trace, _ = await run([place], [call])
    assert trace.messages[2].text == "Point(1,2) Size(3x4) x1" and trace.errors == []


async def test_an_argument_that_does_not_fit_its_hint_is_a_tool_error_naming_it():
    call = tool_call("place", {"p": {"x": 1, "y": 2}, "size": {"width": 3, "height": 4}, "times": "notanint"})
    trace, _ = await run([place], [call])
    text = trace.messages[2].text
    assert text.startswith("Error: ToolError: invalid arguments for tool 'place'") and "times" in text
    assert "valid integer" in text and "notanint" in text
    assert trace.metrics["tool_errors"] == 1 and trace.errors[0].kind == tg.ErrorKind.TOOL


async def test_a_nested_field_error_names_its_path():
    trace, _ = await run([place], [tool_call("place", {"p": {"x": 1}, "size": {"width": 3, "height": 4}})])
    assert "p.y: Field required" in trace.messages[2].text


async def test_a_missing_and_an_unknown_argument_are_named():
    trace, _ = await run([shout], [tool_call("shout", {"txt": "hi"})])
    text = trace.messages[2].text
    assert "text: Field required" in text and "txt: unexpected argument" in text


async def test_a_pydantic_model_result_is_sent_as_json():
    trace, _ = await run([origin], [tool_call("origin")])
    assert json.loads(trace.messages[2].text) == {"x": 0, "y": 0}


async def test_a_list_of_dataclasses_result_is_sent_as_json():
    trace, _ = await run([corners], [tool_call("corners")])
    assert json.loads(trace.messages[2].text) == [{"width": 1, "height": 2}, {"width": 3, "height": 4}]


async def test_a_none_result_is_sent_as_json_null():
    trace, _ = await run([nothing], [tool_call("nothing")])
    assert trace.messages[2].text == "null"


def test_a_model_argument_schema_is_the_one_validation_uses():
    params = spec_of(place).parameters
    point = params["$defs"]["Point"] if "$ref" in params["properties"]["p"] else params["properties"]["p"]
    assert point["properties"].keys() == {"x", "y"} and point["required"] == ["x", "y"]
    assert params["required"] == ["p", "size"] and params["properties"]["times"]["type"] == "integer"
