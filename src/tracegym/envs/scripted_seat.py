"""Scripted seat: a member of a game's episode played by code instead of a model (a seat's `script`).

A script is named on the seat binding as plain data, so it crosses the wire to an env server like an Endpoint:
`random` (a uniformly random legal move: the game must list them, `MultiAgentTask.legal_moves`), a scripted player
the game ships (`MultiAgentTask.scripts`, e.g. kuhn-poker's `nash`), or `package.module:function` (a function
`(task, member, rng) -> reply text`). Each of its turns is answered by a `ScriptedPlayer`, a model client bound to
the episode's task, so the turn goes through the one rollout loop like a model's (the member's trace records each
reply, with no tokens; a scripted seat never trains). Its generator is seeded from the sampling seed, the task and
the episode index, so an evaluation replays the same opponent moves every time.

>>> load_script("random", KuhnPokerTask).__name__  # doctest: +SKIP
'random_move'
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Mapping
from typing import cast

from tracegym.core.errors import UsageError
from tracegym.core.messages import assistant
from tracegym.envs.multi_agent import MultiAgentTask, Script
from tracegym.envs.seats import Seat
from tracegym.models.client import ModelClient, ModelRequest, ModelResponse

RANDOM = "random"
"""The script that plays a uniformly random legal move."""
NAME_PREFIX = "script:"
"""What a scripted member's trace records as its model: `script:<name>`."""


def random_move(task: MultiAgentTask, member: str, rng: random.Random) -> str:
    """A uniformly random legal move of `member` (the game lists them: `legal_moves`)."""
    moves = task.legal_moves(member)
    if not moves:
        raise UsageError(f"{type(task).__name__}.legal_moves({member!r}) listed no move: a 'random' seat needs "
                         "the game to list its legal moves")
    return rng.choice(list(moves))


def load_script(name: str, task_class: type[MultiAgentTask]) -> Script:
    """The script `name` for a game of `task_class`; a UsageError naming it, and what there is, when it has none."""
    if name in task_class.scripts:
        return task_class.scripts[name]
    if name == RANDOM:
        if task_class.legal_moves is MultiAgentTask.legal_moves:
            raise UsageError(f"script 'random': {task_class.__name__} does not list its legal moves "
                             "(MultiAgentTask.legal_moves), so no random move can be drawn")
        return random_move
    if ":" in name:
        return _imported(name)
    known = ", ".join([RANDOM, *task_class.scripts])
    raise UsageError(f"script {name!r}: {task_class.__name__} has no such scripted player (scripts: {known}; or "
                     "give a function as package.module:function)")


def _imported(path: str) -> Script:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"script {path!r}: cannot import {module_name!r} ({exc})") from None
    script = getattr(module, attr, None)
    if not callable(script):
        raise UsageError(f"script {path!r}: {module_name} has no function {attr!r}")
    return cast(Script, script)


def check_scripts(task_class: type[MultiAgentTask], seats: Mapping[str, Seat]) -> None:
    """A UsageError naming the first seat whose script the game cannot play, before any episode runs."""
    for member, seat in seats.items():
        if seat.script is not None:
            try:
                load_script(seat.script, task_class)
            except UsageError as exc:
                raise UsageError(f"seat {member!r}: {exc}") from None


class ScriptedPlayer:
    """A ModelClient that answers a member's turns with its script's reply to the task's state now."""

    def __init__(self, task: MultiAgentTask, member: str, name: str, script: Script, rng: random.Random) -> None:
        self.task, self.member, self.script, self.rng = task, member, script, rng
        self._name = f"{NAME_PREFIX}{name}"

    @property
    def name(self) -> str:
        return self._name

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(assistant(self.script(self.task, self.member, self.rng)), finish_reason="stop")

    async def aclose(self) -> None:
        """Nothing to release."""


def with_scripts(task: MultiAgentTask, clients: Mapping[str, ModelClient], seats: Mapping[str, Seat],
                 seed: int | None, episode_index: int) -> dict[str, ModelClient]:
    """`clients` with each scripted seat's member answered by its ScriptedPlayer on `task`, seeded by (`seed`,
    the task, `episode_index`, the member)."""
    out = dict(clients)
    for member, seat in seats.items():
        if seat.script is not None:
            rng = random.Random(f"{seed or 0}/{task.data.key}/{episode_index}/{member}")
            out[member] = ScriptedPlayer(task, member, seat.script, load_script(seat.script, type(task)), rng)
    return out
