"""Image runs on the message graph: each model turn keeps the runs among its new tokens, the branch lists them all."""

from tracegym.core.graph import ImageSpan, MessageGraph
from tracegym.core.messages import assistant, tool, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace

RED = ImageSpan(offset=2, length=3, sha256="red")


def two_turns() -> MessageGraph:
    """A prompt with an image at tokens 2..4, a reply, a tool result with an image at 9..11, a reply."""
    graph = MessageGraph()
    graph.add(user("look"))
    graph.add_model_turn(assistant("call"), [1, 2, 7, 7, 7, 3], [4, 5], [-0.1, -0.2], prompt_images=[RED])
    graph.add(tool("board", tool_call_id="c"))
    blue = ImageSpan(offset=9, length=3, sha256="blue")
    graph.add_model_turn(assistant("done"), [1, 2, 7, 7, 7, 3, 4, 5, 6, 7, 7, 7, 8], [9], [-0.3],
                         prompt_images=[RED, blue])
    return graph


def test_a_model_turn_keeps_the_image_runs_among_its_new_tokens_at_their_offsets_in_them():
    first, second = [n for n in two_turns().nodes if n.sampled]
    assert first.images == [RED]
    assert second.images == [ImageSpan(offset=1, length=3, sha256="blue")]  # its tokens start at prompt token 8


def test_the_branch_lists_every_image_run_at_its_offset_in_the_branch_tokens():
    graph = two_turns()
    tokens = graph.tokens()
    assert [(s.sha256, tokens[s.offset:s.offset + s.length]) for s in graph.image_spans()] == [
        ("red", [7, 7, 7]), ("blue", [7, 7, 7])]


def test_a_fork_puts_every_image_run_on_the_new_branch_first_turn():
    graph = two_turns()
    node = graph.add_model_turn(assistant("again"), [0, 7, 7, 7], [1], [-0.1],
                                prompt_images=[ImageSpan(offset=1, length=3, sha256="red")])
    assert node.images == [ImageSpan(offset=1, length=3, sha256="red")] and len(graph.branches()) == 2


def test_a_text_only_turn_has_no_images_and_a_trace_reads_back_its_runs():
    graph = two_turns()
    graph.add_model_turn(assistant("text"), [*graph.tokens(), 10], [11], [-0.1])
    assert graph.nodes[-1].images == []
    trace = Trace(task=TaskData(prompt="look"), graph=graph)
    assert Trace.model_validate_json(trace.model_dump_json()).graph.image_spans() == graph.image_spans()
