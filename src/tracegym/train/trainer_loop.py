"""Trainer loop: the trainer process of an RL run: wait for each step's batch, step, record the weights' digest
(`train.weight_digest`), publish the new weights to vLLM, checkpoint (with the orchestrator's state that came with
the batch). Resumes from the newest checkpoint in the run folder (its first step record then says
`"resumed_from": N`), then trains the batches made past it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tracegym.config.run_dir import write_atomic
from tracegym.runtimes.watchdog import Stage, watch
from tracegym.train.rl_folder import ORCHESTRATOR_STATE, RESUMED_FROM, Batch, Poll, RLFolder, step_of
from tracegym.train.trainer import Trainer
from tracegym.train.weight_digest import weight_digest

Publish = Callable[[Path, int], str]
"""Make the weights in a directory the served policy of a version; returns the model name requests use."""

BATCH_WAIT_S = 3600.0
"""The key of the orchestrator's state in a checkpoint's extra state."""


class TrainerLoop:
    """Trains steps until `steps`, each on the batch the orchestrator wrote for it."""

    def __init__(self, folder: RLFolder, trainer: Trainer, publish: Publish, *, steps: int,
                 checkpoint_every: int, merged: bool = False, alive: Callable[[], bool] = lambda: True) -> None:
        """`merged` (`SyncMode.merged`): vLLM serves the weights with the adapter merged in, merging each adapter
        itself (or reloading the changed full weights when there is no adapter), and each checkpoint also writes
        the merged weights whole; else it loads the adapter, or the full weights.
        `alive` is False once the orchestrator's side is gone (stop waiting for batches)."""
        self.folder, self.trainer, self.publish = folder, trainer, publish
        self.steps, self.checkpoint_every, self.merged, self.alive = steps, checkpoint_every, merged, alive
        self.resumed_from: int | None = None
        """The checkpoint's step, until the first step after a resume records it (`RLFolder.trained_steps`)."""

    def run(self) -> None:
        """Every step from the newest checkpoint (if there is one) on."""
        for step in range(self.resume(), self.steps):
            poll = Poll(f"the batch of step {step}", BATCH_WAIT_S, self.alive)
            self.step(step, poll.wait(partial(self.folder.read_batch, step)))

    def step(self, step: int, batch: Batch) -> None:
        """Train on one batch, serve the new weights, log, and checkpoint when it is time."""
        started = time.perf_counter()
        with watch(Stage.TRAINER_STEP, str(step)):
            metrics = self.trainer.step(batch.samples) if batch.samples else {"skipped_empty_batch": 1.0}
        if not batch.samples:
            self.trainer.version += 1  # an empty batch (every group filtered) still advances the step
        trained = time.perf_counter()
        digest = self.record_digest(step)
        digested = time.perf_counter()
        self.serve_weights()
        synced = time.perf_counter()
        if self.main:
            resumed = {} if self.resumed_from is None else {RESUMED_FROM: self.resumed_from}
            self.folder.trainer_metrics.append({"step": step, **metrics, "train_s": trained - started,
                                                "digest_s": digested - trained, "weights_digest": digest,
                                                "weight_sync_s": synced - digested,
                                                "generation_s": batch.meta.get("generation_s"), **resumed})
        self.resumed_from = None
        if (step + 1) % self.checkpoint_every == 0 or step + 1 == self.steps:
            self.checkpoint(step + 1, batch.state)

    def record_digest(self, step: int) -> str:
        """Hash the weights the step left (every rank: a sharded tensor is gathered) and write the digest where
        `tracegym rl --replay` finds it; its whole hash."""
        digest = weight_digest(self.trainer.model)
        if self.main:
            path = self.folder.digest_path(step)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(digest.to_json()))
        return digest.whole

    @property
    def main(self) -> bool:
        """Rank 0 (or the only process): the one that writes what others read and publishes weights."""
        return self.trainer.dp.main

    def serve_weights(self) -> None:
        """Hand the trainer's weights to vLLM and record the policy version it now serves (every rank gathers
        the weights; rank 0 writes and publishes them)."""
        with watch(Stage.WEIGHT_SYNC, f"of version {self.trainer.version}"):
            self._serve_weights()

    def _serve_weights(self) -> None:
        if self.merged and not self.trainer.is_lora:  # vLLM holds the frozen embeddings already
            path = self.trainer.save_merged(self.folder.changed_weights(), changed_only=True)
        else:  # an adapter: loaded as one, or merged by vLLM into the base weights it keeps
            path = self.trainer.save_weights(self.folder.weights(merged=False))
        if self.main:
            self.folder.publish_policy(self.trainer.version, self.publish(path, self.trainer.version))

    def resume(self) -> int:
        """Load the newest checkpoint (if any), serve its weights, and return the first step still to train."""
        path = self.folder.latest_checkpoint()
        start = step_of(path) if path is not None else 0
        if path is not None:
            self.trainer.load(path)
            self.serve_weights()
        if path is not None or self.folder.trainer_metrics.path.exists():  # a killed run's records may follow it
            self.resumed_from = start
        return start

    def checkpoint(self, step: int, orchestrator: dict[str, Any]) -> Path:
        """The trainer's state after `step` steps and the orchestrator's once it made the last batch of them
        (what each resumes from), then marked complete."""
        with watch(Stage.CHECKPOINT, f"after step {step}"):
            return self._checkpoint(step, orchestrator)

    def _checkpoint(self, step: int, orchestrator: dict[str, Any]) -> Path:
        path = self.folder.new_checkpoint(step) if self.main else self.folder.checkpoint_path(step)
        self.trainer.save(path, {ORCHESTRATOR_STATE: orchestrator})
        if self.merged:  # whole, so a run's weights/merged serves on its own (e.g. as a teacher)
            self.trainer.save_merged(self.folder.weights(merged=True))
        if self.main:
            self.folder.complete(path, self.trainer.version)
        return path

