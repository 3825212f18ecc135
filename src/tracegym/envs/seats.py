"""Seats: which model each member of an episode plays as, and whether its trace trains, as plain data.

By default every member is the run's policy (shared-policy self-play) and trains as its `Member.trainable`
says. A `Seat` pins a member to another model (an `Endpoint`, which crosses the wire; in process also a live
client) and then, unless it says otherwise, that member does not train; or to a scripted player (`script`: a
random legal move, a game's named script, a function; `envs.scripted_seat`), which never trains. A binding naming
a member the task does not have is a UsageError naming it, before any episode runs.

>>> Seat(trainable=False).trainable
False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, model_validator

from tracegym.core.errors import UsageError
from tracegym.envs.schedule import Member
from tracegym.models.client import ModelClient
from tracegym.models.endpoint import Endpoint, HttpUrl


class Seat(BaseModel):
    """One member's binding: its model (None: the run's policy) or its script, and whether it trains (None: the
    default)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)
    model: Endpoint | ModelClient | None = None
    """Where this member's turns go: an Endpoint (plain data) or, in process, a live model client."""
    script: str | None = None
    """A scripted player instead of a model: `random` (a random legal move), a script the game names
    (`MultiAgentTask.scripts`, e.g. kuhn-poker's `nash`) or `package.module:function` (`envs.scripted_seat`)."""
    trainable: bool | None = None
    """Whether its trace is trained on; None: when it plays as the policy and its Member is trainable."""

    @model_validator(mode="after")
    def _script_alone(self) -> Seat:
        if self.script is not None and self.model is not None:
            raise ValueError(f"a seat plays either a model or script {self.script!r}, not both")
        if self.script is not None and self.trainable:
            raise ValueError(f"script {self.script!r} samples no tokens: a scripted seat cannot train")
        return self

    def trains(self, member: Member) -> bool:
        """Whether `member`, bound by this seat, trains."""
        if self.script is not None:
            return False
        return self.trainable if self.trainable is not None else member.trainable and self.model is None


Seats = Mapping[str, Seat]
"""A binding: member id -> Seat; members it leaves out play as the policy."""


def bind(members: Sequence[Member], seats: Seats | None, owner: str) -> dict[str, Seat]:
    """Every member's Seat, in seat order; a UsageError naming a seat that `owner` (a taskset id) has not."""
    given = dict(seats or {})
    ids = [m.id for m in members]
    for name in given:
        if name not in ids:
            raise UsageError(f"seat override for {name!r}: taskset {owner!r} has no such seat "
                             f"(seats: {', '.join(ids) or 'none: it is single-agent'})")
    return {m: given.get(m, Seat()) for m in ids}


class SeatChoice(BaseModel):
    """A seat's binding as a command's options: `--seat.ID.model NAME`, `--seat.ID.base-url URL`,
    `--seat.ID.script NAME`, `--seat.ID.trainable`; what it leaves unset is the policy's (a model name alone:
    another model, e.g. a LoRA adapter, of the policy's own server; its API key is read from the policy's
    variable)."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())
    model: str | None = None
    """The model name this seat plays as; unset: the policy's."""
    base_url: HttpUrl | None = None
    """The endpoint serving it (e.g. `http://host:8000/v1`); unset: the policy's."""
    script: str | None = None
    """A scripted player instead of a model: `random` (a random legal move), a script the game names (e.g.
    kuhn-poker's `nash`, `always-bet`) or `package.module:function`."""
    trainable: bool | None = None
    """Whether its trace trains; unset: only when it plays as the policy."""

    @model_validator(mode="after")
    def _script_alone(self) -> SeatChoice:
        if self.script is not None and (self.model is not None or self.base_url is not None or self.trainable):
            raise ValueError(f"script {self.script!r} plays the seat by itself: give no model or base_url, and it "
                             "cannot train")
        return self

    def seat(self, policy: Endpoint) -> Seat:
        """This choice as a Seat, completed from the policy's endpoint."""
        if self.script is not None:
            return Seat(script=self.script, trainable=self.trainable)
        changes = {k: v for k, v in (("model", self.model), ("base_url", self.base_url)) if v is not None}
        if not changes or changes == {"model": policy.model}:
            return Seat(trainable=self.trainable)
        return Seat(model=policy.model_copy(update=changes), trainable=self.trainable)
