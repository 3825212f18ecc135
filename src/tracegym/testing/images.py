"""Image fixtures: small generated PNGs and a finished trace that carries them, for tests of image paths."""

from __future__ import annotations

import io

from tracegym.core.image_ref import data_uri
from tracegym.core.messages import ImagePart, TextPart, assistant, tool, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import RewardScore, StopReason, Trace


def png(colour: tuple[int, int, int] = (255, 0, 0), size: int = 16) -> bytes:
    """A `size` x `size` PNG of one colour (Pillow draws it)."""
    from PIL import Image  # imported here: only tests of images need Pillow

    out = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(out, format="PNG")
    return out.getvalue()


def image_part(data: bytes, mime: str = "image/png") -> ImagePart:
    """An image part holding `data` as a data URI."""
    return ImagePart(image_url={"url": data_uri(mime, data)})


def image_trace(colour: tuple[int, int, int] = (255, 0, 0), *, reply: str = "red", taskset: str = "test",
                rollout_index: int = 0) -> Trace:
    """A finished trace whose task prompt and a tool result carry the same image (a row holds it three times
    inline: in the task row, the prompt's node and the tool's node); reward `reward` 1.0."""
    part = image_part(png(colour))
    prompt = [user([part, TextPart(text="What colour is this?")])]
    trace = Trace(task=TaskData(prompt=prompt, id=f"image-{colour[0]}-{colour[1]}-{colour[2]}"), taskset=taskset,
                  rollout_index=rollout_index, stop_reason=StopReason.COMPLETED)
    for message in prompt:
        trace.graph.add(message)
    trace.prompt_length = 1
    trace.graph.add(assistant("let me look again"), sampled=True)
    trace.graph.add(tool([part], tool_call_id="call_0", name="look"))
    trace.graph.add(assistant(reply), sampled=True)
    trace.rewards["reward"] = RewardScore(score=1.0)
    return trace
