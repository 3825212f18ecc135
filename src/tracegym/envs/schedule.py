"""Schedule: the members (seats) of a multi-agent task and the slots in which they act, one at a time or at once.

A schedule is any iterable of `Slot`s, drawn one at a time as the episode goes (a game yields whoever moves next
until it is over). A slot of one member is a sequential turn; a slot of several is simultaneous: they all act on
the same view of the episode and their actions are committed together, or not at all.

>>> [s.members for s in rounds(["a", "b"], 2)]
[('a',), ('b',), ('a',), ('b',)]
>>> Slot("a", "b").simultaneous
True
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import UsageError


class Member(BaseModel):
    """One seat of a multi-agent task: its id, its own system prompt, and whether it trains when it is bound to
    the run's policy (a judge usually does not)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """The member id: names its trace, its reward and its `--seat.ID.*` options."""
    system_prompt: str = ""
    """This member's system prompt (empty: the task row's)."""
    trainable: bool = True
    """Whether its trace is trained on when it plays as the run's policy (a seat pinned elsewhere never is)."""


class Slot:
    """One step of a schedule: the members acting in it (several: simultaneously, committed atomically)."""

    __slots__ = ("members",)

    def __init__(self, *members: str) -> None:
        if not members or len(set(members)) != len(members):
            raise UsageError(f"a slot names one or more distinct members, got {list(members)}")
        self.members: tuple[str, ...] = members

    @property
    def simultaneous(self) -> bool:
        """True when several members act at once."""
        return len(self.members) > 1

    def __repr__(self) -> str:
        return f"Slot({', '.join(map(repr, self.members))})"


def rounds(members: Sequence[str], count: int) -> Iterator[Slot]:
    """`count` rounds of sequential turns, the members in order each round."""
    for _ in range(count):
        for member in members:
            yield Slot(member)


def together(members: Sequence[str], count: int) -> Iterator[Slot]:
    """`count` simultaneous slots of all `members`."""
    for _ in range(count):
        yield Slot(*members)


def check_members(owner: str, members: Sequence[Member]) -> None:
    """A UsageError naming the first duplicate member id of `owner` (a task class), or when it has none."""
    if not members:
        raise UsageError(f"{owner} has no members: set `seats` to its Members")
    seen: set[str] = set()
    for member in members:
        if member.id in seen:
            raise UsageError(f"{owner}: member id {member.id!r} is given twice; member ids must be unique")
        seen.add(member.id)


def check_slot(slot: Slot, members: Collection[str]) -> None:
    """A UsageError naming a member of `slot` that is not among `members`."""
    for member in slot.members:
        if member not in members:
            raise UsageError(f"the schedule names unknown member {member!r} (members: {', '.join(members)})")
