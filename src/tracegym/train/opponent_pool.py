"""Opponent pool: the past policies of an RL run that a seat can draw its opponent from, served by the run's own
vLLM (no extra server): the base model, and each complete checkpoint's LoRA adapter, loaded at run time under
its own name (`pool-step-000010`).

`refresh()` loads the adapters of checkpoints written since the last call (the trainer writes them; the
orchestrator calls this before each step); `draw(rng)` names the model of one opponent, from the latest
`latest` policies, uniformly or always the newest. A resumed run starts a fresh vLLM, so `refresh()` loads every
checkpoint again; the draws come from the orchestrator's seeded generator, which is checkpointed.

>>> pool = OpponentPool(folder, LoraLoader(base_url), base_model="base", latest=4)  # doctest: +SKIP
>>> pool.refresh(); pool.draw(random.Random(0))  # doctest: +SKIP
'pool-step-000005'
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from tracegym.core.errors import UsageError
from tracegym.train.rl_folder import RLFolder, step_name, step_of
from tracegym.train.weight_sync import WeightSync

ADAPTER = "adapter"
"""The folder of a checkpoint holding its LoRA adapter (`Trainer.save`)."""

LoadAdapter = Callable[[Path, str, int], None]
"""Serve the adapter in a directory under a name (the int: its step)."""


def lora_loader(base_url: str) -> LoadAdapter:
    """Loads adapters into the vLLM at `base_url` through `WeightSync` (one name each, a snapshot beside it)."""

    def load(adapter: Path, name: str, step: int) -> None:
        WeightSync(base_url, adapter_name=name, keep=1).publish(adapter, step)

    return load


class OpponentPool:
    """The run's past policies, as model names its vLLM serves."""

    def __init__(self, folder: RLFolder, load: LoadAdapter, base_model: str, latest: int = 4,
                 pick: Literal["uniform", "latest"] = "uniform") -> None:
        if latest < 1:
            raise UsageError(f"an opponent pool holds at least 1 policy, got latest = {latest}")
        self.folder, self.load, self.latest, self.pick = folder, load, latest, pick
        self.models: list[tuple[int, str]] = [(0, base_model)]
        """(step, served name) of every policy loaded so far, oldest first; step 0 is the base model."""

    def refresh(self) -> list[str]:
        """Load the adapters of checkpoints not loaded yet; returns their names."""
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
            self.load(adapter, name, step)
            self.models.append((step, name))
            added.append(name)
        return added

    @property
    def candidates(self) -> list[str]:
        """The names an opponent is drawn from: the latest `latest` policies."""
        return [name for _, name in self.models[-self.latest:]]

    def draw(self, rng: random.Random) -> str:
        """One opponent's model name."""
        return self.candidates[-1] if self.pick == "latest" else rng.choice(self.candidates)
