"""Propose-arithmetic: a proposer writes an integer arithmetic problem and its answer, code recomputes the answer,
four solvers attempt the problem; a worked example of the proposer-solver pattern (`envs.proposer_solver`).

The proposer is asked (its row: how many numbers, how large, one number it must use) to reply with one line,
`<expression> = <integer>` (the form a 135M model writes unprompted; a leading label such as `Problem:` is
ignored). The verifier (`evaluate`) computes the expression's value by
walking its syntax tree, never by `eval`: only whole numbers up to `MAX_OPERAND`, `+ - *`, unary minus and
parentheses, at most `MAX_OPERATORS` operators and `MAX_LENGTH` characters; anything else (a name, a call, `**`,
`/`, a string, an oversized number) is refused, naming what. A proposal is valid when it parses, the verifier
accepts it, the proposer's answer equals the value, and it is the problem the row asked for (`check_asked`: that
many numbers, each from 1 to the largest, the given one among them; else `off_prompt`). The solvers see
`What is <expression>?` under arithmetic's system prompt and pass when the last integer of their reply is the
value (`tasksets.arithmetic.last_integer`).

`split = "heldout"` gives fixed held-out rows for measuring a run: each row also holds a generated problem (seeded
apart from training, never the prompts' example, distinct from each other) that the solvers attempt in place of
the proposal, so the solvers' held-out score is on the same problems every time while the proposer's validity is
measured on the same held-out prompts. Rewards and metrics: `envs.proposer_solver`. Train it with
`tracegym rl @ configs/rl/propose_arithmetic.toml` (hierarchical advantages: `per_episode = ["solver_*"]`).
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Iterator
from typing import Literal

from pydantic import Field

from tracegym.core.task_data import TaskData
from tracegym.envs.proposer_solver import InvalidProposal, Proposal, ProposerSolverTask, proposer_solver_seats
from tracegym.envs.taskset import Taskset, TasksetConfig
from tracegym.tasksets.arithmetic import SYSTEM as SOLVER_SYSTEM
from tracegym.tasksets.arithmetic import last_integer

MAX_LENGTH = 60
"""Most characters in a proposed expression."""
MAX_OPERATORS = 4
"""Most binary operators in a proposed expression."""
MAX_OPERAND = 1000
"""Largest whole number a proposed expression may hold."""
ALLOWED = frozenset("0123456789+-*() ")
"""The characters a proposed expression may hold."""
EXAMPLE = "3 + 4"
"""The example problem the proposer's system prompt shows (never a held-out problem)."""
PROPOSER_SYSTEM = (
    "You write arithmetic problems for students. Reply with one line: the problem (whole numbers and + - * or "
    f"parentheses), an equals sign, and its value. For example: {EXAMPLE} = 7"
)
HELDOUT_SALT = "propose-arithmetic/heldout"
"""Seeds the held-out rows apart from the training prompts."""
_OPS = (ast.Add, ast.Sub, ast.Mult)


class ProposeArithmeticConfig(TasksetConfig):
    """Options of propose-arithmetic."""

    num_tasks: int = Field(default=64, ge=1)
    """How many rows (proposer prompts; with `split = "heldout"`, held-out rows)."""
    split: Literal["train", "heldout"] = "train"
    """`train`: the solvers attempt the proposal; `heldout`: they attempt the row's fixed problem."""


class ProposerPrompt(TaskData):
    """What the proposer is asked for; a held-out row also holds the fixed problem and its value (`answer`)."""

    numbers: int
    """How many numbers the problem should have."""
    largest: int
    """The largest number it should use."""
    include: int
    """A number it should use."""
    problem: str | None = None
    """A held-out row's fixed problem, which its solvers attempt."""


def evaluate(expression: str) -> int:
    """The value of an integer expression (see the module docstring for what is allowed), computed from its
    syntax tree; InvalidProposal (`refused`) naming what is not allowed."""
    text = expression.strip()
    if len(text) > MAX_LENGTH:
        raise InvalidProposal("refused", f"the expression has {len(text)} characters (at most {MAX_LENGTH})")
    bad = sorted(set(text) - ALLOWED)
    if bad:
        raise InvalidProposal("refused", f"character {bad[0]!r} is not allowed (only digits, + - * ( ) and spaces)")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise InvalidProposal("refused", f"{text!r} is not an expression") from None
    operators = sum(isinstance(node, ast.BinOp) for node in ast.walk(tree))
    if not 1 <= operators <= MAX_OPERATORS:
        raise InvalidProposal("refused", f"the expression has {operators} operators (1 to {MAX_OPERATORS})")
    return _value(tree.body)


def _value(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if node.value > MAX_OPERAND:
            raise InvalidProposal("refused", f"number {node.value} is larger than {MAX_OPERAND}")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, _OPS):
        left, right = _value(node.left), _value(node.right)
        return left + right if isinstance(node.op, ast.Add) else left - right if isinstance(node.op, ast.Sub) \
            else left * right
    what = type(node.op).__name__ if isinstance(node, ast.BinOp | ast.UnaryOp) else type(node).__name__
    raise InvalidProposal("refused", f"{what} is not allowed (only + - * and unary minus on whole numbers)")


