"""Reverse text: reverse a short generated phrase character by character; reward is the LCS ratio (or, with
`reward = "exact"`, exact reversal only, which an echo of the phrase cannot partly earn); the metric `exact` says
whether the reply was the exact reversal either way. With `split = "train"` or `"held_out"` a seed's phrases come
from one side of a fixed partition of all phrases (by a hash of their words, order ignored), so a run's held-out
tasks are unseen by construction."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import metric, reward
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset, TasksetConfig

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "green",
    "quiet",
    "music",
    "paper",
    "light",
    "window",
    "garden",
    "silver",
    "orange",
    "forest",
    "candle",
    "ocean",
    "winter",
    "yellow",
    "bridge",
    "mountain",
    "pencil",
    "rocket",
    "summer",
    "little",
    "planet",
    "dragon",
    "coffee",
    "travel",
    "basket",
]
SYSTEM = "Reverse the text the user gives you, character by character. Reply with the reversed text only."


def lcs_length(a: Sequence[object], b: Sequence[object]) -> int:
    """Length of the longest common subsequence of two sequences, e.g. strings (O(len(a)*len(b)) time,
    O(len(b)) memory)."""
    row = [0] * (len(b) + 1)
    for ch in a:
        prev_diag = 0
        for j, other in enumerate(b, 1):
            prev_diag, row[j] = row[j], prev_diag + 1 if ch == other else max(row[j], row[j - 1])
    return row[-1]


def lcs_ratio(a: Sequence[object], b: Sequence[object]) -> float:
    """2 * LCS / (len(a) + len(b)): 1.0 for equal sequences, 0.0 when nothing is shared."""
    return 2 * lcs_length(a, b) / (len(a) + len(b)) if a or b else 1.0


class ReverseTextConfig(TasksetConfig):
    """Options of reverse-text."""

    num_tasks: int = 1000
    """How many phrases to generate."""
    min_words: int = 1
    """Fewest words in a phrase."""
    max_words: int = 3
    """Most words in a phrase."""
    reward: Literal["lcs", "exact"] = "lcs"
    """`lcs`: the longest-common-subsequence ratio with the reversal (partial credit; an echo of the phrase earns
    ~0.35 of it); `exact`: 1.0 for the exact reversal, else 0.0."""
    split: Literal["all", "train", "held_out"] = "all"
    """`all`: any phrase; `train` / `held_out`: only phrases on that side of `phrase_split` (the same partition for
    every seed), so training and held-out tasks share no phrase, nor the same words in another order."""
    held_out_percent: int = Field(default=20, ge=1, le=99)
    """The share of word combinations on the `held_out` side, in percent."""


class ReverseTask(Task[TaskData, ReverseTextConfig]):
    """One phrase to reverse."""

    @reward
    def lcs(self, trace: Trace) -> float:
        return lcs_ratio(trace.last_reply.strip(), str(self.data.answer))

    @metric
    def exact(self, trace: Trace) -> float:
        return self.reversed_exactly(trace)

    def reversed_exactly(self, trace: Trace) -> float:
        """1.0 when the reply (stripped) is the exact reversal, else 0.0."""
        return float(trace.last_reply.strip() == str(self.data.answer))


class ExactReverseTask(ReverseTask):
    """One phrase to reverse, rewarded for the exact reversal only (`reward = "exact"`)."""

    lcs = None  # type: ignore[assignment]  # None unregisters the inherited reward (scorers.scorers_of)

    @reward
    def exact(self, trace: Trace) -> float:
        return self.reversed_exactly(trace)


def phrase_split(text: str, held_out_percent: int) -> Literal["train", "held_out"]:
    """Which side of the fixed train/held-out partition a phrase is on: decided by a hash of its words sorted, so
    a phrase and its near-duplicates (the same words in another order) are on the same side, whatever the seed."""
    key = " ".join(sorted(text.split())).encode()
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 100
    return "held_out" if bucket < held_out_percent else "train"


def make_row(rng: random.Random, cfg: ReverseTextConfig, index: int) -> TaskData:
    """One phrase of `min_words` to `max_words` words (on the `split` side, drawn again until it is) and its
    reversal."""
    while True:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(cfg.min_words, cfg.max_words)))
        if cfg.split == "all" or phrase_split(text, cfg.held_out_percent) == cfg.split:
            break
    return TaskData(id=f"reverse-{cfg.seed}-{index}", prompt=text, system_prompt=SYSTEM, answer=text[::-1])


class ReverseText(Taskset[ReverseTextConfig]):
    """Reverse a short phrase; reward: longest-common-subsequence ratio with the exact reversal."""

    id = "reverse-text"
    description = "Reverse a short phrase character by character (reward: LCS ratio)."
    task_class = ReverseTask
    row_maker = make_row

    def task(self, row: Any) -> ReverseTask:
        """A task scored as `reward` says."""
        cls = ExactReverseTask if self.config.reward == "exact" else ReverseTask
        return cls(self.as_data(row), **self._task_options())
