"""Proposer-solver task: the base class of an episode in which a proposer member writes a task, code verifies it,
and N solver members attempt it; the proposer is paid for the task's learnability, each solver for its answer.

Subclass `ProposerSolverTask` and give the two pieces only your task knows:

- `verify(text)`: the verifier. Read the proposer's reply into a `Proposal` (what the solvers are shown, and the
  answer *recomputed by code*: never taken from the proposer on trust), or raise `InvalidProposal` with its reason
  (`format`: the reply is not in the asked form; `refused`: the verifier will not run what was proposed, e.g. an
  unsafe or oversized expression; `wrong_answer`: the proposer's own answer is not what code computes;
  `off_prompt`: a right task, but not the one the proposer was asked for — without it a proposer paid for validity
  learns one easy task and writes it whatever it is asked).
- `check(proposal, reply)`: whether a solver's reply answers the proposal.

The episode: the `proposer` acts alone (slot 1), then the solvers (`solver_0` ... `solver_{N-1}`, `seats =
proposer_solver_seats(N)`) act at once (slot 2), each on its own view: its system prompt and the proposed task as
`solver_prompt` renders it. Nobody sees another's output (`public_outputs` is off: the proposer's reply holds the
answer). An invalid proposal ends the episode after slot 1: the solvers are skipped (no model call; they train on
nothing, `no_turns`) and score 0.0. A row may carry a fixed task (`fixed_proposal`: a held-out task): then the
solvers attempt it, not the proposal, whatever the proposer wrote, so a solver's held-out score and the
proposer's validity are both measured on the same fixed rows every time.

Rewards (one `@reward`, `proposer_solver`, read per member):
- a solver: 1.0 when `check` passes, else 0.0 (0.0 too when skipped);
- the proposer: `learnability(p) = 4 p (1 - p)`, p the solvers' pass rate on its proposal. It is the variance of a
  solver's pass/fail reward on that task, scaled to [0, 1] (1 at p = 1/2, 0 at p = 0 or 1): exactly what a
  group-relative advantage can learn from, since a solver group that all pass or all fail carries no signal;
- an invalid proposal: `invalid_reward` (-1.0 by default): below every valid proposal's reward (a valid one that
  every solver passes or fails earns 0.0), so validity pays on its own before learnability can;
- with a fixed task the proposal was not solved: the proposer gets 1.0 when valid, `invalid_reward` if not.
Metrics: `valid` (the proposer: 1.0 valid, 0.0 invalid), `invalid_format`, `invalid_refused`, `invalid_answer`,
`invalid_off_prompt` (the proposer: which reason, 1.0), `pass_rate` (the proposer: its solvers' rate) and
`attempted` (a solver).

Train it with hierarchical advantages: `[orchestrator.advantage] per_episode = ["solver_*"]` groups the solvers
of one episode (one proposed task) together, and the proposer stays grouped per task row, i.e. by its prompt,
across the group's episodes (`train.advantages`). `tasksets/propose_arithmetic.py` is a worked example.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from tracegym.core.messages import Message, system
from tracegym.core.trace import Trace
from tracegym.envs.multi_agent import MultiAgentTask
from tracegym.envs.schedule import Member, Slot
from tracegym.envs.scorers import NotApplicable, metric, reward
from tracegym.envs.task import DataT
from tracegym.envs.taskset_config import ConfigT

PROPOSER = "proposer"
"""The proposer's member id."""
SOLVER_PREFIX = "solver_"
"""Solver member ids are this and an index: `solver_0`, `solver_1`, ..."""
INVALID_REWARD = -1.0
"""The proposer's reward for an invalid proposal, by default."""

Reason = Literal["format", "refused", "wrong_answer", "off_prompt"]


@dataclass(frozen=True)
class Proposal:
    """A verified task: what the solvers are shown, and its answer as code computed it."""

    problem: str
    answer: Any


@dataclass(frozen=True)
class Refusal:
    """Why the verifier refused a proposal: its reason and a line saying what was wrong."""

    reason: Reason
    message: str


class InvalidProposal(Exception):
    """The verifier's refusal of a proposal, with its reason (`format`, `refused`, `wrong_answer`, `off_prompt`)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.refusal = Refusal(reason, message)


def learnability(pass_rate: float) -> float:
    """The proposer's reward for a valid proposal: `4 p (1 - p)`, 1.0 at a pass rate of 1/2, 0.0 at 0 or 1."""
    return 4.0 * pass_rate * (1.0 - pass_rate)


def proposer_solver_seats(solvers: int = 4, proposer_prompt: str = "", solver_prompt: str = "") -> tuple[Member, ...]:
    """The seats: `proposer`, then `solvers` solvers `solver_0` ... (all trainable), with their system prompts."""
    if solvers < 1:
        raise ValueError(f"a proposer-solver task needs at least one solver, got {solvers}")
    return (Member(id=PROPOSER, system_prompt=proposer_prompt),
            *(Member(id=f"{SOLVER_PREFIX}{i}", system_prompt=solver_prompt) for i in range(solvers)))


