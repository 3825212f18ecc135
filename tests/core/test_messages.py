"""Messages: the OpenAI chat shape round-trips (text, image parts, tool calls, tool results); arguments parse."""

import pytest

from tracegym.core.messages import ImagePart, Message, TextPart, ToolCall, assistant, system, tool, user

IMAGE = {"url": "data:image/png;base64,iVBORw0KGgo="}


def round_trip(message: Message) -> Message:
    return Message.from_openai(message.to_openai())


@pytest.mark.parametrize("message", [system("be brief"), user("hi"), assistant("hello")])
def test_text_message_round_trips(message):
    assert round_trip(message) == message


def test_text_message_has_the_openai_shape():
    assert user("hi").to_openai() == {"role": "user", "content": "hi"}


def test_image_parts_round_trip():
    message = user([TextPart(text="what is this?"), ImagePart(image_url=IMAGE)])
    assert round_trip(message) == message


def test_image_parts_have_the_openai_shape():
    data = {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                        {"type": "image_url", "image_url": IMAGE}]}
    assert Message.from_openai(data).to_openai() == data


def test_text_of_a_parts_message_leaves_images_out():
    message = user([TextPart(text="a"), ImagePart(image_url=IMAGE), TextPart(text="b")])
    assert message.text == "ab"


def test_tool_call_round_trips_with_its_raw_arguments():
    raw = '{"b": 2,   "a": [1, 2.50]}'
    message = assistant(None, [ToolCall(id="c1", name="add", arguments=raw)])
    back = round_trip(message)
    assert back == message and back.tool_calls[0].arguments == raw


def test_assistant_tool_call_has_the_openai_shape():
    message = assistant(None, [ToolCall(id="c1", name="add", arguments='{"a":1}')])
    assert message.to_openai() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}],
    }


def test_tool_call_without_an_id_gets_one_by_position():
    data = {"role": "assistant", "tool_calls": [{"function": {"name": "a"}}, {"function": {"name": "b"}}]}
    calls = Message.from_openai(data).tool_calls
    assert [(c.id, c.arguments) for c in calls] == [("call_0", "{}"), ("call_1", "{}")]


def test_tool_message_round_trips():
    message = tool("3", tool_call_id="c1", name="add")
    assert round_trip(message) == message


def test_tool_message_has_the_openai_shape():
    assert tool("3", tool_call_id="c1", name="add").to_openai() == {
        "role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"}


def test_reasoning_is_read_from_a_response():
    message = Message.from_openai({"role": "assistant", "content": "4", "reasoning_content": "2+2"})
    assert message.reasoning_content == "2+2"


def test_parsed_arguments_gives_the_object():
    assert ToolCall(id="c", name="f", arguments='{"a": 1}').parsed_arguments() == {"a": 1}


def test_empty_arguments_parse_as_no_arguments():
    assert ToolCall(id="c", name="f", arguments="").parsed_arguments() == {}


@pytest.mark.parametrize("raw", ["[1, 2]", '"text"', "3", "null"])
def test_parsed_arguments_refuses_json_that_is_not_an_object(raw):
    with pytest.raises(ValueError, match=r"arguments of tool call 'f' must be a JSON object"):
        ToolCall(id="c", name="f", arguments=raw).parsed_arguments()


def test_parsed_arguments_refuses_invalid_json():
    with pytest.raises(ValueError, match=r"arguments of tool call 'f' are not valid JSON"):
        ToolCall(id="c", name="f", arguments="{a: 1").parsed_arguments()


def test_messages_are_immutable():
    with pytest.raises(Exception, match="frozen"):
        user("hi").content = "bye"


def test_a_reply_that_names_its_reasoning_reasoning_keeps_it():
    message = Message.from_openai({"role": "assistant", "content": "4", "reasoning": "2 + 2"})
    assert message.reasoning_content == "2 + 2"


def test_reasoning_content_wins_over_reasoning_when_a_reply_has_both():
    message = Message.from_openai({"role": "assistant", "reasoning_content": "a", "reasoning": "b"})
    assert message.reasoning_content == "a"
