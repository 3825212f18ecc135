"""RL run folder: where one training run lives, and the one place that knows its layout.

    config.toml                     the resolved RLConfig (`tracegym rl` writes it; the processes read it)
    endpoints.json                  vLLM's URLs, the served base model, each env server's address (launcher -> roles)
    policy.json                     {"version": 8, "model": "policy"}: the weights vLLM serves now
    batches/step-000007.msgpack     trainer step 7: its samples, its metrics, the orchestrator's state after it
    weights/current/, weights/changed/  what the trainer last handed to vLLM (the adapter, loaded or merged by
                                    vLLM, or full weights / without LoRA, merged weights but the frozen embeddings)
    weights/merged/                 the merged weights at the last checkpoint: a servable model directory
    checkpoints/step-000008/DONE    a complete checkpoint after 8 steps (trainer and orchestrator state)
    digests/step-000007.json        the trainable weights' hashes after step 7, per tensor (`train.weight_digest`):
                                    what `tracegym rl --replay` compares a rerun step against
    partial/step-000009.jsonl       the groups of the step being made that finished so far, a line each: a resume
                                    after a kill mid-step keeps them instead of running them again
    metrics.jsonl                   the orchestrator's records: one per step, per held-out evaluation, per bad trace
    tripwires.jsonl                 each tripwire that fired (`train.tripwire`): its wire, step and what it saw
    trainer_metrics.jsonl           the trainer's records: one per step; the first after a resume says from which
                                    checkpoint (`"resumed_from": 8`; `trained_steps`: the records the weights carry)
    traces/step-000007.jsonl        the member traces of step 7's episodes (a single-agent rollout's trace alone)
    images/<sha256>.png             each image the traces carry, once (their rows name it, `config.image_store`)
    episodes/step-000007.jsonl      step 7's episode records, joined with their traces by id (`config.episode_log`)
    evals/<env>/traces/step-000010.jsonl, evals/<env>/episodes/step-000010.jsonl
                                    the same for a held-out environment's evaluation at step 10 (a folder written
                                    before every run was an episode has `evals/<env>/step-N.jsonl`, episodes with
                                    their traces inside, read as the episodes file of that step)
    logs/                           one log per process (vllm.log, trainer.log, orchestrator.log, env-<name>/)
    wandb/, tensorboard/            what `[tracking]` turned on writes (the records of metrics.jsonl, sample traces)
    plots/                          what `tracegym plot` draws

The orchestrator and the trainer are separate processes that talk only through this folder. A file one of them
reads is written whole (temp file + rename), so it never sees half of one; a JSONL file is appended a line at a
time and read skipping a line cut off by a killed writer. Waiting for the other process's file is `Poll`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgpack
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from tracegym.config.episode_log import EpisodeLog
from tracegym.config.image_store import ImageStore
from tracegym.config.run_dir import make_run_dir, read_toml, write_atomic, write_toml
from tracegym.core.episode import Episode
from tracegym.core.errors import InfrastructureError, UsageError
from tracegym.core.sample import Sample
from tracegym.serve.wire import listed
from tracegym.train.tracking import Tracking

ORCHESTRATOR_STATE = "orchestrator"
"""The key of the orchestrator's state in a trainer checkpoint's extra state."""
CONFIG, ENDPOINTS, POLICY, DONE = "config.toml", "endpoints.json", "policy.json", "DONE"
PARTIAL = "partial"
"""The folder of the unfinished steps' finished groups (`FinishedGroups`)."""
RESUMED_FROM = "resumed_from"
"""The key, in the trainer's first step record after a resume, of the checkpoint's step it resumed from."""
STEP_PREFIX = "step-"
TRACES, EPISODES = "traces", "episodes"
"""The folders of each step's episode log: its member traces and its episode records."""
EVALS = "evals"
"""The folder of held-out evaluations' episodes: one folder per environment (`held_out_folder`)."""


def step_name(step: int) -> str:
    """`step-000007`: how step 7 is named in every per-step folder (batches, checkpoints, traces)."""
    return f"{STEP_PREFIX}{step:06d}"


def held_out_folder(env: str) -> str:
    """`evals/<env>`: the folder of a held-out environment's episodes (`:`, as in `eval:debate`, becomes `-`)."""
    return f"{EVALS}/{env.replace(':', '-')}"


