"""Trainer loop: the trainer process of an RL run: wait for each step's batch, step, publish the new weights to
vLLM, checkpoint. Resumes from the newest checkpoint in the run folder.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracegym.train import exchange
from tracegym.train.rl_config import RLConfig
from tracegym.train.trainer import Trainer

Publish = Callable[[Path, int], str]
"""Make the weights in a directory the served policy of a version; returns the model name requests use."""

BATCH_WAIT_S = 3600.0


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (`checkpoints/step-N/` with its DONE marker)."""
    done = sorted((run_dir / "checkpoints").glob("step-*/DONE"))
    return done[-1].parent if done else None


def checkpoint_step(path: Path) -> int:
    return int(path.name.split("-")[1])


def train(config: RLConfig, run_dir: Path, trainer: Trainer, publish: Publish,
          alive: Callable[[], bool] = lambda: True) -> None:
    """Run trainer steps until `config.steps`, starting after the newest checkpoint if there is one."""
    start = resume(config, run_dir, trainer, publish)
    for step in range(start, config.steps):
        samples, meta = exchange.wait_for(lambda s=step: exchange.read_batch(run_dir, s), f"the batch of step {step}",
                                          BATCH_WAIT_S, alive)
        started = time.perf_counter()
        metrics = trainer.step(samples) if samples else {"skipped_empty_batch": 1.0}
        if not samples:
            trainer.version += 1  # an empty batch (every group filtered) still advances the step
        trained = time.perf_counter()
        model = publish(save_for_vllm(config, trainer, run_dir), trainer.version)
        exchange.publish_policy(run_dir, trainer.version, model)
        synced = time.perf_counter()
        log(run_dir, {"step": step, **metrics, "train_s": trained - started, "weight_sync_s": synced - trained,
                      "generation_s": meta.get("generation_s")})
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
            save_checkpoint(run_dir, trainer, step + 1)


def save_for_vllm(config: RLConfig, trainer: Trainer, run_dir: Path) -> Path:
    """The folder the weight sync publishes: the adapter, or the merged full weights."""
    if config.weight_sync == "merged":
        return trainer.save_merged(run_dir / "weights" / "merged")
    return trainer.save_weights(run_dir / "weights" / "current")


def resume(config: RLConfig, run_dir: Path, trainer: Trainer, publish: Publish) -> int:
    """Load the newest checkpoint (if any), serve its weights, and return the first step still to train."""
    path = latest_checkpoint(run_dir)
    if path is None:
        return 0
    trainer.load(path)
    model = publish(save_for_vllm(config, trainer, run_dir), trainer.version)
    exchange.publish_policy(run_dir, trainer.version, model)
    return checkpoint_step(path)


def save_checkpoint(run_dir: Path, trainer: Trainer, step: int, extra: dict[str, Any] | None = None) -> Path:
    """`checkpoints/step-N/` written completely, then marked DONE (a kill mid-write leaves no DONE)."""
    path = run_dir / "checkpoints" / f"step-{step:06d}"
    if path.exists():
        shutil.rmtree(path)
    trainer.save(path, extra)
    (path / "DONE").write_text(json.dumps({"step": step, "version": trainer.version}))
    return path


def log(run_dir: Path, record: dict[str, Any]) -> None:
    with (run_dir / "trainer_metrics.jsonl").open("a") as f:
        f.write(json.dumps({"time": time.time(), **record}) + "\n")
