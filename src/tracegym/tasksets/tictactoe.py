"""Tic-tac-toe: two players take turns marking a 3x3 board; a worked example of a multi-agent game with a referee.

`player_x` marks X and moves first, `player_o` marks O. The referee shows each player the board with free
cells numbered 1-9 (`observe`), reads the last digit 1-9 in a reply's public text as its move (`move`; a
missing, out-of-range or taken cell is an invalid move: the player is told why and asked again, and after
`move_retries` retries it forfeits), marks it (`act`), and ends the game on three in a row or a full board. To
vary the games, a row may open with a few random moves already made (`max_opening`). Rewards: `payoff` +1 win,
-1 loss or forfeit, 0 draw; metrics: `won`, `moves`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from pydantic import Field

from tracegym.core.episode import Outcome
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.multi_agent import InvalidMove, MultiAgentTask
from tracegym.envs.schedule import Member, Slot
from tracegym.envs.scorers import metric, reward
from tracegym.envs.taskset import Taskset, TasksetConfig

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
RULES = ("We play tic-tac-toe on a 3x3 board. Players take turns marking a free cell; three marks in a row, "
         "column or diagonal win. Reply with the number (1-9) of the free cell you mark.")
MARKS = {"player_x": "X", "player_o": "O"}


class TicTacToeConfig(TasksetConfig):
    """Options of tictactoe."""

    num_tasks: int = Field(default=1000, ge=1)
    """How many games to generate."""
    max_opening: int = Field(default=2, ge=0, le=4)
    """Most random moves already made when a game starts (each row draws 0 to this many)."""


class Opening(TaskData):
    """A game's start: the cells (0-8) already marked, in play order (X first)."""

    opening: list[int]


class TicTacToeTask(MultiAgentTask[Opening, TicTacToeConfig]):
    """One game of tic-tac-toe between `player_x` and `player_o`."""

    seats = (Member(id="player_x", system_prompt=f"You are player_x and mark X. {RULES}"),
             Member(id="player_o", system_prompt=f"You are player_o and mark O. {RULES}"))
    public_outputs = False  # the referee shows the board; the moves are on it

    def __init__(self, data: Opening, **options: object) -> None:
        super().__init__(data, **options)
        self.board: list[str | None] = [None] * 9
        self.played = 0
        for cell in data.opening:
            self.board[cell] = "XO"[self.played % 2]
            self.played += 1

    def schedule(self) -> Iterator[Slot]:
        while not self.over:
            yield Slot("player_x" if self.played % 2 == 0 else "player_o")

    def observe(self, member: str) -> str:
        rows = [" | ".join(self.board[c] or str(c + 1) for c in range(r, r + 3)) for r in (0, 3, 6)]
        return "Board:\n" + "\n".join(rows) + f"\nYou are {MARKS[member]}. Your move (a free cell number)?"

    def move(self, member: str, text: str) -> int:
        digits = re.findall(r"[1-9]", text)
        if not digits:
            raise InvalidMove("reply with the number (1-9) of a free cell.")
        cell = int(digits[-1]) - 1
        if self.board[cell] is not None:
            raise InvalidMove(f"cell {cell + 1} is taken.")
        return cell

    def legal_moves(self, member: str) -> list[str]:
        """The free cells' numbers (1-9)."""
        return [str(cell + 1) for cell in range(9) if self.board[cell] is None]

    def act(self, member: str, move: int) -> None:
        self.board[move] = MARKS[member]
        self.played += 1
        if any(self.board[a] == self.board[b] == self.board[c] == MARKS[member] for a, b, c in LINES):
            self.win(member)
        elif all(self.board):
            self.outcomes = dict.fromkeys(self.members, Outcome.DRAW)
            self.over = True

    @reward(name="payoff")
    def reward_payoff(self, trace: Trace) -> float:
        """+1 win, -1 loss or forfeit, 0 draw or unfinished."""
        return self.payoff(trace.member)

    @metric
    def won(self, trace: Trace) -> float:
        return float(self.outcomes.get(str(trace.member)) == Outcome.WIN)

    @metric
    def moves(self, trace: Trace) -> float:
        """Marks on the board at the end (the opening's included)."""
        return float(self.played)


def opening(rng: random.Random, cfg: TicTacToeConfig, index: int) -> Opening:
    """A game starting after 0 to `max_opening` random moves (never a finished one: at most 4 are made)."""
    cells = rng.sample(range(9), rng.randint(0, cfg.max_opening))
    return Opening(id=f"tictactoe-{cfg.seed}-{index}", prompt="A new game begins.", opening=cells)


class TicTacToe(Taskset[TicTacToeConfig]):
    """Tic-tac-toe self-play (two seats); reward +1 win, -1 loss or forfeit, 0 draw."""

    id = "tictactoe"
    description = "Two-player tic-tac-toe (cells 1-9); reward +1 win, -1 loss or forfeit, 0 draw."
    task_class = TicTacToeTask
    row_maker = opening