def step_of(path: Path) -> int:
    """The step a per-step file or folder is named after (`batches/step-000007.msgpack` -> 7)."""
    name = path.name.split(".", 1)[0]
    if not name.startswith(STEP_PREFIX) or not name[len(STEP_PREFIX):].isdigit():
        raise UsageError(f"{str(path)!r} is not named {STEP_PREFIX}N")
    return int(name[len(STEP_PREFIX):])


class Endpoints(BaseModel):
    """Where the launcher started what the processes call: vLLM, and each env server by name."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    base_url: str
    """vLLM's OpenAI-compatible API root (the first server's, when there are several)."""
    replicas: list[str] = Field(default_factory=list)
    """The other vLLM servers' API roots (`model.servers` > 1): rollouts are routed across all of them and each
    publish reaches every one."""
    base_model: str
    """The name vLLM serves the base model under (policy version 0)."""
    envs: dict[str, Annotated[list[str], BeforeValidator(listed)]]
    """Env server addresses by name (`env_servers` in rl_config): one each, or several serving one environment."""
    teacher_base_url: list[str] | None = None
    """The teacher's API roots (`sft` and `opd` runs): its `base_url`, or the vLLM server the launcher started."""
    teacher_model: str | None = None
    """The name the teacher is requested under at `teacher_base_url`."""


@dataclass(frozen=True)
class Batch:
    """What the orchestrator hands the trainer for one step."""

    samples: list[Sample]
    meta: dict[str, Any]
    """The step's metrics (generation time among them)."""
    state: dict[str, Any]
    """The orchestrator's state once this batch was made: what it resumes from after the next step trains."""


class JsonlLog:
    """An append-only JSONL file of metric records, each stamped with the time it was written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mirror: Callable[[dict[str, Any]], None] | None = None
        """Where each record also goes as it is appended (`Tracking`: W&B, TensorBoard)."""
        self._followed = 0
        """Bytes `read_new` has returned."""

    def append(self, record: dict[str, Any]) -> None:
        stamped = {"time": time.time(), **record}
        with self.path.open("a") as f:
            f.write(json.dumps(stamped) + "\n")
        if self.mirror is not None:
            self.mirror(stamped)

    def read_new(self) -> list[dict[str, Any]]:
        """The records written (whole lines) since the last `read_new`: another process's log, followed."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self._followed)
            chunk = f.read()
        whole = chunk[:chunk.rfind(b"\n") + 1]
        self._followed += len(whole)
        return [json.loads(line) for line in whole.splitlines() if line.strip()]

    def read(self) -> list[dict[str, Any]]:
        """The records, skipping a line cut off by a killed writer (none when the file does not exist)."""
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records


@dataclass(frozen=True)
class Poll:
    """Waiting for the other process's file: look every `every` seconds; give up after `timeout`, or at once
    when `alive` says the other side is gone. `wait` blocks; `wait_async` yields to the event loop."""

    what: str
    timeout: float
    alive: Callable[[], bool] = lambda: True
    every: float = 0.05

    def wait(self, condition: Callable[[], Any]) -> Any:
        """The first truthy value of `condition()`."""
        for _ in self._attempts():
            if value := condition():
                return value
            time.sleep(self.every)

    async def wait_async(self, condition: Callable[[], Any]) -> Any:
        """The first truthy value of `condition()`, sleeping without blocking the loop in between."""
        for _ in self._attempts():
            if value := condition():
                return value
            await asyncio.sleep(self.every)

    def _attempts(self) -> Iterator[None]:
        """Once per look; raises InfrastructureError instead of the next look when waiting is over."""
        deadline = time.monotonic() + self.timeout
        while True:
            yield
            if not self.alive():
                raise InfrastructureError(f"gave up waiting for {self.what}: the other process is gone")
            if time.monotonic() > deadline:
                raise InfrastructureError(f"gave up waiting for {self.what} after {self.timeout:.0f}s")


