"""Image input: where a taskset first shows the model an image, so that a model that takes text only is refused
before any rollout (`tracegym eval` exits 2 naming the taskset, the task and the message).

A row whose prompt holds an image is found by looking (the first `ROWS_LOOKED_AT` rows); a taskset whose images
come later (tool results, a referee's board) says so with `Taskset.shows_images`. What cannot be known up front is
refused per rollout by the loop (`models.image_support`).
"""

from __future__ import annotations

import itertools

from tracegym.core.errors import UsageError
from tracegym.envs.taskset import Taskset
from tracegym.models.image_support import images_of, why_text_only

ROWS_LOOKED_AT = 100
"""How many of a taskset's first rows are looked through for an image in their prompt."""


def first_image(taskset: Taskset) -> str | None:
    """Where the taskset first shows an image: `task K, message I (role)` of the first row whose prompt holds one,
    else `task K: its tool results or turns show images` for a taskset that says it shows some; None otherwise."""
    rows = list(itertools.islice(taskset, ROWS_LOOKED_AT))
    for row in rows:
        for i, message in enumerate(row.initial_messages()):
            if images_of(message):
                return f"task {row.key!r}, message {i} ({message.role})"
    if taskset.shows_images:
        first = f"task {rows[0].key!r}" if rows else "its tasks"
        return f"{first}: its tool results or turns show images"
    return None


def check_images_taken(taskset: Taskset, takes: bool | None, model: str) -> None:
    """A UsageError naming the taskset, the task and the message when the taskset shows the model images and the
    model takes text only (`takes` False)."""
    if takes is not False:
        return
    where = first_image(taskset)
    if where is not None:
        raise UsageError(f"taskset {taskset.id!r}, {where}: the taskset shows images and {why_text_only(model)}; "
                         "serve a vision-language model (a model directory whose config.json has a vision_config)")
