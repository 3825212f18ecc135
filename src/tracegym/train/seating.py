"""Seating: who plays each seat of a multi-agent environment's episodes in an RL run, and which seats train.

An environment's `play` says it for every episode: by default every seat is the policy and trains (shared-policy
self-play). With `learner = "alternate"` or `"random"` one seat per episode is the learner (the policy, trained)
and the others are opponents (not trained): the current policy, the base model, a past checkpoint of the run
drawn from the opponent pool, or a scripted player (`envs.scripted_seat`: a random legal move, a game's script).
Alternation goes round the seats in seat order across the run's episodes; a random learner is drawn with the
run's seeded generator (checkpointed), so a resumed run seats as the killed one would have. An environment's
`seats` pin single members for good (a judge on another endpoint, a judge that trains, a scripted player); the
learner is never put in a pinned seat. The result of each episode is a plain seat binding (`envs.seats.Seat`) that
crosses the wire.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracegym.core.errors import UsageError
from tracegym.envs.evaluate import members_of, multi_agent_class
from tracegym.envs.multi_agent import is_multi_agent
from tracegym.envs.registry import load_taskset
from tracegym.envs.scripted_seat import load_script
from tracegym.envs.seats import Seat
from tracegym.models.endpoint import Endpoint, HttpUrl

BASE = "base"
"""A seat's `model` that names the run's base model (policy version 0), whatever vLLM serves it as."""


class SeatChoice(BaseModel):
    """One member pinned for the whole run: to another model, and/or to training or not."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str | None = None
    """The model this member plays as: `base` (the run's base model, served by the run's vLLM; needs
    `weight_sync = "lora"`, which leaves the base weights in place), a model name at `base_url`, or unset: the
    policy."""
    base_url: HttpUrl | None = None
    """Another OpenAI-compatible endpoint serving `model` (e.g. a judge elsewhere); unset: the run's vLLM."""
    script: str | None = None
    """A scripted player instead of a model, run by the env server: `random` (a uniformly random legal move), a
    script the game names (kuhn-poker's `nash`, `always-bet`) or `package.module:function`; it never trains."""
    trainable: bool | None = None
    """Train this member's trace (e.g. `true` for a judge playing as the policy); unset: when it plays as the
    policy and its task says it trains (a judge does not)."""

    @property
    def plays_elsewhere(self) -> bool:
        """Whether this member plays as something other than the policy (another model, a script)."""
        return self.model is not None or self.script is not None

    @model_validator(mode="after")
    def _model_for_url(self) -> SeatChoice:
        if self.script is not None and (self.model is not None or self.base_url is not None or self.trainable):
            raise ValueError(f"script {self.script!r} plays the seat by itself: give no model or base_url, and it "
                             "cannot train")
        if self.base_url is not None and self.model is None:
            raise ValueError("a seat with a base_url names the model served there (model = ...)")
        if self.base_url is None and self.model not in (None, BASE):
            raise ValueError(f"model {self.model!r} is not served by the run's vLLM (only {BASE!r} is): give its "
                             "base_url")
        return self