class RLFolder:
    """One RL run's folder; `create` a new one, `resume` an existing one, or wrap a path the launcher made."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config_path = path / CONFIG
        self.logs = path / "logs"
        self.plots = path / "plots"
        self.metrics = JsonlLog(path / "metrics.jsonl")
        """The orchestrator's records."""
        self.trainer_metrics = JsonlLog(path / "trainer_metrics.jsonl")
        """The trainer's records."""
        self.tripwires = JsonlLog(path / "tripwires.jsonl")
        """The tripwires that fired (`train.tripwire`), one record each."""
        self.images = ImageStore.of(path)
        """The images the episode logs' traces carry, each once (`images/`)."""
        self.tracking: Tracking | None = None
        """Where the orchestrator's records and sample traces also go (`track`)."""

    @classmethod
    def create(cls, output_dir: Path, run_id: str | None = None) -> RLFolder:
        """A new, empty run folder `output_dir/<run-id>/` (run id: the start time); an existing one is an error."""
        return cls(make_run_dir(output_dir, run_id or time.strftime("%Y%m%d-%H%M%S")))

    @classmethod
    def resume(cls, path: Path) -> RLFolder:
        """An existing run folder, its config copied aside (`config.before-<time>.toml`) before the new one
        replaces it (copied, not moved: a resume killed before it writes the new one can itself be resumed)."""
        folder = cls(path)
        if not folder.config_path.is_file():
            raise UsageError(f"--resume {path}: not an RL run folder (no {CONFIG})")
        shutil.copyfile(folder.config_path, path / f"config.before-{time.strftime('%Y%m%d-%H%M%S')}.toml")
        return folder

    def track(self, tracking: Tracking) -> None:
        """From now on, hand `tracking` every record appended to `metrics` and the traces of each step."""
        self.tracking, self.metrics.mirror = tracking, tracking.log

    def mirror_trainer(self) -> None:
        """Hand tracking, if it is on, the trainer's records written since the last call (the trainer is another
        process: its `trainer_metrics.jsonl` is followed here)."""
        if self.tracking is not None:
            for record in self.trainer_metrics.read_new():
                self.tracking.log_trainer(record)

    def close(self) -> None:
        """Finish tracking, if it is on (the trainer's last records and every tool's flushed)."""
        self.mirror_trainer()
        tracking, self.tracking, self.metrics.mirror = self.tracking, None, None
        if tracking is not None:
            tracking.close()

    # --- what the launcher hands the processes --------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        write_toml(self.config_path, config)

    def read_config(self) -> dict[str, Any]:
        return read_toml(self.config_path)

    def write_endpoints(self, endpoints: Endpoints) -> None:
        write_atomic(self.path / ENDPOINTS, endpoints.model_dump_json(indent=2).encode())

    def read_endpoints(self) -> Endpoints:
        path = self.path / ENDPOINTS
        try:
            return Endpoints.model_validate_json(path.read_text())
        except (OSError, ValidationError) as exc:
            raise UsageError(f"cannot read {path} (the launcher writes it): {exc}") from None

    def log_path(self, process: str) -> Path:
        """The log of one process (`vllm`, `trainer`, `orchestrator`)."""
        return self.logs / f"{process}.log"

    def env_log_dir(self, server: str) -> Path:
        """The folder of one env server's logs (`eval:wordle` -> `logs/env-eval-wordle/`)."""
        return self.logs / f"env-{server.replace(':', '-')}"

    def rewind(self) -> int:
        """Before the processes start: forget the served policy (a new vLLM serves none yet; the trainer republishes
        it), keep the batches made past the newest checkpoint (the trainer trains them; each gets its metrics record
        if a kill came between the two), and drop the finished groups of steps whose batch was made. Returns the
        newest checkpoint's step, where the trainer goes on."""
        checkpoint = self.latest_checkpoint()
        start = step_of(checkpoint) if checkpoint else 0
        made = self.made_ahead(start)
        logged = {r["step"] for r in self.metrics.read() if "step" in r}
        for step in made:
            batch = self.read_batch(step)
            if step not in logged and batch is not None:
                self.metrics.append({"step": step, **batch.meta})
        for partial in self._steps(PARTIAL, "*.jsonl"):
            if step_of(partial) < start + len(made):
                partial.unlink()
        (self.path / POLICY).unlink(missing_ok=True)
        return start

    def made_ahead(self, start: int) -> list[int]:
        """The steps from `start` on whose batch the orchestrator made (in order, so without a gap)."""
        steps: list[int] = []
        while self._batch_path(start + len(steps)).exists():
            steps.append(start + len(steps))
        return steps

    def resume_state(self) -> dict[str, Any] | None:
        """The orchestrator's state to go on from: saved with the newest batch made past the newest checkpoint, else
        with that checkpoint; None for a run with neither (it starts afresh)."""
        checkpoint = self.latest_checkpoint()
        made = self.made_ahead(step_of(checkpoint) if checkpoint else 0)
        batch = self.read_batch(made[-1]) if made else None
        if batch is not None and batch.state:
            return batch.state
        return orchestrator_state(checkpoint) if checkpoint else None

    def trained_steps(self) -> list[dict[str, Any]]:
        """The trainer's step records that the newest weights carry, in order: a record made after the newest
        checkpoint by a run that was then killed is dropped at the resume that trained that step again."""
        carried: list[dict[str, Any]] = []
        for record in self.trainer_metrics.read():
            if RESUMED_FROM in record:
                carried = [r for r in carried if r["step"] < record[RESUMED_FROM]]
            carried.append(record)
        return carried

    def finished_groups(self, step: int) -> FinishedGroups:
        """The groups of `step` finished so far (by a run killed while making it), to keep and add to."""
        return FinishedGroups(self._partial_path(step))

    def forget_finished(self, step: int) -> None:
        """The batch of `step` is made: its finished groups are in it."""
        self._partial_path(step).unlink(missing_ok=True)

    # --- the exchange between orchestrator and trainer -----------------------------------------------------
    def write_batch(self, step: int, samples: list[Sample], meta: dict[str, Any] | None = None,
                    state: dict[str, Any] | None = None) -> Path:
        """Hand the samples of `step` to the trainer, with the step's metrics and the orchestrator's state."""
        path = self._batch_path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"step": step, "samples": [s.model_dump(mode="json") for s in samples], "meta": meta or {},
                "state": state or {}}
        write_atomic(path, msgpack.packb(body))
        return path

    def read_batch(self, step: int) -> Batch | None:
        """The batch of `step` if it has been written."""
        path = self._batch_path(step)
        if not path.exists():
            return None
        body = msgpack.unpackb(path.read_bytes())
        return Batch([Sample.model_validate(s) for s in body["samples"]], body.get("meta", {}), body.get("state", {}))

    def publish_policy(self, version: int, model: str) -> None:
        """Record that vLLM now serves policy `version` under the name `model`."""
        write_atomic(self.path / POLICY, json.dumps({"version": version, "model": model}).encode())

    def policy(self, base_model: str) -> tuple[int, str]:
        """(version, model name to request); version 0 is the base model before any step."""
        path = self.path / POLICY
        if not path.exists():
            return 0, base_model
        data = json.loads(path.read_text())
        return int(data["version"]), str(data["model"])

    def weights(self, merged: bool) -> Path:
        """Where the trainer writes merged full weights at each checkpoint (a servable model directory), or what
        vLLM loads: the adapter (or full weights)."""
        return self.path / "weights" / ("merged" if merged else "current")

    def changed_weights(self) -> Path:
        """Where a trainer without LoRA writes the merged weights vLLM reloads after each step: all but the frozen
        embeddings, which it holds already (not a model directory of its own)."""
        return self.path / "weights" / "changed"

    # --- checkpoints and traces ----------------------------------------------------------------------------
    def new_checkpoint(self, step: int) -> Path:
        """The path of an empty `checkpoints/step-N/` (any older one is removed): a checkpoint is written from
        scratch and then `complete`d."""
        path = self.checkpoint_path(step)
        if path.exists():
            shutil.rmtree(path)
        return path

    def digest_path(self, step: int) -> Path:
        """Where the weight digest after training step `step` lives (`digests/step-N.json`)."""
        return self.path / "digests" / f"{step_name(step)}.json"

    def checkpoint_path(self, step: int) -> Path:
        """Where the checkpoint after `step` steps lives (`checkpoints/step-N/`)."""
        return self.path / "checkpoints" / step_name(step)

    def complete(self, checkpoint: Path, version: int) -> None:
        """Mark a fully written checkpoint usable (a kill mid-write leaves none, so a resume skips it)."""
        write_atomic(checkpoint / DONE, json.dumps({"step": step_of(checkpoint), "version": version}))

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint."""
        done = self.checkpoints()
        return done[-1] if done else None

    def checkpoints(self) -> list[Path]:
        """Every complete checkpoint, oldest first."""
        return sorted((marker.parent for marker in self._steps("checkpoints", f"*/{DONE}")), key=step_of)

    def step_log(self, step: int, held_out: str | None = None) -> EpisodeLog:
        """The episode log of a training step (`held_out`: of a held-out environment's evaluation at that step)."""
        root = self.path / held_out_folder(held_out) if held_out else self.path
        name = f"{step_name(step)}.jsonl"
        episodes = root / EPISODES / name
        if held_out and not episodes.exists() and (root / name).exists():
            episodes = root / name  # written before every run was an episode: the episodes, their traces inside
        return EpisodeLog(root / TRACES / name, episodes, images=self.images)

    def write_episodes(self, step: int, episodes: Iterable[Episode], held_out: str | None = None,
                       keep: bool = False) -> EpisodeLog:
        """A step's episodes (`held_out`: a held-out environment's evaluation at that step) into its episode log,
        written whole (`keep`: after those already there: a step made again keeps its earlier attempts'). Tracking
        gets a training step's member traces too."""
        episodes = list(episodes)
        if self.tracking is not None and held_out is None:
            self.tracking.log_traces(step, [t for e in episodes for t in e.traces.values()])
        log = self.step_log(step, held_out)
        log.write(episodes, keep=keep)
        return log

    def steps(self, held_out: str | None = None) -> list[int]:
        """The steps with an episode log written so far (`held_out`: of that environment's evaluations)."""
        root = self.path / held_out_folder(held_out) if held_out else self.path
        found = [*(root / TRACES).glob(f"{STEP_PREFIX}*.jsonl"), *(root / EPISODES).glob(f"{STEP_PREFIX}*.jsonl")]
        if held_out:
            found += root.glob(f"{STEP_PREFIX}*.jsonl")
        return sorted({step_of(path) for path in found})

    def held_out_envs(self) -> list[str]:
        """The held-out environments with episodes written so far, as their `evals/<env>` folders name them."""
        root = self.path / EVALS
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []

    def _partial_path(self, step: int) -> Path:
        return self.path / PARTIAL / f"{step_name(step)}.jsonl"

    def _batch_path(self, step: int) -> Path:
        return self.path / "batches" / f"{step_name(step)}.msgpack"

    def _steps(self, folder: str, pattern: str) -> list[Path]:
        """The per-step files or folders of `folder` matching `pattern` (under a `step-N` name)."""
        return list((self.path / folder).glob(f"{STEP_PREFIX}{pattern}"))


class FinishedGroups:
    """The groups of one step finished so far, appended a line each as each finishes (a partial-rollout
    checkpoint): a resume after a kill mid-step takes each that ran the same task at the same place of the step
    instead of running it again. Each group is named by the step's attempt (`regeneration`) and its place in the
    order the step drew its tasks; a line cut off by the kill is dropped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kept = self._read()
        self.taken = 0
        """The groups taken from an earlier run."""

    def take(self, attempt: int, index: int, task_key: str) -> list[Episode] | None:
        """The group an earlier run finished at this place, if it ran `task_key`."""
        kept = self.kept.pop((attempt, index), None)
        if kept is None or not kept or kept[0].task_key != task_key:
            return None
        self.taken += 1
        return kept

    def record(self, attempt: int, index: int, group: list[Episode]) -> None:
        """Keep a group that just finished (one write of one line: a kill leaves it whole or cut off), unless one
        of its rollouts failed: that failure may be the kill's own doing (a connection cut, a cancel, a server
        gone), so a resume runs the group again."""
        if any(e.error is not None or any(t.failure is not None for t in e.traces.values()) for e in group):
            return
        line = json.dumps({"attempt": attempt, "index": index, "episodes": [e.model_dump(mode="json") for e in group]})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(line + "\n")

    def _read(self) -> dict[tuple[int, int], list[Episode]]:
        """The whole lines, by (attempt, index); the file cut back to them, so that the next line starts afresh."""
        if not self.path.exists():
            return {}
        kept: dict[tuple[int, int], list[Episode]] = {}
        whole = []
        for line in self.path.read_bytes().split(b"\n"):
            try:
                record = json.loads(line)
                kept[(record["attempt"], record["index"])] = [Episode.model_validate(e) for e in record["episodes"]]
            except (ValueError, KeyError, TypeError, ValidationError):
                continue
            whole.append(line + b"\n")
        write_atomic(self.path, b"".join(whole))
        return kept


def orchestrator_state(checkpoint: Path) -> dict[str, Any]:
    """The orchestrator's state saved with a checkpoint; a checkpoint without one is an error (resuming with
    fresh advantage state would silently change the run)."""
    from tracegym.train.trainer import checkpoint_extra_state  # torch: only the processes that resume load it

    state = checkpoint_extra_state(checkpoint).get(ORCHESTRATOR_STATE)
    if not state:
        raise UsageError(f"checkpoint {checkpoint} holds no orchestrator state (an older tracegym wrote it); "
                         f"start a new run")
    return dict(state)
