"""Replay: one RL step rebuilt from what its run folder stored and trained again, checked bit for bit.

`tracegym rl --replay RUN_DIR --step K` starts from the newest checkpoint at or before step K (or the run's start:
the adapter's initialisation is seeded), trains the stored batches of the steps from there to K again on the CPU,
with the torch threads the run recorded, and compares the weights after each against the digest the run wrote then
(`train.weight_digest`): equal bit for bit, or the first step and the first tensor that differ are named. What a
loss spike's debugger needs, on a laptop: the batch, the weights before the step, the step again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tracegym.core.errors import UsageError
from tracegym.train.rl_folder import RLFolder, step_of
from tracegym.train.trainer import Trainer, TrainerConfig
from tracegym.train.weight_digest import WeightDigest, weight_digest


@dataclass(frozen=True)
class ReplayResult:
    """What a replay found: the step asked for, where it started, and the first difference (None: none)."""

    step: int
    start: int
    """Steps already trained in the state it started from (a checkpoint's step; 0: the run's start)."""
    threads: int
    diverged_at: int | None = None
    """The first rerun step whose weights differ from the recorded ones."""
    first_tensor: str | None = None
    """The first tensor (in the model's order) whose hash differs at `diverged_at`."""

    @property
    def equal(self) -> bool:
        return self.diverged_at is None

    def line(self) -> str:
        """One line saying what the replay found."""
        where = f"from {'the start' if self.start == 0 else f'the checkpoint after step {self.start - 1}'}"
        head = f"step {self.step} replayed {where} ({self.step - self.start + 1} step(s), {self.threads} thread(s))"
        if self.equal:
            return f"{head}: the weights equal the run's bit for bit"
        return f"{head}: step {self.diverged_at} differs first, at tensor {self.first_tensor}"


def replay(run_dir: Path, step: int, config: TrainerConfig,
           build: Callable[[TrainerConfig], Trainer]) -> ReplayResult:
    """Rerun the steps up to `step` of the run in `run_dir` on a trainer `build` makes from `config` (the run's
    own, set to the recorded threads on one CPU process), and compare each with its recorded digest."""
    folder = RLFolder(run_dir)
    recorded = read_digest(folder, step)
    if config.num_processes > 1:
        raise UsageError(f"--replay: the run trained on {config.num_processes} data-parallel processes; a replay "
                         "runs one, whose float32 sums differ (replay a single-process run)")
    start = start_of(folder, step)
    torch.set_num_threads(recorded.threads)
    trainer = build(config.model_copy(update={"num_threads": recorded.threads, "device": "cpu"}))
    if start > 0:
        trainer.load(folder.checkpoint_path(start))
    for rerun in range(start, step + 1):
        got = train_stored(folder, trainer, rerun)
        want = read_digest(folder, rerun)
        if got.whole != want.whole:
            return ReplayResult(step, start, recorded.threads, rerun, got.first_difference(want))
    return ReplayResult(step, start, recorded.threads)


def start_of(folder: RLFolder, step: int) -> int:
    """The steps trained in the newest complete checkpoint at or before `step` (0: none, start from scratch)."""
    done = [step_of(path) for path in folder.checkpoints() if step_of(path) <= step]
    return max(done, default=0)


def train_stored(folder: RLFolder, trainer: Trainer, step: int) -> WeightDigest:
    """Train `step`'s stored batch (an empty one only advances the version, as the run did); the digest after."""
    batch = folder.read_batch(step)
    if batch is None:
        raise UsageError(f"--replay: the batch of step {step} is not in {folder.path} (batches/ was cleaned?)")
    if batch.samples:
        trainer.step(batch.samples)
    else:
        trainer.version += 1
    return weight_digest(trainer.model)


def read_digest(folder: RLFolder, step: int) -> WeightDigest:
    """The digest the run recorded after `step`; a UsageError naming the file when it has none."""
    path = folder.digest_path(step)
    try:
        return WeightDigest.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise UsageError(f"--replay: step {step} has no weight digest ({path} is missing: the step was not "
                         "trained yet, or the run predates digests)") from None
    except ValueError as exc:
        raise UsageError(f"--replay: {path} cannot be read: {exc}") from None