class Play(BaseModel):
    """Who the learner is in each episode and whom it plays against."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    learner: Literal["all", "alternate", "random"] = "all"
    """`all`: every seat is the policy and trains (shared-policy self-play); `alternate`: one seat per episode is
    the learner, taking the seats in turn; `random`: that seat is drawn per episode (seeded)."""
    opponent: Literal["policy", "base", "pool", "script"] = "policy"
    """With a single learner, who sits in the other seats (not trained): `policy` (the current policy), `base`
    (the base model), `pool` (a past checkpoint of this run, drawn per episode) or `script` (the scripted player
    `script` names). `base` and `pool` need `weight_sync = "lora"`: the run's vLLM keeps the base weights and
    serves each checkpoint as an adapter."""
    script: str | None = None
    """With `opponent = "script"`: the scripted player every opponent is, `random` (a uniformly random legal
    move), a script the game names (kuhn-poker's `nash`, `always-bet`) or `package.module:function`."""
    pool_latest: int = Field(default=4, ge=1)
    """The pool: the latest N policies of the run (the base model, then each checkpoint's)."""
    pool_pick: Literal["uniform", "latest"] = "uniform"
    """How an opponent is drawn from the pool: uniformly, or always the latest."""

    @model_validator(mode="after")
    def _opponent_needs_one_learner(self) -> Play:
        if self.learner == "all" and self.opponent != "policy":
            raise ValueError(f"opponent = {self.opponent!r} needs a single learner per episode "
                             "(learner = 'alternate' or 'random')")
        if (self.opponent == "script") != (self.script is not None):
            raise ValueError("opponent = 'script' and script = NAME go together (e.g. script = 'random')")
        return self

    @property
    def needs_base_weights(self) -> bool:
        """Whether an opponent plays as the base model or a past checkpoint (served as LoRA adapters)."""
        return self.opponent in ("base", "pool")


def uses_base_weights(play: Play, seats: Mapping[str, SeatChoice]) -> bool:
    """Whether some seat plays as the base model or a past checkpoint on the run's vLLM."""
    return play.opponent in ("base", "pool") or any(s.model == BASE and s.base_url is None for s in seats.values())


def check_seats(where: str, env_id: str, options: Mapping[str, Any], play: Play,
                seats: Mapping[str, SeatChoice]) -> str | None:
    """At the command line, that an environment's seating fits its taskset, imported here: a UsageError naming
    `where` (`--orchestrator.train.envs.0`) when the taskset is single-agent, lacks a seat `seats` names, or cannot
    play a script named. A taskset that cannot be imported here (its code may live only where its env server runs)
    is a warning, returned: the orchestrator checks the seats against what the env server says it serves, and the
    env server the scripts."""
    if play == Play() and not seats:
        return None
    try:
        taskset = load_taskset(env_id, dict(options))
    except UsageError as exc:
        return (f"{where}: taskset {env_id!r} cannot be loaded here ({exc}); its seats are checked against its env "
                "server when the run starts")
    if not is_multi_agent(taskset):
        raise UsageError(f"{where}: taskset {env_id!r} is single-agent; `play` and `seats` seat the members of a "
                         "multi-agent one")
    members = members_of(taskset)
    unknown = [name for name in seats if name not in members]
    if unknown:
        raise UsageError(f"{where}.seats: seat {unknown[0]!r}: taskset {env_id!r} has no such seat (seats: "
                         f"{', '.join(members)})")
    scripts = {f"{where}.seats.{name}.script": seat.script for name, seat in seats.items() if seat.script}
    if play.script is not None:
        scripts[f"{where}.play.script"] = play.script
    for key, script in scripts.items():
        try:
            load_script(script, multi_agent_class(taskset))
        except UsageError as exc:
            raise UsageError(f"{key}: {exc}") from None
    return None


Opponents = Callable[[random.Random, Play], str]
"""The model name of one opponent drawn from the pool (`OpponentPool.draw`)."""


class Seating:
    """The seat binding of each episode of one environment."""

    def __init__(self, members: Sequence[str], play: Play, pinned: Mapping[str, SeatChoice], endpoint: Endpoint,
                 base_model: str, opponents: Opponents | None = None) -> None:
        """`members` in seat order; `endpoint`: the run's vLLM as requests reach it; `opponents`: draws from the
        opponent pool (needed for `opponent = "pool"`)."""
        self.members, self.play, self.pinned = list(members), play, dict(pinned)
        self.endpoint, self.base_model, self.opponents = endpoint, base_model, opponents
        self.free = [m for m in self.members if m not in self.pinned or not self.pinned[m].plays_elsewhere]
        """Seats the learner may take (not pinned to another model or a script)."""
        if play.learner != "all" and not self.free:
            raise UsageError(f"every seat ({', '.join(self.members)}) is pinned to a model or a script: none is "
                             "left for the learner")
        if play.opponent == "pool" and opponents is None:
            raise UsageError("opponent = 'pool' needs an opponent pool")
        self.turn = 0
        """Episodes seated so far (where alternation goes on)."""

    def next(self, policy: str, rng: random.Random) -> dict[str, Seat]:
        """The binding of the next episode while `policy` names the served policy."""
        if self.play.learner == "all":
            learner = None
        elif self.play.learner == "alternate":
            learner = self.free[self.turn % len(self.free)]
        else:
            learner = rng.choice(self.free)
        self.turn += 1
        return self.binding(learner, policy, rng)

    def binding(self, learner: str | None, policy: str, rng: random.Random) -> dict[str, Seat]:
        """Every member's Seat with the learner in seat `learner` (None: every free seat is the policy)."""
        out = {}
        for member in self.members:
            pin = self.pinned.get(member)
            if pin is not None and pin.script is not None:
                out[member] = Seat(script=pin.script)
            elif pin is not None and pin.model is not None:
                out[member] = Seat(model=self.pinned_endpoint(pin), trainable=pin.trainable)
            elif learner is None or member == learner:
                out[member] = Seat(trainable=pin.trainable if pin else None)
            elif self.play.script is not None:
                out[member] = Seat(script=self.play.script)
            else:
                out[member] = Seat(model=self.at_vllm(self.opponent(policy, rng)), trainable=False)
        return out

    def learner_seats(self) -> list[str | None]:
        """The seats a learner is evaluated in: each free seat in turn (None: self-play, every seat at once)."""
        return [None] if self.play.learner == "all" else list(self.free)

    def opponent(self, policy: str, rng: random.Random) -> str:
        """The model name an opponent plays as in the next episode (one not scripted)."""
        if self.play.opponent == "policy":
            return policy
        if self.play.opponent == "base":
            return self.base_model
        assert self.opponents is not None  # checked at construction
        return self.opponents(rng, self.play)

    def pinned_endpoint(self, pin: SeatChoice) -> Endpoint:
        if pin.base_url is not None:
            return Endpoint(base_url=pin.base_url, model=str(pin.model))
        return self.at_vllm(self.base_model)  # `model = "base"`, the only name the run's vLLM serves for good

    def at_vllm(self, model: str) -> Endpoint:
        return self.endpoint.model_copy(update={"model": model})

    def state_dict(self) -> dict[str, int]:
        return {"turn": self.turn}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.turn = int(state["turn"])