def numbers_in(expression: str) -> list[int]:
    """The whole numbers an expression the verifier accepted is written with, in order."""
    return [node.value for node in ast.walk(ast.parse(expression, mode="eval"))
            if isinstance(node, ast.Constant) and type(node.value) is int]


def check_asked(problem: str, row: ProposerPrompt) -> None:
    """InvalidProposal (`off_prompt`) naming how a verified problem is not the one `row` asked for: its count of
    numbers, one outside 1 to `largest`, or the given number missing."""
    used = numbers_in(problem)
    if len(used) != row.numbers:
        raise InvalidProposal("off_prompt", f"{problem} has {len(used)} numbers, not {row.numbers}")
    outside = [n for n in used if not 1 <= n <= row.largest]
    if outside:
        raise InvalidProposal("off_prompt", f"{problem} uses {outside[0]}, outside 1 to {row.largest}")
    if row.include not in used:
        raise InvalidProposal("off_prompt", f"{problem} does not use {row.include}")


def read_proposal(text: str, row: ProposerPrompt | None = None) -> Proposal:
    """The verified proposal in a proposer's reply: the first line with an `=`, `<expression> = <integer>` (a
    leading label such as `Problem:` is ignored), and the value the verifier computed; given the proposer's `row`,
    also the problem it asked for (`check_asked`)."""
    line = next((ln for ln in text.splitlines() if "=" in ln), None)
    if line is None:
        raise InvalidProposal("format", "no line of the form '<problem> = <value>'")
    left, _, right = line.partition("=")
    stated = re.match(r"\s*(-?\d+)\b", right)
    if stated is None:
        raise InvalidProposal("format", f"{right.strip()!r} after '=' is not an integer")
    problem = re.sub(r"^\s*[A-Za-z ]*:", "", left).strip()
    value = evaluate(problem)
    if int(stated.group(1)) != value:
        raise InvalidProposal("wrong_answer", f"'= {stated.group(1)}' but {problem} = {value}")
    if row is not None:
        check_asked(problem, row)
    return Proposal(problem=problem, answer=value)


class ProposeArithmeticTask(ProposerSolverTask[ProposerPrompt, ProposeArithmeticConfig]):
    """One episode: the proposer writes a problem, four solvers attempt it (or a held-out row's fixed one)."""

    seats = proposer_solver_seats(4, proposer_prompt=PROPOSER_SYSTEM, solver_prompt=SOLVER_SYSTEM)

    def verify(self, text: str) -> Proposal:
        return read_proposal(text, self.data)

    def check(self, proposal: Proposal, reply: str) -> bool:
        return last_integer(reply) == proposal.answer

    def fixed_proposal(self) -> Proposal | None:
        problem = self.data.problem
        return Proposal(problem=problem, answer=self.data.answer) if problem is not None else None

    def solver_prompt(self, proposal: Proposal) -> str:
        return f"What is {proposal.problem}?"


def prompt_row(rng: random.Random, index: int, prefix: str) -> ProposerPrompt:
    """A proposer prompt: 2 or 3 numbers, up to 10, 20 or 50, one of them given."""
    numbers, largest = rng.choice((2, 3)), rng.choice((10, 20, 50))
    include = rng.randint(1, largest)
    prompt = (f"Write one problem with {numbers} whole numbers from 1 to {largest}; one of them must be {include}. "
              "Reply with the problem = its value.")
    return ProposerPrompt(id=f"{prefix}-{index}", prompt=prompt, numbers=numbers, largest=largest, include=include)


def fixed_problem(rng: random.Random, row: ProposerPrompt) -> str:
    """A problem as the row asks for: its numbers (the given one among them) joined by random operators."""
    operands = [row.include, *(rng.randint(1, row.largest) for _ in range(row.numbers - 1))]
    rng.shuffle(operands)
    ops = [rng.choice("+-*") for _ in operands[1:]]
    return " ".join([str(operands[0]), *(f"{op} {x}" for op, x in zip(ops, operands[1:], strict=True))])


def heldout_rows(config: ProposeArithmeticConfig) -> Iterator[ProposerPrompt]:
    """`num_tasks` held-out rows: a proposer prompt and a distinct fixed problem (never the example) each."""
    rng, seen = random.Random(f"{HELDOUT_SALT}/{config.seed}"), {EXAMPLE}
    index = 0
    while index < config.num_tasks:
        row = prompt_row(rng, index, f"propose-arithmetic-heldout-{config.seed}")
        problem = fixed_problem(rng, row)
        if problem in seen:
            continue
        seen.add(problem)
        yield row.model_copy(update={"problem": problem, "answer": evaluate(problem)})
        index += 1


class ProposeArithmetic(Taskset[ProposeArithmeticConfig]):
    """A proposer writes arithmetic problems, four solvers attempt them; rewards: learnability, correctness."""

    id = "propose-arithmetic"
    description = ("A proposer writes an arithmetic problem (verified by code), four solvers attempt it (rewards: "
                   "learnability 4p(1-p) / correctness).")
    task_class = ProposeArithmeticTask

    def load(self) -> Iterator[ProposerPrompt]:
        if self.config.split == "heldout":
            return heldout_rows(self.config)
        rng = random.Random(self.config.seed)
        return (prompt_row(rng, i, f"propose-arithmetic-{self.config.seed}") for i in range(self.config.num_tasks))
