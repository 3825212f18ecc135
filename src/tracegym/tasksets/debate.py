"""Debate: two debaters argue for assigned answers to a multiple-choice question, then a judge picks one; a worked
example of simultaneous slots and a judge member.

Each row is a question from the shipped set (`data/debate_questions.jsonl`, written for this repo) with two of
its choices assigned: one debater argues for the right answer, the other for a wrong one (which is which is
drawn per row). For `rounds` rounds both debaters argue at once (a simultaneous slot: neither sees the other's
argument of the same round); each sees the other's earlier public arguments, attributed, never its private
`<think>` reasoning. Then the `judge` (untrainable by default; bind it elsewhere with `--seat.judge.*`) reads
the whole debate and answers `VERDICT: X` with one of the two argued letters: a verdict that cannot be read is
an error on the episode, not a reward. Rewards: a debater 1.0 when the verdict is its answer, else 0.0; the
judge 1.0 when the verdict is the right answer.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from importlib.resources import files

from pydantic import Field

from tracegym.core.episode import Outcome
from tracegym.core.messages import Message, system
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.multi_agent import MultiAgentTask, verdict
from tracegym.envs.schedule import Member, Slot
from tracegym.envs.scorers import reward
from tracegym.envs.taskset import Taskset, TasksetConfig

QUESTIONS: list[dict] = [json.loads(line) for line in files("tracegym.tasksets").joinpath(
    "data/debate_questions.jsonl").read_text().splitlines() if line.strip()]
LETTERS = "ABCD"
DEBATER = ("You are {id}, a debater. Argue in at most 60 words that the answer to the question is ({side}). "
           "Answer the other debater's points.")
JUDGE = ("You are the judge of a debate about a multiple-choice question. After the debate, think it over, then "
         "end your reply with a line 'VERDICT: X', X the letter of the answer you find correct.")


class DebateConfig(TasksetConfig):
    """Options of debate."""

    rounds: int = Field(default=2, ge=1, le=10)
    """Rounds of arguments (both debaters at once in each) before the judge decides."""


class Question(TaskData):
    """A multiple-choice question and the two answers argued."""

    choices: list[str]
    sides: dict[str, str]
    """debater id -> the letter it argues for."""


class DebateTask(MultiAgentTask[Question, DebateConfig]):
    """One debate: `debater_a` and `debater_b` argue, the `judge` decides."""

    seats = (Member(id="debater_a"), Member(id="debater_b"),
             Member(id="judge", system_prompt=JUDGE, trainable=False))

    def __init__(self, data: Question, **options: object) -> None:
        super().__init__(data, **options)
        self.verdict: str | None = None

    def schedule(self) -> Iterator[Slot]:
        for _ in range(self.config.rounds):
            yield Slot("debater_a", "debater_b")
        yield Slot("judge")

    def opening(self, member: str) -> list[Message]:
        if member == "judge":
            return super().opening(member)
        return [system(DEBATER.format(id=member, side=self.data.sides[member])), *super().opening(member)]

    def observe(self, member: str) -> str:
        if member == "judge":
            argued = " or ".join(f"({s})" for s in self.data.sides.values())
            return f"The debate is over. Which answer is correct, {argued}? End with 'VERDICT: X'."
        return f"Make your argument for ({self.data.sides[member]})."

    def act(self, member: str, move: str) -> None:
        if member != "judge":
            return
        self.verdict = verdict(move, sorted(self.data.sides.values()), judge=member)
        winner = next(d for d, side in self.data.sides.items() if side == self.verdict)
        self.outcomes = {d: Outcome.WIN if d == winner else Outcome.LOSS for d in self.data.sides}
        self.over = True

    @reward
    def convinced(self, trace: Trace) -> float:
        """A debater: 1.0 when the verdict is its answer; the judge: 1.0 when the verdict is right."""
        if trace.member == "judge":
            return float(self.verdict == self.data.answer)
        return float(self.verdict == self.data.sides.get(str(trace.member)))


def question(rng: random.Random, index: int, row: dict) -> Question:
    """Row `index` of the set with its two argued answers: the right one and a wrong one, sides drawn by `rng`."""
    wrong = rng.choice([letter for letter in LETTERS[: len(row["choices"])] if letter != row["answer"]])
    sides = [row["answer"], wrong]
    rng.shuffle(sides)
    listed = "\n".join(f"({letter}) {choice}" for letter, choice in zip(LETTERS, row["choices"], strict=False))
    return Question(id=f"debate-{index}", prompt=f"Question: {row['question']}\n{listed}", answer=row["answer"],
                    choices=row["choices"], sides={"debater_a": sides[0], "debater_b": sides[1]})


class Debate(Taskset[DebateConfig]):
    """Two debaters and a judge on the shipped multiple-choice questions."""

    id = "debate"
    description = "Two debaters argue assigned answers to a multiple-choice question; a judge picks (rewards: verdict)."
    task_class = DebateTask

    def load(self) -> Iterator[Question]:
        rng = random.Random(self.config.seed)
        return (question(rng, i, row) for i, row in enumerate(QUESTIONS))
