"""Message view: roles, tool calls with arguments, tool results, private runs, images, escaping, long texts cut."""

from detail_traces import SCRIPT, text_of, tree

from tracegym.core.graph import Node
from tracegym.core.messages import ImagePart, Message, TextPart, ToolCall, tool
from tracegym.testing import reply, tool_call
from tracegym.view.message_view import TEXT_CAP, message_html


def test_tool_calls_show_their_arguments_and_tool_results_their_call():
    call = message_html(reply(None, tool_call("add", {"a": 1, "b": SCRIPT}, id="c1"), tool_call("bad", "{oops")))
    root = tree(call)
    args = [text_of(p) for p in root.iter("pre")]
    assert args == ['{\n  "a": 1,\n  "b": "<script>alert(1)</script>"\n}', "{oops"] and "<script" not in call
    result = tree(message_html(tool("3", tool_call_id="c1", name="add")))
    assert "answers c1" in text_of(result) and "add" in text_of(result)


def test_private_runs_and_reasoning_content_are_marked_and_user_text_is_not_parsed():
    said = Message(role="assistant", content="<think>plan</think>bet", reasoning_content="hidden")
    root = tree(message_html(said, Node(id=3, parent=2, message=said, sampled=True, parse_error=True,
                                        policy_version=2)))
    private = [text_of(e) for e in root.iter() if "private" in (e.get("class") or "").split()]
    assert private == ["hidden", "<think>plan</think>"]
    assert "parse error" in text_of(root) and "policy v2" in text_of(root)
    assert next(root.iter("div")).get("data-parse-error") == "1"
    asked = tree(message_html(Message(role="user", content="<think>not private</think>")))
    assert not [e for e in asked.iter() if "private" in (e.get("class") or "").split()]


def test_images_elsewhere_are_placeholders_never_fetched_and_inline_ones_are_shown():
    parts = [TextPart(text="look"), ImagePart(image_url={"url": "data:image/png;base64,AAAA"}),
             ImagePart(image_url={"url": "http://example.com/x.png"}),
             ImagePart(image_url={"url": "data:image/svg+xml;base64,AAAA"})]
    root = tree(message_html(Message(role="user", content=parts)))
    assert "[image: inline data]" in text_of(root) and "[image: http://example.com/x.png]" in text_of(root)
    assert [img.get("src") for img in root.iter("img")] == ["data:image/png;base64,AAAA"]


def left_outs(root) -> list:
    return [d for d in root.iter("div") if d.get("class") == "left-out"]


def test_each_text_past_the_cap_shows_its_head_and_how_much_more_with_a_link_to_the_reader():
    long = "x" * (TEXT_CAP + 5)
    said = Message(role="assistant", content=f"<think>{long}</think>bet", reasoning_content=long,
                   tool_calls=[ToolCall(id="c1", name="run", arguments=long)])
    root = tree(message_html(said, Node(id=4, parent=3, message=said), reader="/trace/2"))
    texts = [text_of(e) for e in root.iter() if e.get("class") in ("private", "call-args")]
    assert texts == [long[:TEXT_CAP], "<think>" + long[: TEXT_CAP - 7], long[:TEXT_CAP]]  # the run still private
    notes = left_outs(root)
    assert [(d.get("data-part"), d.get("data-left-out")) for d in notes] == [
        ("reasoning", "5"), ("text", str(len(said.text) - TEXT_CAP)), ("call-0", "5")]
    assert "5 more characters not shown here (100,005 in all): read them from page 2 of 2" in text_of(notes[0])
    assert [next(d.iter("a")).get("href") for d in notes] == [
        "/trace/2/node/4/text?page=2&part=reasoning", "/trace/2/node/4/text?page=2",
        "/trace/2/node/4/text?page=2&part=call-0"]


def test_a_smaller_cap_cuts_sooner_and_without_a_reader_the_note_has_no_link():
    parts = [TextPart(text="abc"), ImagePart(image_url={"url": "http://example.com/x.png"}), TextPart(text="defg")]
    root = tree(message_html(Message(role="user", content=parts), cap=5))
    assert text_of(next(d for d in root.iter("div") if d.get("class") == "msg-text")) == \
        "abc[image: http://example.com/x.png]de"
    [note] = left_outs(root)
    assert text_of(note) == "… 2 more characters not shown here (7 in all)" and not list(note.iter("a"))
    assert not left_outs(tree(message_html(Message(role="user", content="x" * TEXT_CAP))))
