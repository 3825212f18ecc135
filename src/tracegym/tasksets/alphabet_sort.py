"""Alphabet sort: sort a list of first names, then re-sort it as each turn adds more; reward is the mean turn score.

Turn 1 gives a list of names; after each reply the environment adds `names_per_turn` new names and asks for the
whole list again, `follow_up_turns` times. A reply is read as one name per line (blank lines, list markers such as
`1.` or `-`, and trailing commas or periods are ignored). A turn's score is the LCS ratio between the reply's lines
and the correct sorted list, 2 * LCS / (len(reply) + len(expected)): 1.0 only for the exact list, and it gives
partial credit for every name in correct relative order while charging for missing, extra and misplaced names.
The reward is the mean over all turns (a turn never reached scores 0); the metric `turns_exact` counts the turns
answered exactly. Every turn's expected list is stored on the task row, so scoring needs only the trace.
"""

from __future__ import annotations

import random
import re
from importlib.resources import files
from typing import Any, Self

from pydantic import model_validator

from tracegym.core.messages import Message
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import metric, reward
from tracegym.envs.task import EnvResponse, Task
from tracegym.envs.taskset import Taskset, TasksetConfig
from tracegym.tasksets.reverse_text import lcs_ratio

NAMES: list[str] = files("tracegym.tasksets").joinpath("data/first_names.txt").read_text().split()
SYSTEM = (
    "You sort lists of first names alphabetically. Reply with the sorted names only, one per line, "
    "with no numbering and no other text."
)
_MARKER = re.compile(r"^(?:[-*•]|\d+[.)])\s*")


class AlphabetSortConfig(TasksetConfig):
    """Options of alphabet-sort."""

    num_tasks: int = 1000
    """How many tasks to generate."""
    min_names: int = 4
    """Fewest names in the opening list."""
    max_names: int = 8
    """Most names in the opening list."""
    follow_up_turns: int = 2
    """Turns after the first, each adding names and asking for the whole list sorted again."""
    names_per_turn: int = 2
    """Names added on each follow-up turn."""

    @model_validator(mode="after")
    def _fits_the_name_list(self) -> Self:
        if not 1 <= self.min_names <= self.max_names:
            raise ValueError("need 1 <= min_names <= max_names")
        if self.follow_up_turns < 0 or self.names_per_turn < 1:
            raise ValueError("need follow_up_turns >= 0 and names_per_turn >= 1")
        most = self.max_names + self.follow_up_turns * self.names_per_turn
        if most > len(NAMES):
            raise ValueError(f"a task could need {most} distinct names; only {len(NAMES)} are shipped")
        return self


class SortData(TaskData):
    """A sorting task: the names shown on each turn and the correct reply to each turn."""

    batches: list[list[str]]
    """The names shown on each turn, in the order shown (the first is the opening list)."""
    expected: list[list[str]]
    """The correct reply on each turn: every name shown so far, sorted."""


def reply_lines(text: str) -> list[str]:
    """The names in a reply: one per non-blank line, list markers and trailing `,`/`.` removed."""
    lines = (_MARKER.sub("", line.strip()).rstrip(",.").strip() for line in text.splitlines())
    return [line for line in lines if line]


def follow_up(names: list[str]) -> str:
    """The user message that adds `names` and asks for the whole list again."""
    listed = "\n".join(names)
    return f"Add these names to the list:\n\n{listed}\n\nNow sort the whole list (every name so far) alphabetically."


class SortTask(Task[SortData]):
    """One growing list of names to keep sorted."""

    def __init__(self, data: SortData, **options: Any) -> None:
        super().__init__(data, **options)
        if options.get("max_turns") is None:
            self.max_turns = len(self.data.expected)  # one model turn per list; the last reply ends the rollout

    async def env_response(self, trace: Trace) -> EnvResponse:
        answered = len(replies(trace))
        if answered >= len(self.data.batches):
            return None
        return follow_up(self.data.batches[answered])

    def gold(self) -> list[str | Message]:
        """Each turn's sorted list."""
        return ["\n".join(names) for names in self.data.expected]

    def answered(self, trace: Trace) -> list[tuple[list[str], list[str]]]:
        """Each reply's names paired with that turn's sorted list (turns not reached are left out)."""
        return list(zip((reply_lines(text) for text in replies(trace)), self.data.expected, strict=False))

    @reward
    def mean_turn_lcs(self, trace: Trace) -> float:
        return sum(lcs_ratio(got, want) for got, want in self.answered(trace)) / len(self.data.expected)

    @metric
    def turns_exact(self, trace: Trace) -> float:
        return sum(got == want for got, want in self.answered(trace))


def replies(trace: Trace) -> list[str]:
    """The text of every assistant turn after the prompt, in order."""
    return [m.text for m in trace.completion if m.role == "assistant"]


def make_row(rng: random.Random, cfg: AlphabetSortConfig, index: int) -> SortData:
    """One task: an opening list and the follow-up batches, all distinct names."""
    first = rng.randint(cfg.min_names, cfg.max_names)
    picked = rng.sample(NAMES, first + cfg.follow_up_turns * cfg.names_per_turn)
    rest, n = picked[first:], cfg.names_per_turn
    batches = [picked[:first], *(rest[k * n : (k + 1) * n] for k in range(cfg.follow_up_turns))]
    expected = [sorted(name for batch in batches[: k + 1] for name in batch) for k in range(len(batches))]
    listed = "\n".join(batches[0])
    return SortData(
        id=f"alphabet-sort-{cfg.seed}-{index}",
        prompt=f"Sort these names alphabetically, one per line:\n\n{listed}",
        system_prompt=SYSTEM,
        answer="\n".join(expected[-1]),
        batches=batches,
        expected=expected,
    )


class AlphabetSort(Taskset[AlphabetSortConfig]):
    """Sort a growing list of names over several turns; reward: mean per-turn LCS ratio with the sorted list."""

    id = "alphabet-sort"
    description = "Sort a list of names, then re-sort it as each turn adds more (reward: mean per-turn LCS ratio)."
    task_class = SortTask
    row_maker = make_row
