"""Run folder: where one eval run lives: `config.toml`, `traces.jsonl`, `summary.json`, `logs/` (and for a
multi-agent taskset `episodes.jsonl`).

Traces are appended one JSON line each and flushed as they finish, so a killed run loses at most the line it
was writing. The reader tolerates that truncated last line (and counts it); `repair()` cuts it off before more
lines are appended. The folder never holds two traces for the same (task key, rollout index): a resume first
moves errored traces aside into `traces.errored.jsonl`.

An episode is stored as its members' traces (in `traces.jsonl`, each naming its member and episode) followed by
its record without them (a line of `episodes.jsonl`): the record is written last, so an episode is in the folder
exactly when its record is, and a reader joins the two by episode id (traces of an episode with no record are a
killed run's leftovers, and are ignored).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from tracegym.config.run_dir import make_run_dir, read_toml, write_atomic, write_toml
from tracegym.core.episode import Episode
from tracegym.core.errors import UsageError
from tracegym.core.trace import Trace

CONFIG, TRACES, SUMMARY, ERRORED = "config.toml", "traces.jsonl", "summary.json", "traces.errored.jsonl"
EPISODES = "episodes.jsonl"


@dataclass
class TraceFile:
    """What was read from a traces file: the traces, and how many lines could not be read."""

    traces: list[Trace]
    truncated_tail: bool = False
    """The last line was cut off mid-write (the writer was killed)."""
    bad_lines: int = 0
    """Complete lines that are not traces (skipped)."""


class RunFolder:
    """One run's folder; `create` a new one or `open` an existing one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config_path = path / CONFIG
        self.traces_path = path / TRACES
        self.summary_path = path / SUMMARY
        self.logs = path / "logs"
        self._out: IO[str] | None = None

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

    # --- traces ------------------------------------------------------------------------------------------
    def read_traces(self, name: str = TRACES) -> TraceFile:
        """Every readable trace in the file (none when it does not exist)."""
        return read_trace_file(self.path / name)

    def repair(self) -> bool:
        """End the traces file with a newline: cut a truncated last line off (True), or terminate a complete
        one that lost only its newline."""
        if not self.traces_path.exists():
            return False
        data = self.traces_path.read_bytes()
        if not data or data.endswith(b"\n"):
            return False
        start = data.rfind(b"\n") + 1
        try:
            Trace.model_validate_json(data[start:])
        except (ValidationError, ValueError):
            with self.traces_path.open("r+b") as f:
                f.truncate(start)
            return True
        with self.traces_path.open("ab") as f:
            f.write(b"\n")
        return False

    def append(self, trace: Trace) -> None:
        """Append one trace as a line and flush it to the OS (it survives the process being killed)."""
        if self._out is None:
            self._out = self.traces_path.open("a", encoding="utf-8")
        self._out.write(trace.model_dump_json() + "\n")
        self._out.flush()

    def rewrite(self, traces: Iterable[Trace], name: str = TRACES) -> None:
        """Replace a traces file atomically."""
        self.close()
        write_atomic(self.path / name, "".join(t.model_dump_json() + "\n" for t in traces))

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    # --- episodes ----------------------------------------------------------------------------------------
    def append_episode(self, episode: Episode) -> None:
        """Append an episode: its members' traces, then its record (flushed, so it survives a kill)."""
        for member in episode.members:
            if member in episode.traces:
                self.append(episode.traces[member])
        with (self.path / EPISODES).open("a", encoding="utf-8") as out:
            out.write(episode.model_dump_json(exclude={"traces"}) + "\n")

    def read_episodes(self, name: str = EPISODES, traces: str = TRACES) -> list[Episode]:
        """Every episode whose record is readable, joined with its members' traces from `traces`."""
        records = _read_lines(self.path / name, Episode.model_validate_json)
        members = {(t.episode_id, t.member): t for t in read_trace_file(self.path / traces).traces}
        for episode in records:
            episode.traces = {m: members[(episode.id, m)] for m in episode.members if (episode.id, m) in members}
        return records

    def rewrite_episodes(self, episodes: Iterable[Episode], name: str = EPISODES, traces: str = TRACES) -> None:
        """Replace an episodes file and its traces file atomically (traces first: a record never lacks them)."""
        episodes = list(episodes)
        self.rewrite([t for e in episodes for t in e.traces.values()], traces)
        write_atomic(self.path / name, "".join(e.model_dump_json(exclude={"traces"}) + "\n" for e in episodes))


def read_trace_file(path: Path) -> TraceFile:
    """Traces from a JSONL file, tolerating a truncated last line and skipping unreadable ones."""
    result = TraceFile(traces=[])
    if not path.exists():
        return result
    lines = path.read_text(encoding="utf-8").split("\n")
    last = len(lines) - 1  # the text after the final newline: empty unless the last write was cut off
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            result.traces.append(Trace.model_validate_json(line))
        except (ValidationError, ValueError):
            if i == last:
                result.truncated_tail = True
            else:
                result.bad_lines += 1
    return result


def _read_lines(path: Path, parse: Any) -> list[Any]:
    """Each readable line of a JSONL file parsed (none when it does not exist); unreadable lines are skipped."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.strip():
            try:
                found.append(parse(line))
            except (ValidationError, ValueError):
                continue
    return found


def _safe(name: str) -> str:
    """A name usable as one path part."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.rstrip("/").rsplit("/", 1)[-1]) or "unnamed"


