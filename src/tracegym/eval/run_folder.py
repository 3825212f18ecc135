"""Run folder: where one eval run lives: `config.toml`, its episodes (`traces.jsonl`, `episodes.jsonl`),
`summary.json`, `logs/`, and `images/`: each image its rows carry, once by content hash (`config.image_store`).

Every run is stored as episodes through one `EpisodeLog` (see `config.episode_log`): each member's trace is a line of
`traces.jsonl` (a single-agent run's rows are its rollouts' traces, one a line, as users read them), and each
episode's record follows as a line of `episodes.jsonl` (a single-agent rollout's is its solo record). Lines are
flushed as each episode finishes, so a killed run loses at most what it was writing; the reader tolerates a
truncated last line and `log.repair()` cuts it off before more is appended. The folder never holds two episodes for
one (task key, episode index): a resume first sets the errored ones aside into the `errored` log
(`traces.errored.jsonl`, `episodes.errored.jsonl`). Folders written before every run was an episode (a
single-agent run's `traces.jsonl` alone) read as their solo episodes, and a resume rewrites them in this form.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

from tracegym.config.episode_log import EpisodeLog
from tracegym.config.image_store import ImageStore
from tracegym.config.run_dir import make_run_dir, read_toml, write_atomic, write_toml
from tracegym.core.errors import UsageError

CONFIG, TRACES, EPISODES, SUMMARY = "config.toml", "traces.jsonl", "episodes.jsonl", "summary.json"


class RunFolder:
    """One run's folder; `create` a new one or `open` an existing one. `log` holds the run's episodes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config_path = path / CONFIG
        self.traces_path = path / TRACES
        self.summary_path = path / SUMMARY
        self.logs = path / "logs"
        self.images = ImageStore.of(path)
        """The images the logs' traces carry, each once (`images/`)."""
        self.log = EpisodeLog(self.traces_path, path / EPISODES, images=self.images)
        self.errored = self.side_log("errored")
        """Episodes a resume set aside (not ended normally, or no longer expected)."""

    @classmethod
    def create(cls, output_dir: Path, taskset: str, model: str, run_id: str | None = None) -> RunFolder:
        """A new, empty run folder `output_dir/<taskset>--<model>/<run-id>/`; an existing one is an error."""
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        folder = cls(make_run_dir(output_dir, Path(f"{_safe(taskset)}--{_safe(model)}", run_id)))
        folder.logs.mkdir()
        return folder

    @classmethod
    def open(cls, path: Path) -> RunFolder:
        """An existing run folder; a UsageError when `path` is not one."""
        if not path.is_dir():
            raise UsageError(f"{str(path)!r} is not a run folder: no such directory")
        if not (path / CONFIG).is_file():
            raise UsageError(f"{str(path)!r} is not a run folder: it has no {CONFIG}")
        folder = cls(path)
        folder.logs.mkdir(exist_ok=True)
        return folder

    def side_log(self, name: str) -> EpisodeLog:
        """An episode log beside the run's own: `traces.<name>.jsonl` and `episodes.<name>.jsonl`."""
        return EpisodeLog(self.path / f"traces.{name}.jsonl", self.path / f"episodes.{name}.jsonl", images=self.images)

    # --- config and summary ------------------------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        write_toml(self.config_path, config)

    def read_config(self) -> dict[str, Any]:
        return read_toml(self.config_path)

    def earlier_wall_time(self) -> float:
        """Seconds the earlier sessions of this run took, as their last summary recorded (0 when none did; a
        session killed before writing its summary is not counted)."""
        try:
            value = json.loads(self.summary_path.read_text()).get("wall_time")
        except (OSError, ValueError, AttributeError):
            return 0.0
        return float(value) if isinstance(value, int | float) and value > 0 else 0.0

    def write_summary(self, summary: dict[str, Any], name: str = SUMMARY) -> Path:
        path = self.path / name
        write_atomic(path, json.dumps(summary, indent=2) + "\n")
        return path


def _safe(name: str) -> str:
    """A name usable as one path part."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.rstrip("/").rsplit("/", 1)[-1]) or "unnamed"