def labelled(text: str, label: str) -> str | None:
    """The value of the last `LABEL: value` line in `text` (the label's case ignored), or None."""
    found = re.findall(rf"^\s*{re.escape(label)}\s*:\s*(.+?)\s*$", text, flags=re.IGNORECASE | re.MULTILINE)
    return found[-1] if found else None


class ProposerSolverTask(MultiAgentTask[DataT, ConfigT]):
    """One proposer-solver episode; subclass it with `verify` and `check` (and `seats` for another solver count)."""

    seats = proposer_solver_seats()
    public_outputs = False
    invalid_reward: ClassVar[float] = INVALID_REWARD
    """The proposer's reward for an invalid proposal."""

    def __init__(self, data: DataT, **options: Any) -> None:
        super().__init__(data, **options)
        self.proposal: Proposal | None = None
        """The verified proposal (None before the proposer moved, or when it was invalid)."""
        self.invalid: Refusal | None = None
        """Why the proposal was refused, when it was."""
        self.solved: dict[str, bool] = {}
        """Each solver that attempted: whether it passed."""

    # --- what a subclass gives ---------------------------------------------------------------------------
    def verify(self, text: str) -> Proposal:
        """The proposal in the proposer's reply, its answer recomputed by code; raise InvalidProposal if none."""
        raise NotImplementedError(f"{type(self).__name__} must define verify(text)")

    def check(self, proposal: Proposal, reply: str) -> bool:
        """Whether a solver's reply answers `proposal`."""
        raise NotImplementedError(f"{type(self).__name__} must define check(proposal, reply)")

    def fixed_proposal(self) -> Proposal | None:
        """A fixed task the solvers attempt instead of the proposal (a held-out row's); None: the proposal."""
        return None

    def solver_prompt(self, proposal: Proposal) -> str:
        """What a solver is shown of the task it attempts."""
        return proposal.problem

    # --- the episode -------------------------------------------------------------------------------------
    @property
    def solvers(self) -> list[str]:
        """The solvers' member ids, in seat order."""
        return [m for m in self.members if m != PROPOSER]

    @property
    def attempted(self) -> Proposal | None:
        """The task the solvers attempt: the row's fixed one, else the valid proposal (None: they are skipped)."""
        return self.fixed_proposal() or self.proposal

    def schedule(self) -> Iterator[Slot]:
        yield Slot(PROPOSER)
        if self.attempted is not None:
            yield Slot(*self.solvers)

    def opening(self, member: str) -> list[Message]:
        if member == PROPOSER:
            return super().opening(member)
        own = self.member(member).system_prompt
        return [system(own)] if own else []

    def observe(self, member: str) -> str | None:
        task = self.attempted
        return self.solver_prompt(task) if member != PROPOSER and task is not None else None

    def act(self, member: str, move: str) -> None:
        if member == PROPOSER:
            try:
                self.proposal = self.verify(move)
            except InvalidProposal as refused:
                self.invalid = refused.refusal
            return
        task = self.attempted
        assert task is not None  # the solvers act only on a task
        self.solved[member] = bool(self.check(task, move))

    @property
    def pass_rate(self) -> float | None:
        """The solvers' pass rate on the task they attempted (None: none attempted)."""
        return sum(self.solved.values()) / len(self.solved) if self.solved else None

    def proposer_reward(self) -> float:
        """Learnability of a valid proposal its solvers attempted; 1.0 for a valid one they did not (a fixed task
        was theirs); `invalid_reward` for an invalid one."""
        if self.proposal is None:
            return self.invalid_reward
        if self.fixed_proposal() is not None or self.pass_rate is None:
            return 1.0
        return learnability(self.pass_rate)

    @reward
    def proposer_solver(self, trace: Trace) -> float:
        """The proposer: learnability (or `invalid_reward`); a solver: 1.0 when it passed."""
        if trace.member == PROPOSER:
            return self.proposer_reward()
        return float(self.solved.get(str(trace.member), False))

    # --- metrics -----------------------------------------------------------------------------------------
    def _of_proposer(self, trace: Trace) -> None:
        if trace.member != PROPOSER:
            raise NotApplicable

    @metric
    def valid(self, trace: Trace) -> float:
        self._of_proposer(trace)
        return float(self.proposal is not None)

    @metric
    def invalid_format(self, trace: Trace) -> float:
        self._of_proposer(trace)
        return float(self.invalid is not None and self.invalid.reason == "format")

    @metric
    def invalid_refused(self, trace: Trace) -> float:
        self._of_proposer(trace)
        return float(self.invalid is not None and self.invalid.reason == "refused")

    @metric
    def invalid_answer(self, trace: Trace) -> float:
        self._of_proposer(trace)
        return float(self.invalid is not None and self.invalid.reason == "wrong_answer")

    @metric
    def invalid_off_prompt(self, trace: Trace) -> float:
        self._of_proposer(trace)
        return float(self.invalid is not None and self.invalid.reason == "off_prompt")

    @metric(name="pass_rate")
    def pass_rate_metric(self, trace: Trace) -> float:
        self._of_proposer(trace)
        if self.pass_rate is None:
            raise NotApplicable
        return self.pass_rate

    @metric(name="attempted")
    def attempted_metric(self, trace: Trace) -> float:
        if trace.member == PROPOSER:
            raise NotApplicable
        return float(str(trace.member) in self.solved)
