"""Arithmetic: an endless stream of generated integer expressions; reward is an exact match on the final number.

Each task is `num_ops` operations (`+`, `-`, `*`, usual precedence, no parentheses) over operands of 1 to
`max_digits` digits (or a `difficulty` preset of both), seeded by `seed`; the stream never ends, so bound it with
`head(n)` (or `num_tasks` in an eval). The reply's answer is the last integer in it: an optional minus sign (not
one between two digits, so `7-3` reads as 3), digits with optional thousands commas (`1,234`), and a fraction of
zeros is allowed (`12.0`); `12.5` is no integer and scores 0. The reward `exact` is 1.0 when that integer equals
the value, else 0.0; the metric `has_number` says whether the reply held a number at all.
"""

from __future__ import annotations

import random
import re
from typing import Any, Literal

from pydantic import model_validator

from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import metric, reward
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset, TasksetConfig

OPS = ("+", "-", "*")
SYSTEM = "Compute the value of the expression. End your reply with the final answer as a single integer."
_NUMBER = re.compile(r"(?<![\d.])-?\d+(?:,\d{3})*(?:\.\d+)?")


DIFFICULTY = {"easy": (1, 1), "medium": (2, 2), "hard": (3, 3)}
"""(max_digits, num_ops) of each difficulty preset."""


class ArithmeticConfig(TasksetConfig):
    """Options of arithmetic."""

    max_digits: int = 2
    """Most digits in an operand (each operand has 1 to this many)."""
    num_ops: int = 2
    """Operations in each expression."""
    difficulty: Literal["easy", "medium", "hard"] | None = None
    """A preset of `max_digits` and `num_ops`: easy 1 and 1, medium 2 and 2, hard 3 and 3 (either option given
    as well wins over the preset)."""

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("difficulty") in DIFFICULTY:
            digits, ops = DIFFICULTY[data["difficulty"]]
            data = {"max_digits": digits, "num_ops": ops, **data}
        return data


def value_of(operands: list[int], ops: list[str]) -> int:
    """The value of `a op b op c ...` with `*` binding tighter than `+` and `-`."""
    terms, signs = [operands[0]], [1]
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def last_integer(text: str) -> int | None:
    """The last integer in `text` (see the module docstring for what counts), or None."""
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    whole, _, fraction = numbers[-1].replace(",", "").partition(".")
    return None if fraction.strip("0") else int(whole)


class ExpressionData(TaskData):
    """An expression to evaluate; `answer` is its integer value."""

    expression: str
    """The expression as shown to the model."""


def make_row(rng: random.Random, cfg: ArithmeticConfig, index: int) -> ExpressionData:
    """One expression and its value."""
    operands = [rng.randint(0, 10 ** rng.randint(1, cfg.max_digits) - 1) for _ in range(cfg.num_ops + 1)]
    ops = [rng.choice(OPS) for _ in range(cfg.num_ops)]
    text = " ".join([str(operands[0]), *(f"{op} {x}" for op, x in zip(ops, operands[1:], strict=True))])
    return ExpressionData(id=f"arithmetic-{cfg.seed}-{index}", prompt=f"What is {text}?", system_prompt=SYSTEM,
                          answer=value_of(operands, ops), expression=text)


class ArithmeticTask(Task[ExpressionData]):
    """One expression to evaluate."""

    @reward
    def exact(self, trace: Trace) -> float:
        return float(last_integer(trace.last_reply) == self.data.answer)

    @metric
    def has_number(self, trace: Trace) -> float:
        return float(_NUMBER.search(trace.last_reply) is not None)


class Arithmetic(Taskset[ArithmeticConfig]):
    """Endless integer expressions; reward: exact match of the last integer in the reply."""

    id = "arithmetic"
    description = "Evaluate generated integer expressions, an endless stream (reward: exact final integer)."
    task_class = ArithmeticTask
    infinite = True
    row_maker = make_row
