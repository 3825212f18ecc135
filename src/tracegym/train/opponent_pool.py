"""Opponent pool: the past policies of an RL run that a seat can draw its opponent from, served by the run's own
vLLM (no extra server): the base model, and each complete checkpoint's LoRA adapter, loaded at run time under
its own name (`pool-step-000010`) on every server of the run (a run with several routes each request to any).

`refresh()` loads the adapters of checkpoints written since the last call (the trainer writes them; the
orchestrator calls this before each step); `draw(rng, play)` names the model of one opponent, from the latest
`play.pool_latest` policies, uniformly or always the newest (`play.pool_pick`). A checkpoint whose adapter did
not reach every server (one was down) stays out of the pool, with a warning, and is loaded again at the next
`refresh()`: a request naming it could otherwise be routed to a server that lacks it. A resumed run starts a fresh
vLLM, so `refresh()` loads every checkpoint again; the draws come from the orchestrator's seeded generator,
which is checkpointed.

>>> pool = OpponentPool(folder, lora_loader(endpoint.servers()), base_model="base")  # doctest: +SKIP
>>> pool.refresh(); pool.draw(random.Random(0), Play(learner="alternate", opponent="pool"))  # doctest: +SKIP
'pool-step-000005'
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from tracegym.core.errors import InfrastructureError, UsageError
from tracegym.train.rl_folder import RLFolder, step_name, step_of
from tracegym.train.seating import Play
from tracegym.train.weight_sync import WeightSync

ADAPTER = "adapter"
"""The folder of a checkpoint holding its LoRA adapter (`Trainer.save`)."""

log = logging.getLogger(__name__)

LoadAdapter = Callable[[Path, str, int], None]
"""Serve the adapter in a directory under a name (the int: its step); an InfrastructureError when some server
could not be reached (it is tried again later)."""


def lora_loader(servers: str | Sequence[str]) -> LoadAdapter:
    """Loads adapters into every vLLM server of `servers` (API roots) through `WeightSync` (one name each, a
    snapshot beside it); an InfrastructureError naming the servers it did not reach."""

    def load(adapter: Path, name: str, step: int) -> None:
        sync = WeightSync(servers, adapter_name=name, keep=1)
        sync.publish(adapter, step)
        if missed := [url for url, version in sync.versions.items() if version != step]:
            raise InfrastructureError(f"adapter {name!r} did not reach {', '.join(missed)}")

    return load


class OpponentPool:
    """The run's past policies, as model names its vLLM serves."""

    def __init__(self, folder: RLFolder, load: LoadAdapter, base_model: str) -> None:
        self.folder, self.load = folder, load
        self.models: list[tuple[int, str]] = [(0, base_model)]
        """(step, served name) of every policy loaded so far, oldest first; step 0 is the base model."""

    def refresh(self) -> list[str]:
        """Load the adapters of checkpoints not loaded yet (a server refusing one is the UsageError it raised; one
        not reached leaves that checkpoint for the next call); returns the names loaded now."""
        known = {step for step, _ in self.models}
        added = []
        for checkpoint in self.folder.checkpoints():
            step = step_of(checkpoint)
            if step in known:
                continue
            adapter = checkpoint / ADAPTER
            if not (adapter / "adapter_config.json").is_file():
                raise UsageError(f"checkpoint {checkpoint} has no LoRA adapter: an opponent pool needs a LoRA run "
                                 "(trainer.lora = true)")
            name = f"pool-{step_name(step)}"
            try:
                self.load(adapter, name, step)
            except InfrastructureError as exc:
                log.warning("opponent %s left out of the pool until a later refresh loads it: %s", name, exc)
                continue
            self.models.append((step, name))
            added.append(name)
        self.models.sort()
        return added

    def candidates(self, latest: int) -> list[str]:
        """The names an opponent is drawn from: the latest `latest` policies."""
        return [name for _, name in self.models[-latest:]]

    def draw(self, rng: random.Random, play: Play) -> str:
        """One opponent's model name, from the latest `play.pool_latest` policies (`play.pool_pick`)."""
        candidates = self.candidates(play.pool_latest)
        return candidates[-1] if play.pool_pick == "latest" else rng.choice(candidates)
