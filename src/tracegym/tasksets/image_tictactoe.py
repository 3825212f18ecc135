"""Image tic-tac-toe: a game against a seeded random opponent whose board the model sees only as a picture (a
multi-turn image taskset: a TRL `environment_factory`-shaped class whose tool returns a PIL image).

`BoardEnv` is written as TRL expects, with no tracegym import: `reset(**row)` starts a game (the opponent's moves
drawn from the row's `seed`), `show_board()` returns the board as a `size` x `size` PIL image (X in black, O in
red, free cells empty; tracegym sends it to the model as a PNG image part), `mark(cell)` marks a free cell 1-9
(rows from the top, left to right) with X; the opponent answers at once, and only the picture says where. The game
ends on three in a row or a full board (`done`). The reward `outcome` is TRL-shaped: 1.0 win, 0.5 draw, 0.0 loss
or unfinished; the metric `marks` counts the model's marks.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from tracegym.core.trace import Trace
from tracegym.envs.environment import EnvironmentTask, EnvironmentTaskset
from tracegym.envs.taskset import TasksetConfig, config_from, seeded_rows

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
PROMPT = ("We play tic-tac-toe: you are X and move first, your opponent is O. Call show_board() to see the board "
          "(a picture), and mark(cell) to mark a free cell: cells are numbered 1 to 9, rows from the top, left to "
          "right. Your opponent answers each of your marks at once. Three marks in a row, column or diagonal win.")
DESCRIPTION = "Tic-tac-toe against a random opponent, the board seen as a picture (image tool results; reward: win)."


class ImageTicTacToeConfig(TasksetConfig):
    """Options of image-tictactoe."""

    num_tasks: int = Field(default=1000, ge=1)
    """How many games to generate (each its own opponent seed)."""
    size: int = Field(default=96, ge=24, le=768)
    """Width and height of the board's picture in pixels."""


class BoardEnv:
    """A game of tic-tac-toe as X against a random O; the board is shown only as a picture."""

    def __init__(self) -> None:
        self.board: list[str | None] = [None] * 9
        self.opponent = random.Random(0)
        self.size = 96
        self.done = False
        self.winner: str | None = None
        self.marks = 0

    def reset(self, **kwargs: Any) -> str:
        """Start a game: the opponent's moves drawn from the row's `seed`; nothing joins the prompt."""
        self.board = [None] * 9
        self.opponent = random.Random(int(kwargs.get("seed", 0)))
        self.size = int(kwargs.get("size", 96))
        self.done, self.winner, self.marks = False, None, 0
        return ""

    def show_board(self) -> Any:
        """Show the current board as a picture: X in black, O in red."""
        from PIL import Image, ImageDraw  # imported here: only drawing a board needs Pillow

        size, cell = self.size, self.size // 3
        image = Image.new("RGB", (size, size), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        width = max(1, size // 32)
        for k in (1, 2):
            draw.line((k * cell, 0, k * cell, size), fill=(128, 128, 128), width=width)
            draw.line((0, k * cell, size, k * cell), fill=(128, 128, 128), width=width)
        pad = cell // 5
        for i, mark in enumerate(self.board):
            left, top = (i % 3) * cell + pad, (i // 3) * cell + pad
            right, bottom = left + cell - 2 * pad, top + cell - 2 * pad
            if mark == "X":
                draw.line((left, top, right, bottom), fill=(0, 0, 0), width=width * 2)
                draw.line((left, bottom, right, top), fill=(0, 0, 0), width=width * 2)
            elif mark == "O":
                draw.ellipse((left, top, right, bottom), outline=(220, 0, 0), width=width * 2)
        return image

    def mark(self, cell: int) -> str:
        """Mark a free cell with your X; your opponent then marks one with O.

        Args:
            cell: The cell to mark, 1 to 9 (rows from the top, left to right).
        """
        if self.done:
            raise ValueError("the game is over")
        if not 1 <= cell <= 9 or self.board[cell - 1] is not None:
            raise ValueError(f"cell {cell} is not a free cell from 1 to 9")
        self.board[cell - 1] = "X"
        self.marks += 1
        if self._ended("X"):
            return self._said()
        self.board[self.opponent.choice([i for i in range(9) if self.board[i] is None])] = "O"
        if self._ended("O"):
            return self._said()
        return f"You marked cell {cell}; your opponent has marked a cell. Call show_board() to see where."

    def _ended(self, mark: str) -> bool:
        if any(self.board[a] == self.board[b] == self.board[c] == mark for a, b, c in LINES):
            self.winner, self.done = mark, True
        elif all(self.board):
            self.done = True
        return self.done

    def _said(self) -> str:
        return {"X": "You win.", "O": "Your opponent wins."}.get(self.winner or "", "A draw: the board is full.")


def outcome(prompts: list[Any], completions: list[Any], environments: list[BoardEnv], **kwargs: Any) -> list[float]:
    """TRL-shaped reward: 1.0 for each game the model won, 0.5 for a draw, 0.0 for a loss or an unfinished game."""
    return [1.0 if env.winner == "X" else 0.5 if env.done and env.winner is None else 0.0 for env in environments]


def marks(task: EnvironmentTask, trace: Trace) -> float:
    """The model's marks on the board."""
    return float(task.env.marks)


def make_row(rng: random.Random, cfg: ImageTicTacToeConfig, index: int) -> dict[str, Any]:
    """One game: its opponent's seed and the picture's size."""
    return {"id": f"image-tictactoe-{cfg.seed}-{index}", "prompt": PROMPT, "seed": rng.randrange(2**31),
            "size": cfg.size}


def image_tictactoe(config: ImageTicTacToeConfig | Mapping[str, Any] | None = None
                    ) -> EnvironmentTaskset[ImageTicTacToeConfig]:
    """The image-tictactoe taskset: `BoardEnv` run unmodified, scored by the TRL-shaped `outcome`."""
    cfg = config_from(ImageTicTacToeConfig, config, "image-tictactoe")
    taskset = EnvironmentTaskset(BoardEnv, cfg, id="image-tictactoe", description=DESCRIPTION,
                                 data=list(seeded_rows(make_row, cfg, cfg.num_tasks)), rewards=[outcome],
                                 metrics=[marks], max_turns=12)
    taskset.shows_images = True
    return taskset
