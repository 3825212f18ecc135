"""Exchange: the files through which the orchestrator hands batches to the trainer and the trainer publishes
policy versions, inside an RL run folder. Every write is atomic (temp file + rename), so a reader never sees
half a file and a killed process leaves nothing torn.

    batches/step-000007.msgpack   the samples for trainer step 7 (msgpack of Sample dicts + step metrics)
    policy.json                   {"version": 8, "model": "policy"}: the weights vLLM serves now
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from tracegym.core.errors import InfrastructureError
from tracegym.core.sample import Sample

POLICY = "policy.json"


def batch_path(run_dir: Path, step: int) -> Path:
    return run_dir / "batches" / f"step-{step:06d}.msgpack"


def write_batch(run_dir: Path, step: int, samples: list[Sample], meta: dict[str, Any] | None = None) -> Path:
    """Hand the samples of `step` to the trainer."""
    path = batch_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"step": step, "samples": [s.model_dump(mode="json") for s in samples], "meta": meta or {}}
    _write_atomic(path, msgpack.packb(body))
    return path


def read_batch(run_dir: Path, step: int) -> tuple[list[Sample], dict[str, Any]] | None:
    """The batch of `step` if it has been written."""
    path = batch_path(run_dir, step)
    if not path.exists():
        return None
    body = msgpack.unpackb(path.read_bytes())
    return [Sample.model_validate(s) for s in body["samples"]], body.get("meta", {})


def publish_policy(run_dir: Path, version: int, model: str) -> None:
    """Record that vLLM now serves policy `version` under the name `model`."""
    _write_atomic(run_dir / POLICY, json.dumps({"version": version, "model": model}).encode())


def current_policy(run_dir: Path, base_model: str) -> tuple[int, str]:
    """(version, model name to request); version 0 is the base model before any step."""
    path = run_dir / POLICY
    if not path.exists():
        return 0, base_model
    data = json.loads(path.read_text())
    return int(data["version"]), str(data["model"])


def wait_for(condition: Callable[[], Any], what: str, timeout: float, alive: Callable[[], bool] = lambda: True,
             poll: float = 0.05) -> Any:
    """Poll `condition` until it returns something truthy; InfrastructureError after `timeout` or when `alive`
    says the other side is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if not alive():
            raise InfrastructureError(f"gave up waiting for {what}: the other process is gone")
        time.sleep(poll)
    raise InfrastructureError(f"gave up waiting for {what} after {timeout:.0f}s")


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
