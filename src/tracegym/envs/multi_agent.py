"""Multi-agent task: the base class of a task several members play in one episode (a game, a debate, a judge).

Subclass `MultiAgentTask` as you would `Task`: list the members in `seats`, say who acts when in `schedule()`
(default: `rounds` rounds of turns in seat order), and give the referee's rules as hooks: `observe` (what a
member is told before it acts), `move` (read a reply's public text into a move; raise `InvalidMove` to have the
member try again, at most `move_retries` times, then it forfeits), `act` (apply the committed move) and
`settle` (after the last slot, e.g. read the judge's verdict; it does not run after a forfeit). A game ends with
`win(member)` (or by setting `outcomes` and `over` itself, e.g. a draw), and `forfeit(member)` ends it for a member
that ran out of retries: its outcomes are final. `payoff(member)` is a member's reward from the outcomes (+1 win,
-1 loss or forfeit, 0 draw or unfinished; override it for a game paid otherwise, e.g. kuhn-poker's chips), so a
`@reward` that returns it is right however the game ended, a forfeit included. Rewards and metrics are ordinary
`@reward` / `@metric` methods, scored once per member on that member's own trace (`trace.member` says whose); a
reward must not read state that a forfeit may have left unset. `legal_moves(member)` lists the replies that are
legal now (a `random` seat draws from them) and `scripts` names scripted players the game ships
(`envs.scripted_seat`). Its taskset is an ordinary `Taskset` with `task_class` set to it. See
`tasksets/kuhn_poker.py` for a worked example.

Keep the game's state on the instance (one per episode) and a slot commits all its moves or none without more
work: when the `act` (or `forfeit`) of one member of a simultaneous slot raises, the moves of that slot applied
before it are undone (the task is put back as `snapshot()` saw it just before the slot: by default a deep copy of
the attributes you set) and the episode ends with the error. An attribute that is not the game's state and cannot
be copied (a client, a lock) goes in `shared_state`; state kept outside the instance needs `snapshot`/`restore`
overridden. A slot of one member takes no snapshot: its `act` should raise before it changes anything.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from tracegym.core.episode import Outcome
from tracegym.core.errors import FailureKind, TaskError, UsageError
from tracegym.core.messages import ContentPart, Message, system, user
from tracegym.envs.schedule import Member, Slot, check_members, rounds
from tracegym.envs.task import DataT, Task
from tracegym.envs.taskset import Taskset
from tracegym.envs.taskset_config import ConfigT
from tracegym.envs.view import PRIVATE_TAG

PAYOFF = {Outcome.WIN: 1.0, Outcome.LOSS: -1.0, Outcome.DRAW: 0.0, Outcome.FORFEIT: -1.0}
"""A game's reward per outcome (`MultiAgentTask.payoff`)."""


Script = Callable[["MultiAgentTask", str, random.Random], str]
"""A scripted player: `script(task, member, rng)` is `member`'s reply now (the text its `move` reads)."""


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
    shared_state: ClassVar[tuple[str, ...]] = ()
    """Attributes that are not the game's state (a client, a sandbox handle, a lock): `snapshot` shares them
    rather than copying them, and `restore` leaves them alone."""
    scripts: ClassVar[Mapping[str, Script]] = {}
    """Scripted players the game ships, by name (a seat's `script`, e.g. kuhn-poker's `nash`); `random` (a uniformly
    random legal move) needs no entry, only `legal_moves`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "seats" in cls.__dict__:
            check_members(cls.__name__, cls.seats)

    def __init__(self, data: DataT, **options: Any) -> None:
        super().__init__(data, **options)
        self._not_state = frozenset(vars(self)) | {"_not_state"}
        """What `Task.__init__` set (the row, config, scorers, tools, sandbox): never part of a snapshot."""
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

    def observe(self, member: str) -> str | list[ContentPart] | None:
        """What the referee tells `member` just before it acts (its cards, the board): text, or content parts (the
        board as a picture: an `ImagePart` is in that member's view only); None: nothing."""
        return None

    def move(self, member: str, text: str) -> Any:
        """`member`'s move read from the public text of its reply; raise InvalidMove to ask again. It must not
        change the game: in a simultaneous slot nothing is applied until every member has moved."""
        return text

    def act(self, member: str, move: Any) -> None:
        """Apply a committed move to the game (set `over` when it ends the game)."""

    def snapshot(self) -> Any:
        """The game's state, taken before the moves of a slot of several members are applied, for `restore` when
        one of them raises. By default a deep copy of every attribute set after `Task.__init__` (`over`,
        `outcomes` and your own), sharing the task's row, config, scorers and tools and `shared_state` (objects
        they reach are shared too); an attribute that cannot be copied is a TaskError naming it. Override both
        methods for state kept elsewhere (a database, a process)."""
        shared = self._not_state.union(self.shared_state)
        memo: dict[int, Any] = {id(self): self}
        memo.update((id(value), value) for name, value in vars(self).items() if name in shared)
        state: dict[str, Any] = {}
        for name, value in vars(self).items():
            if name in shared:
                continue
            try:
                state[name] = copy.deepcopy(value, memo)
            except Exception as exc:  # the author's object: say which, and what to do
                raise TaskError(f"{type(self).__name__}.{name} cannot be copied for a slot's rollback ({exc}): "
                                "name it in `shared_state` if it is not the game's state, or override "
                                "snapshot() and restore()") from exc
        return state

    def restore(self, state: Any) -> None:
        """Put the game back as `snapshot` saw it (attributes set since are removed)."""
        shared = self._not_state.union(self.shared_state)
        for name in [n for n in vars(self) if n not in shared and n not in state]:
            delattr(self, name)
        for name, value in state.items():
            setattr(self, name, value)

    def legal_moves(self, member: str) -> Sequence[str] | None:
        """The replies that are legal moves for `member` now, each as `move` reads it (a `random` seat draws one);
        None: the game cannot list them (a `random` seat is then refused by name)."""
        return None

    def win(self, winner: str) -> None:
        """End the game: `winner` wins, the others lose."""
        self.outcomes = {m: Outcome.WIN if m == winner else Outcome.LOSS for m in self.members}
        self.over = True

    def payoff(self, member: str | None) -> float:
        """`member`'s reward from the game's outcomes (a `@reward` returning it is right however the game ended):
        +1 win, -1 loss or forfeit, 0 draw or an unfinished game. Override it for a game paid otherwise."""
        outcome = self.outcomes.get(str(member))
        return PAYOFF[outcome] if outcome else 0.0

    def forfeit(self, member: str) -> None:
        """`member` ran out of retries: by default it forfeits, the others win, and the game is over; these
        outcomes are final (`settle` does not run after a forfeit)."""
        self.outcomes = {m: Outcome.FORFEIT if m == member else Outcome.WIN for m in self.members}
        self.over = True

    def settle(self) -> None:
        """Decide the episode once its last slot is done (e.g. read the judge's verdict); raising fails the
        episode (no member is scored). It does not run when a member forfeited: the forfeit decided the game."""


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
