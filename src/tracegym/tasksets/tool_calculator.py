"""Tool calculator: compute a generated expression by calling add/subtract/multiply/divide tools; reward on the result.

Each task is an expression of `min_ops` to `max_ops` operations over integers 1..`max_operand` (division only
ever by a positive integer, so a generated task never divides by zero; a model that does gets the tool's error
as a tool message and may go on). The answer is the last number in the final reply (thousands commas and an
exponent allowed); the reward `correct` is 1.0 when |answer - value| <= tolerance (0.01 by default, so a result
rounded to two decimals counts), else 0.0. The rollout records `tool_calls` and `tool_errors`; the metric
`used_tools` is 1.0 when the model called any tool.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Self

from pydantic import model_validator

from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import metric, reward
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset, TasksetConfig

SYSTEM = (
    "You are a careful calculator. Use the tools for every arithmetic step, one operation per call, "
    "then reply with the final result as a number."
)
_NUMBER = re.compile(r"(?<![\d.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def subtract(a: float, b: float) -> float:
    """Subtract the second number from the first.

    Args:
        a: The number to subtract from.
        b: The number to subtract.
    """
    return a - b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def divide(a: float, b: float) -> float:
    """Divide the first number by the second; dividing by zero is an error.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


OPS: dict[str, tuple[Callable[[float, float], float], int]] = {
    "+": (add, 1), "-": (subtract, 1), "*": (multiply, 2), "/": (divide, 2),
}
"""Each operator's tool and precedence (higher binds tighter)."""
ATOM = 3


class ToolCalculatorConfig(TasksetConfig):
    """Options of tool-calculator."""

    num_tasks: int = 1000
    """How many expressions to generate."""
    min_ops: int = 2
    """Fewest operations in an expression."""
    max_ops: int = 3
    """Most operations in an expression."""
    max_operand: int = 20
    """Largest operand (operands are integers from 1)."""
    tolerance: float = 0.01
    """Largest absolute error a correct answer may have (0.01: two decimal places are enough)."""

    @model_validator(mode="after")
    def _sane(self) -> Self:
        if not 1 <= self.min_ops <= self.max_ops or self.max_operand < 1 or self.tolerance < 0:
            raise ValueError("need 1 <= min_ops <= max_ops, max_operand >= 1 and tolerance >= 0")
        return self


class CalcData(TaskData):
    """An expression to compute; `answer` is its value."""

    expression: str
    """The expression as shown to the model."""
    tolerance: float
    """Largest absolute error a correct answer may have."""


def combine(left: tuple[str, int], op: str, right: tuple[str, int]) -> str:
    """`left op right` as text, with the parentheses precedence needs (`-` and `/` are left-associative)."""
    prec = OPS[op][1]
    left_text = f"({left[0]})" if left[1] < prec else left[0]
    tight_right = right[1] < prec or (right[1] == prec and op in "-/")
    return f"{left_text} {op} " + (f"({right[0]})" if tight_right else right[0])


def make_row(rng: random.Random, cfg: ToolCalculatorConfig, index: int) -> CalcData:
    """One expression built by applying random operations to a growing sub-expression."""
    value = float(rng.randint(1, cfg.max_operand))
    text, prec = str(int(value)), ATOM
    for _ in range(rng.randint(cfg.min_ops, cfg.max_ops)):
        op, x = rng.choice(list(OPS)), rng.randint(1, cfg.max_operand)
        fn, op_prec = OPS[op]
        if op != "/" and rng.random() < 0.5:  # the operand on the left; never divide by a sub-expression
            text, value = combine((str(x), ATOM), op, (text, prec)), fn(x, value)
        else:
            text, value = combine((text, prec), op, (str(x), ATOM)), fn(value, x)
        prec = op_prec
    return CalcData(
        id=f"tool-calculator-{cfg.seed}-{index}",
        prompt=f"Compute {text} with the calculator tools and give the result.",
        system_prompt=SYSTEM,
        answer=value,
        expression=text,
        tolerance=cfg.tolerance,
    )


def last_number(text: str) -> float | None:
    """The last number in `text`, or None."""
    numbers = _NUMBER.findall(text)
    return float(numbers[-1].replace(",", "")) if numbers else None


class CalculatorTask(Task[CalcData]):
    """One expression, with the four arithmetic tools."""
    tools = (add, subtract, multiply, divide)

    @reward
    def correct(self, trace: Trace) -> float:
        got, want = last_number(trace.last_reply), float(self.data.answer)
        return float(got is not None and abs(got - want) <= self.data.tolerance)

    @metric
    def used_tools(self, trace: Trace) -> float:
        return float(any(m.tool_calls for m in trace.completion))


class ToolCalculator(Taskset[ToolCalculatorConfig]):
    """Arithmetic through tool calls; reward: the final number within tolerance of the value."""

    id = "tool-calculator"
    description = "Compute expressions with add/subtract/multiply/divide tools (reward: final number within 0.01)."
    task_class = CalculatorTask
    row_maker = make_row
