"""Graph view: each branch, where it forks and why, for each way a message graph forks."""

from detail_traces import BYTES, SCRIPT, proxy_trace, retokenized_trace, text_of, tool_trace, tree

from tracegym.view.graph_view import forks, graph_html
from tracegym.view.message_view import PREVIEW_CAP


def fork_markers(html: str) -> list:
    return [d for d in tree(html).iter("div") if d.get("data-fork")]


def test_a_prompt_that_no_longer_extends_the_tokens_is_a_retokenized_fork_at_the_first_differing_token():
    trace = retokenized_trace()
    [marker] = fork_markers(graph_html(trace))
    assert (marker.get("data-fork"), marker.get("data-from-branch"), marker.get("data-node")) == (
        "retokenized", "0", "3")
    drift = next(i for i, (a, b) in enumerate(zip(*(trace.graph.tokens(leaf) for leaf in trace.graph.leaves()),
                                                  strict=False)) if a != b)
    old, new = (trace.graph.tokens(leaf)[drift] for leaf in trace.graph.leaves())
    assert f"differ from token {drift} on: id {old} before, id {new} now" in text_of(marker)
    assert (chr(old), chr(new)) == ("f", "F")  # the template capitalised the first reply
    [named] = fork_markers(graph_html(trace, tokenizer=BYTES))
    assert f"id {old} 'f' before, id {new} 'F' now" in text_of(named)


def test_an_agent_programs_rewritten_repeated_and_new_conversations_each_fork_with_their_reason():
    trace = proxy_trace()
    html = graph_html(trace)
    found = [(f.branch, f.kind, f.source, f.shared) for f in forks(trace.graph)]
    assert found == [(1, "rewritten", 0, 2), (2, "resampled", 1, 3), (3, "new-conversation", None, 0)]
    markers = fork_markers(html)
    assert [m.get("data-fork") for m in markers] == ["rewritten", "resampled", "new-conversation"]
    assert "rewritten after its first 2 messages" in text_of(markers[0]) and "«reply 2»" in text_of(markers[0])
    branches = [d for d in tree(html).iter("div") if d.get("class") == "branch"]
    assert [b.get("data-branch") for b in branches] == ["0", "1", "2", "3"]
    assert branches[3].get("data-current") == "1"  # the head's branch
    assert "shares nodes 0 to 1 with an earlier branch" in text_of(branches[1])


def test_message_text_is_escaped_in_snippets_fork_reasons_and_messages():
    html = graph_html(proxy_trace())
    assert "<script" not in html and SCRIPT in text_of(tree(html))


async def test_a_single_branch_has_no_fork_and_each_node_opens_to_its_whole_message():
    trace = await tool_trace()
    root = tree(graph_html(trace, branch_href=lambda k: f"tokens?branch={k}&x=<1>"))
    assert not fork_markers(graph_html(trace))
    nodes = [d for d in root.iter("details")]
    assert [d.get("data-node") for d in nodes] == ["0", "1", "2", "3"]
    call = next(d for d in root.iter("div") if d.get("class") == "call")
    assert "add" in text_of(call) and '"a": 1' in text_of(call)
    [link] = root.iter("a")
    assert link.get("href") == "tokens?branch=0&x=<1>"  # escaped in the source, read back by the parser


async def test_a_nodes_message_is_inlined_only_up_to_the_preview_cap_with_a_link_to_the_reader():
    trace = await tool_trace(last="z" * (PREVIEW_CAP + 3))
    root = tree(graph_html(trace, reader="/trace/1"))
    last = next(d for d in root.iter("details") if d.get("data-node") == str(trace.graph.head))
    text = next(d for d in last.iter("div") if d.get("class") == "msg-text")
    assert len(text_of(text)) == PREVIEW_CAP
    [note] = [d for d in last.iter("div") if d.get("class") == "left-out"]
    assert f"3 more characters not shown here ({PREVIEW_CAP + 3:,} in all)" in text_of(note)
    assert next(note.iter("a")).get("href") == f"/trace/1/node/{trace.graph.head}/text?page=1"
