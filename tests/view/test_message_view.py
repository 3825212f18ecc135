"""Message view: roles, tool calls with arguments, tool results, private runs, images, escaping."""

from detail_traces import SCRIPT, text_of, tree

from tracegym.core.graph import Node
from tracegym.core.messages import ImagePart, Message, TextPart, tool
from tracegym.testing import reply, tool_call
from tracegym.view.message_view import message_html


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


def test_images_are_placeholders_never_fetched():
    parts = [TextPart(text="look"), ImagePart(image_url={"url": "data:image/png;base64,AAAA"}),
             ImagePart(image_url={"url": "http://example.com/x.png"})]
    root = tree(message_html(Message(role="user", content=parts)))
    assert "[image: inline data]" in text_of(root) and "[image: http://example.com/x.png]" in text_of(root)
    assert not list(root.iter("img"))
