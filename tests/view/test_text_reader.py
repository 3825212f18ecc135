"""Text reader: a message's text, reasoning or tool call arguments in pages of TEXT_CAP characters that join to
the whole text, each one escaped `<pre>`; what a trace lacks is a 404."""

import pytest
from detail_traces import SCRIPT, text_of, tree

from tracegym.core.messages import Message, ToolCall
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.view.message_view import TEXT_CAP
from tracegym.view.row_query import QueryError
from tracegym.view.run_folder_index import RowError
from tracegym.view.text_reader import text_page, text_page_html


def one_message(message: Message) -> Trace:
    trace = Trace(task=TaskData(prompt="p"))
    trace.graph.add(message)
    return trace


@pytest.mark.parametrize("chars", [0, 1, TEXT_CAP, 2 * TEXT_CAP, 2 * TEXT_CAP + 1])
def test_the_pages_join_to_the_whole_text_at_every_boundary(chars):
    text = (SCRIPT * (chars // len(SCRIPT) + 1))[:chars]
    trace = one_message(Message(role="tool", content=text, tool_call_id="c"))
    first = text_page(trace, "0", "text", "1")
    pages = [text_page(trace, "0", "text", str(k)) for k in range(1, first.pages + 1)]
    assert first.pages == max(1, -(-chars // TEXT_CAP)) and "".join(p.text for p in pages) == text
    assert all(len(p.text) <= TEXT_CAP for p in pages)
    for page in pages:
        html = text_page_html(page, reader="/trace/0", where="traces.jsonl line 1", json_url="/api/x")
        [pre] = [p for p in tree(html).iter("pre")]
        assert (text_of(pre) if page.text else "") == page.text and "<script" not in html
        assert f"page {page.page} of {page.pages}" in text_of(tree(html))


def test_reasoning_and_each_tool_calls_arguments_are_texts_of_their_own():
    said = Message(role="assistant", content="hi", reasoning_content="why",
                   tool_calls=[ToolCall(id="a", name="f", arguments='{"x": 1}')])
    trace = one_message(said)
    assert text_page(trace, "0", "reasoning", "1").text == "why"
    page = text_page(trace, "0", "call-0", "1")
    assert page.json()["text"] == '{"x": 1}' and page.parts == ["text", "reasoning", "call-0"]
    html = text_page_html(page, reader="/trace/0", where="w", json_url="/api/x")
    links = [a.get("href") for a in tree(html).iter("a")]
    assert "/trace/0/node/0/text?page=1&part=reasoning" in links and "/trace/0/node/0/text?page=1" in links


@pytest.mark.parametrize(("node", "part", "page", "said"), [
    ("1", "text", "1", "no node '1': its nodes are 0 to 0"), ("-1", "text", "1", "no node '-1'"),
    ("0", "call-0", "1", "node 0 has no text 'call-0': it has text"),
    ("0", "text", "0", "page 0 is out of range"), ("0", "text", "2", "has pages 1 to 1")])
def test_a_node_part_or_page_the_trace_lacks_is_a_404(node, part, page, said):
    with pytest.raises(RowError, match=said) as raised:
        text_page(one_message(Message(role="user", content="x")), node, part, page)
    assert raised.value.status == 404


def test_a_page_that_is_no_number_is_a_bad_query():
    with pytest.raises(QueryError, match="not a page number"):
        text_page(one_message(Message(role="user", content="x")), "0", "text", "1.5")
