"""Colour codeword: a generated picture of one colour; the model replies with the code word the system prompt maps
that colour to (a single-turn image taskset, after prime-rl's colour-codeword).

Each row's picture (`size` x `size` PNG, in the prompt as a data URI) is a shade of one of `colours` colours with a
darker square of the same hue somewhere on it; its colour, shade and square are drawn from the row's seeded draw.
A picture belongs to one split by a hash of what it shows (`split_of`): rows of `split = "train"` and of
`split = "held-out"` never show the same picture, whatever their seeds. The reward `exact` is 1.0 when the reply,
stripped of spaces, quotes and a final full stop and lower-cased, is the code word, else 0.0.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
from typing import Literal

from pydantic import Field

from tracegym.core.image_ref import data_uri
from tracegym.core.messages import ImagePart, TextPart, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import reward
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset, TasksetConfig

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 215, 40),
           "purple": (140, 60, 180), "orange": (240, 140, 30), "white": (245, 245, 245), "black": (20, 20, 20)}
"""The colours in order, by their base shade (RGB)."""
CODEWORDS = {"red": "falcon", "green": "copper", "blue": "tulip", "yellow": "anchor", "purple": "glacier",
             "orange": "violin", "white": "pepper", "black": "harbor"}
"""Each colour's code word: unrelated to the colour, so only the picture tells which to answer."""
QUESTION = "What is the code word for the colour of this picture?"
_EDGES = re.compile(r"^[\s\"'`*]+|[\s\"'`*.]+$")
HELD_OUT_SHARE = 5
"""One picture in this many (by `split_of`) is in the held-out split; the rest are in the train split."""


class ColourCodewordConfig(TasksetConfig):
    """Options of colour-codeword."""

    num_tasks: int = Field(default=1000, ge=1)
    """How many pictures to generate."""
    colours: int = Field(default=4, ge=2, le=len(COLOURS))
    """How many colours (the first of COLOURS: red, green, blue, yellow, purple, orange, white, black) are used."""
    size: int = Field(default=64, ge=8, le=1024)
    """Width and height of each picture in pixels."""
    jitter: int = Field(default=25, ge=0, le=60)
    """Most each channel of a picture's shade differs from its colour's base shade."""
    split: Literal["train", "held-out"] = "train"
    """Which pictures the rows show: `train` and `held-out` rows never show the same picture (`split_of`)."""


def system_prompt(colours: list[str]) -> str:
    """The rules: each colour's code word, and to reply with the code word only."""
    pairs = ", ".join(f"{colour} = {CODEWORDS[colour]}" for colour in colours)
    return f"Each colour has a code word: {pairs}. Look at the picture and reply with its colour's code word only."


class Picture(TaskData):
    """A row: the picture's colour and how it was drawn (shade, square), beside the prompt that shows it."""

    colour: str
    shade: list[int]
    square: list[int]
    """The darker square's left, top and side, in pixels."""


def split_of(colour: str, shade: list[int], square: list[int]) -> str:
    """The split a picture is in, by a hash of what it shows."""
    digest = hashlib.sha256(f"{colour}:{shade}:{square}".encode()).digest()
    return "held-out" if digest[0] % HELD_OUT_SHARE == 0 else "train"


def picture_png(shade: list[int], square: list[int], size: int) -> bytes:
    """The picture: `shade` all over, with a square of it at two thirds the brightness."""
    from PIL import Image, ImageDraw  # imported here: only generating a picture needs Pillow

    image = Image.new("RGB", (size, size), tuple(shade))
    left, top, side = square
    ImageDraw.Draw(image).rectangle((left, top, left + side - 1, top + side - 1),
                                    fill=tuple(c * 2 // 3 for c in shade))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def make_row(rng: random.Random, cfg: ColourCodewordConfig, index: int) -> Picture:
    """Row `index`: pictures drawn from `rng` until one of the config's split."""
    colours = list(COLOURS)[: cfg.colours]
    while True:
        colour = rng.choice(colours)
        shade = [min(255, max(0, c + rng.randint(-cfg.jitter, cfg.jitter))) for c in COLOURS[colour]]
        side = rng.randint(max(1, cfg.size // 8), max(1, cfg.size // 3))
        square = [rng.randint(0, cfg.size - side), rng.randint(0, cfg.size - side), side]
        if split_of(colour, shade, square) == cfg.split:
            break
    image = ImagePart(image_url={"url": data_uri("image/png", picture_png(shade, square, cfg.size))})
    return Picture(id=f"colour-codeword-{cfg.split}-{cfg.seed}-{index}",
                   prompt=[user([image, TextPart(text=QUESTION)])], system_prompt=system_prompt(colours),
                   answer=CODEWORDS[colour], colour=colour, shade=shade, square=square)


def normalized(reply: str) -> str:
    """A reply as it is compared: stripped of spaces, quotes and a final full stop, lower-cased."""
    return _EDGES.sub("", reply).lower()


class ColourTask(Task[Picture, ColourCodewordConfig]):
    """One picture whose colour's code word is the answer."""

    max_turns = 1

    @reward
    def exact(self, trace: Trace) -> float:
        return float(normalized(trace.last_reply) == self.data.answer)


class ColourCodeword(Taskset[ColourCodewordConfig]):
    """A picture of one colour -> its code word (from the system prompt); reward: exact match."""

    id = "colour-codeword"
    description = "Reply with the code word of a generated picture's colour (an image taskset; reward: exact)."
    task_class = ColourTask
    row_maker = make_row
    shows_images = True
