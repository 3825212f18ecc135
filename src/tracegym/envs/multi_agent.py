"""Multi-agent task: the base class of a task several members play in one episode (a game, a debate, a judge).

Subclass `MultiAgentTask` as you would `Task`: list the members in `seats`, say who acts when in `schedule()`
(default: `rounds` rounds of turns in seat order), and give the referee's rules as hooks: `observe` (what a
member is told before it acts), `move` (read a reply's public text into a move; raise `InvalidMove` to have the
member try again, at most `move_retries` times, then it forfeits), `act` (apply the committed move) and
`settle` (after the last slot, e.g. read the judge's verdict). Rewards and metrics are ordinary `@reward` /
`@metric` methods, scored once per member on that member's own trace (`trace.member` says whose). Its taskset
is an ordinary `Taskset` with `task_class` set to it. See `tasksets/kuhn_poker.py` for a worked example.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from tracegym.core.episode import Outcome
from tracegym.core.errors import FailureKind, TaskError, UsageError
from tracegym.core.messages import Message, system, user
from tracegym.envs.schedule import Member, Slot, check_members, rounds
from tracegym.envs.task import DataT, Task
from tracegym.envs.taskset import Taskset
from tracegym.envs.taskset_config import ConfigT
from tracegym.envs.view import PRIVATE_TAG

PAYOFF = {Outcome.WIN: 1.0, Outcome.LOSS: -1.0, Outcome.DRAW: 0.0, Outcome.FORFEIT: -1.0}
"""A game's reward per outcome (`MultiAgentTask.payoff`)."""


class InvalidMove(TaskError):
    """A member's move breaks the rules; the message tells it why, and it is asked again (a bounded number of
    times, then it forfeits)."""


class VerdictError(TaskError):
    """A judge's verdict could not be read (missing, or outside the allowed answers): an error on the episode,
    never a reward of 0."""

    failure = FailureKind.JUDGE_ERROR


class MultiAgentTask(Task[DataT, ConfigT]):
    """Behaviour for one episode of a multi-agent task; one instance per episode, so game state lives on it."""

    seats: ClassVar[Sequence[Member]] = ()
    """The members, in seat order (checked when the class is defined: at least one, ids unique)."""
    rounds: ClassVar[int] = 1
    """Rounds of the default schedule (each member in seat order, once a round)."""
    move_retries: ClassVar[int] = 2
    """Invalid moves a member may make in one turn and be asked again; one more forfeits."""
    public_outputs: ClassVar[bool] = True
    """Show each member the others' public output as attributed user messages (a game whose referee narrates
    every move in `observe` turns it off)."""
    private_tag: ClassVar[str] = PRIVATE_TAG
    """The tag whose content is private reasoning, never shown to another member."""
    tool_rounds: ClassVar[int] = 8
    """Model calls with tool calls a member may make in one turn before its reply must be its move."""
    max_turns = 100
    """Most slots an episode runs before it ends with `max_turns`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "seats" in cls.__dict__:
            check_members(cls.__name__, cls.seats)

    def __init__(self, data: DataT, **options: Any) -> None:
        super().__init__(data, **options)
        self.over = False
        """Set when the game is over: the episode ends after the current slot."""
        self.outcomes: dict[str, Outcome] = {}
        """How the game ended for each member (a game sets it; the episode record copies it)."""

    # --- who, when ---------------------------------------------------------------------------------------
    @property
    def members(self) -> list[str]:
        """Member ids in seat order."""
        return [m.id for m in self.seats]

    def member(self, member_id: str) -> Member:
        """The member with this id."""
        for member in self.seats:
            if member.id == member_id:
                return member
        raise UsageError(f"{type(self).__name__} has no member {member_id!r} (members: {', '.join(self.members)})")

    def schedule(self) -> Iterable[Slot]:
        """The slots, drawn one at a time as the episode goes (a generator may look at the game's state)."""
        return rounds(self.members, self.rounds)

    # --- the referee -------------------------------------------------------------------------------------
    def opening(self, member: str) -> list[Message]:
        """The messages `member`'s view starts from: its system prompt (else the row's), then the row's prompt."""
        own = self.member(member).system_prompt or self.data.system_prompt
        prompt = [user(self.data.prompt)] if isinstance(self.data.prompt, str) else list(self.data.prompt)
        return [system(own), *prompt] if own else prompt

    def observe(self, member: str) -> str | None:
        """What the referee tells `member` just before it acts (its cards, the board); None: nothing."""
        return None

    def move(self, member: str, text: str) -> Any:
        """`member`'s move read from the public text of its reply; raise InvalidMove to ask again. It must not
        change the game: in a simultaneous slot nothing is applied until every member has moved."""
        return text

    def act(self, member: str, move: Any) -> None:
        """Apply a committed move to the game (set `over` when it ends the game)."""

    def win(self, winner: str) -> None:
        """End the game: `winner` wins, the others lose."""
        self.outcomes = {m: Outcome.WIN if m == winner else Outcome.LOSS for m in self.members}
        self.over = True

    def payoff(self, member: str | None) -> float:
        """A zero-sum game's reward for `member`: +1 win, -1 loss or forfeit, 0 draw or an unfinished game."""
        outcome = self.outcomes.get(str(member))
        return PAYOFF[outcome] if outcome else 0.0

    def forfeit(self, member: str) -> None:
        """`member` ran out of retries: by default it forfeits, the others win, and the game is over."""
        self.outcomes = {m: Outcome.FORFEIT if m == member else Outcome.WIN for m in self.members}
        self.over = True

    def settle(self) -> None:
        """Decide the episode once its last slot is done (e.g. read the judge's verdict); raising fails the
        episode (no member is scored)."""


def verdict(text: str, allowed: Sequence[str], judge: str = "judge") -> str:
    """The judge's verdict: the last `VERDICT: X` in `text`, X one of `allowed` (case is ignored); a
    VerdictError naming the judge and the allowed answers otherwise."""
    found = re.findall(r"VERDICT:\s*([A-Za-z0-9_-]+)", text, flags=re.IGNORECASE)
    by_case = {a.lower(): a for a in allowed}
    if not found or found[-1].lower() not in by_case:
        said = repr(found[-1]) if found else "no 'VERDICT: X' line"
        raise VerdictError(f"member {judge!r} gave {said}; a verdict must be one of {', '.join(allowed)}")
    return by_case[found[-1].lower()]


def is_multi_agent(taskset: Taskset) -> bool:
    """True when the taskset's tasks are multi-agent (run as episodes, not rollouts)."""
    return issubclass(taskset.task_class, MultiAgentTask)
