"""Samples with images: a trace's image runs reach its samples, and rows share a prompt only with the same images."""

import pytest

import tracegym as tg
from tracegym.core.graph import ImageSpan
from tracegym.core.messages import assistant, user
from tracegym.core.sample import Sample
from tracegym.core.trace import Trace
from tracegym.train.batching import collate, rows
from tracegym.train.samples import trace_samples

RED, BLUE = "a" * 64, "b" * 64


def two_turn_trace() -> Trace:
    """An image in the first prompt (tokens 1..3 of [0, 9, 9, 9, 5]) and one in a later tool result."""
    trace = Trace(task=tg.TaskData(prompt="p"))
    g = trace.graph
    g.add(user("p"))
    g.add_model_turn(assistant("a"), prompt_ids=[0, 9, 9, 9, 5], completion_ids=[6, 7], completion_logprobs=[-1, -2],
                     temperature=1.0, prompt_images=[ImageSpan(offset=1, length=3, sha256=RED)])
    g.add(user("q"))
    g.add_model_turn(assistant("b"), prompt_ids=[0, 9, 9, 9, 5, 6, 7, 8, 9, 9, 9], completion_ids=[4],
                     completion_logprobs=[-3], temperature=1.0,
                     prompt_images=[ImageSpan(offset=1, length=3, sha256=RED), ImageSpan(offset=8, length=3,
                                                                                         sha256=BLUE)])
    return trace


def sample(images: list[ImageSpan], answer: int = 6) -> Sample:
    return Sample(token_ids=[0, 9, 9, 9, 5, answer], loss_mask=[False] * 5 + [True], logprobs=[0.0] * 5 + [-1.0],
                  images=images)


def test_a_sample_carries_its_branch_image_runs_at_their_offsets_in_its_tokens():
    [s] = trace_samples(two_turn_trace())
    assert [(span.offset, span.length, span.sha256) for span in s.images] == [(1, 3, RED), (8, 3, BLUE)]
    assert s.token_ids[8:11] == [9, 9, 9]


def test_samples_with_the_same_prompt_tokens_but_other_images_get_rows_of_their_own():
    red, blue = sample([ImageSpan(offset=1, length=3, sha256=RED)]), sample([ImageSpan(offset=1, length=3,
                                                                                      sha256=BLUE)], answer=7)
    assert len(rows([red, blue], 512)) == 2


def test_samples_with_the_same_prompt_and_image_share_a_row_that_names_the_image_once():
    span = ImageSpan(offset=1, length=3, sha256=RED)
    [row] = rows([sample([span]), sample([span], answer=7)], 512)
    assert collate([row]).images == (RED,)


def test_a_micro_batch_names_its_images_in_the_order_of_their_runs_row_by_row():
    first = Sample(token_ids=[9, 9, 1, 9, 9, 2], loss_mask=[False] * 5 + [True], logprobs=[0.0] * 6,
                   images=[ImageSpan(offset=0, length=2, sha256=RED), ImageSpan(offset=3, length=2, sha256=BLUE)])
    second = sample([ImageSpan(offset=1, length=3, sha256=BLUE)])
    assert collate([first, second]).images == (RED, BLUE, BLUE)


def test_an_image_run_outside_the_sample_tokens_is_refused():
    with pytest.raises(ValueError, match="outside"):
        sample([ImageSpan(offset=4, length=3, sha256=RED)])


def test_an_sft_sample_of_a_teacher_trace_with_an_image_carries_its_run():
    import base64
    import hashlib
    import io

    from PIL import Image

    from tracegym.core.messages import ImagePart, Message, TextPart
    from tracegym.models.embedded_vlm import embedded_vlm_dir
    from tracegym.models.renderer import load_renderer
    from tracegym.train.sft import sft_samples

    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (255, 0, 0)).save(buffer, format="PNG")
    picture = ImagePart(image_url={"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()})
    trace = Trace(task=tg.TaskData(prompt="p"))
    trace.graph.add(Message(role="user", content=[picture, TextPart(text="Which colour?")]))
    trace.graph.add(assistant("falcon"), sampled=True)
    renderer = load_renderer(str(embedded_vlm_dir()))
    [s] = sft_samples(trace, renderer)
    [span] = s.images
    assert span.sha256 == hashlib.sha256(buffer.getvalue()).hexdigest()
    assert s.token_ids[span.offset:span.offset + span.length] == renderer.images.run(buffer.getvalue())
