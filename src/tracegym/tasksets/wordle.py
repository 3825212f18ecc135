"""Wordle: guess a hidden five-letter word in six tries, with per-letter feedback from the environment.

Each reply must hold a guess inside `<guess>...</guess>` (the last such tag counts, case is ignored); any five
letters a-z are accepted, in the shipped word list or not. The environment answers with one letter per position,
as real Wordle does: G (right letter, right spot), Y (in the word elsewhere), X (not in the word, or the word
holds fewer of that letter than the guess: greens are matched first, then yellows left to right). A reply with no
tag or not five letters gets a message and still uses up a guess. The stop `solved` ends the game on the right
word; after six guesses it ends with `max_turns`.

Rewards: `won` (weight 0.8) is 1.0 when the last guess is the word; `greens` (weight 0.2) is the share of green
letters in the last valid guess, so a win totals 1.0 and an unsolved game at most 0.16. Metrics: `guesses_used` (replies
made, invalid ones included) and `invalid_guesses`.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from importlib.resources import files

from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import metric, reward, stop
from tracegym.envs.task import EnvResponse, Task
from tracegym.envs.taskset import Taskset, TasksetConfig

WORDS: list[str] = files("tracegym.tasksets").joinpath("data/wordle_words.txt").read_text().split()
SYSTEM = (
    "Let's play Wordle. Guess the hidden five-letter English word in at most 6 guesses. Put each guess inside "
    "<guess>...</guess>, for example <guess>crane</guess>. After each guess you get one letter per position: "
    "G = right letter in the right spot, Y = the letter is in the word but in another spot, X = the letter is not "
    "in the word (or not as many times as you used it)."
)
PROMPT = "I have picked a word. Make your first guess."
_GUESS = re.compile(r"<guess>(.*?)</guess>", re.IGNORECASE | re.DOTALL)
_WORD = re.compile(r"[a-z]{5}")


class WordleConfig(TasksetConfig):
    """Options of wordle."""

    num_tasks: int = 1000
    """How many games to generate (the hidden words are drawn from the shipped list with replacement)."""


def feedback(guess: str, target: str) -> str:
    """Wordle's answer to `guess`: G, Y or X per position; a repeated letter is yellow only as many times as the
    target holds it beyond its greens."""
    result = ["G" if g == t else "X" for g, t in zip(guess, target, strict=True)]
    unmatched = Counter(t for g, t in zip(guess, target, strict=True) if g != t)
    for i, letter in enumerate(guess):
        if result[i] == "X" and unmatched[letter] > 0:
            result[i] = "Y"
            unmatched[letter] -= 1
    return "".join(result)


def parse_guess(text: str) -> str | None:
    """The content of the last `<guess>` tag, stripped and lower-cased; None without a tag."""
    tags = _GUESS.findall(text)
    return tags[-1].strip().lower() if tags else None


def problem_with(guess: str | None) -> str | None:
    """Why a parsed guess is invalid, or None when it is a five-letter word."""
    if guess is None:
        return "No guess found: put your guess inside <guess>...</guess>."
    if not _WORD.fullmatch(guess):
        return f"{guess!r} is not a five-letter word."
    return None


class WordleTask(Task):
    """One game: the hidden word is the row's answer."""

    max_turns = 6

    def gold(self) -> str:
        """The hidden word, guessed first."""
        return f"<guess>{self.data.answer}</guess>"

    def guesses(self, trace: Trace) -> list[str | None]:
        """The parsed guess of every reply so far (None where a reply had no tag)."""
        return [parse_guess(m.text) for m in trace.completion if m.role == "assistant"]

    def valid_guesses(self, trace: Trace) -> list[str]:
        """The guesses that were five-letter words, in order."""
        return [g for g in self.guesses(trace) if g is not None and problem_with(g) is None]

    async def env_response(self, trace: Trace) -> EnvResponse:
        guesses = self.guesses(trace)
        left = self.max_turns - len(guesses)
        problem = problem_with(guesses[-1])
        if problem is not None:
            return f"{problem} That used a guess; {left} left."
        guess, target = str(guesses[-1]), str(self.data.answer)
        marks = " ".join(feedback(guess, target))
        if guess == target:
            return f"{guess.upper()}: {marks}\nSolved!"
        if left <= 0:
            return f"{guess.upper()}: {marks}\nNo guesses left; the word was {target!r}."
        return f"{guess.upper()}: {marks}\n{left} guesses left."

    @stop
    def solved(self, trace: Trace) -> bool:
        return self.guesses(trace)[-1:] == [self.data.answer]

    @reward(weight=0.8)
    def won(self, trace: Trace) -> float:
        return float(self.solved(trace))

    @reward(weight=0.2)
    def greens(self, trace: Trace) -> float:
        valid = self.valid_guesses(trace)
        return feedback(valid[-1], str(self.data.answer)).count("G") / 5 if valid else 0.0

    @metric
    def guesses_used(self, trace: Trace) -> float:
        return len(self.guesses(trace))

    @metric
    def invalid_guesses(self, trace: Trace) -> float:
        return sum(problem_with(g) is not None for g in self.guesses(trace))


def make_row(rng: random.Random, cfg: WordleConfig, index: int) -> TaskData:
    """One game: a hidden word drawn from the shipped list."""
    return TaskData(id=f"wordle-{cfg.seed}-{index}", prompt=PROMPT, system_prompt=SYSTEM, answer=rng.choice(WORDS))


class Wordle(Taskset[WordleConfig]):
    """Wordle against the environment; reward: 0.8 for a win plus 0.2 times the greens of the last guess."""

    id = "wordle"
    description = "Play Wordle: guess a five-letter word in six tries with G/Y/X feedback (reward: win + greens)."
    task_class = WordleTask
    row_maker = make_row
