"""Episode log: the one on-disk form of a set of episodes, in every run folder: their members' traces one a line in
a traces file, and their records, without the traces, one a line in an episodes file, joined by episode id.

An eval run folder is one log (`traces.jsonl`, `episodes.jsonl`); an RL run folder has one per step
(`traces/step-N.jsonl`, `episodes/step-N.jsonl`) and per held-out evaluation (`evals/<env>/traces/step-N.jsonl`,
`evals/<env>/episodes/step-N.jsonl`). A single-agent rollout is the one-member episode `Episode.solo`: its trace is
a `traces.jsonl` row as before, and its record names the trace's own id.

An episode's record is written after its members' traces, so a reader that finds the record finds the traces.
What a killed writer leaves is read as far as it makes sense: a line cut off is skipped (and `repair` cuts it
before more is appended); a single-agent trace whose record was never written is still a whole rollout, read as
its solo episode; the traces of a multi-agent episode without its record are an episode cut short, left out.

Folders written before every run was an episode read the same way: their single-agent traces have no record (each
is its solo episode), and an RL run folder's old `episodes/step-N.jsonl` lines hold their members' traces inside.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from pydantic import ValidationError

from tracegym.config.image_store import ImageStore
from tracegym.config.run_dir import write_atomic
from tracegym.core.episode import Episode, episode_of, member_id
from tracegym.core.record import record_problem
from tracegym.core.trace import Trace

R = TypeVar("R")


@dataclass
class LogRead:
    """What was read from an episode log: its episodes in the order they were written, and what could not be read."""

    episodes: list[Episode]
    truncated_tail: bool = False
    """A file's last line was cut off mid-write (the writer was killed)."""
    unreadable: dict[Path, list[bytes]] = field(default_factory=dict)
    """Complete lines that are not traces or episode records (skipped), as found, by the file that holds them."""
    cut_short: int = 0
    """Multi-agent episodes whose members' traces are there but whose record is not (left out)."""
    problems: dict[Path, str] = field(default_factory=dict)
    """Why the first unreadable line of each file could not be read (`core.record.record_problem`)."""

    @property
    def bad_lines(self) -> int:
        """How many complete lines could not be read."""
        return sum(map(len, self.unreadable.values()))

    @property
    def traces(self) -> list[Trace]:
        """Every member trace of the episodes read, episode by episode in seat order."""
        return [e.traces[m] for e in self.episodes for m in e.members if m in e.traces]


@dataclass
class EpisodeLog:
    """The two files of one episode log; `append` one episode at a time, `write` many at once, `read` them back."""

    traces: Path
    episodes: Path
    images: ImageStore | None = None
    """Where the run folder keeps the images its traces carry, once each by hash (their rows then hold references,
    `config.image_store`); None: images stay inline in the rows."""
    _out: dict[Path, IO[str]] = field(default_factory=dict, repr=False)

    def append(self, episode: Episode) -> None:
        """Append an episode: its members' traces, then its record, each line flushed to the OS as written (it
        survives the process being killed)."""
        self._line(self.traces, "".join(self.trace_line(t) for t in _member_traces(episode)))
        self._line(self.episodes, self._stored(record_line(episode)))

    def trace_line(self, trace: Trace) -> str:
        """A trace's line in the traces file: its JSON, its images stored and referenced when the log has a store."""
        return self._stored(trace.model_dump_json() + "\n")

    def parse_trace(self, line: bytes) -> Trace:
        """A trace read from its line, the images it references put back in as data URIs (when the log has a store)."""
        return self.images.parse(line, Trace) if self.images is not None else Trace.model_validate_json(line)

    def parse_record(self, line: bytes) -> Episode:
        """An episode record read from its line, as `parse_trace` reads a trace."""
        return self.images.parse(line, Episode) if self.images is not None else Episode.model_validate_json(line)

    def _stored(self, line: str) -> str:
        return self.images.stored(line.removesuffix("\n")) + "\n" if self.images is not None else line

    def write(self, episodes: Iterable[Episode], keep: bool = False) -> None:
        """Replace both files whole (traces first: a record never lacks its traces); `keep`: after what they hold."""
        self.close()
        episodes = list(episodes)
        for path, text in ((self.traces, "".join(self.trace_line(t) for e in episodes for t in _member_traces(e))),
                           (self.episodes, "".join(self._stored(record_line(e)) for e in episodes))):
            path.parent.mkdir(parents=True, exist_ok=True)
            earlier = path.read_text(encoding="utf-8") if keep and path.exists() else ""
            write_atomic(path, earlier + text)

    def read(self) -> LogRead:
        """Every episode the log holds, joined with its members' traces (see the module's docstring)."""
        traces, traces_tail, traces_bad, traces_why = _parse(self.traces, self.parse_trace)
        records, records_tail, records_bad, records_why = _parse(self.episodes, self.parse_record)
        unreadable = {path: bad for path, bad in ((self.traces, traces_bad), (self.episodes, records_bad)) if bad}
        problems = {path: why for path, why in ((self.traces, traces_why), (self.episodes, records_why)) if why}
        by_member = {(episode_of(t), member_id(t)): t for t in traces}
        recorded = {r.id for r in records}
        for record in records:
            if not record.traces:
                record.traces = {m: by_member[(record.id, m)] for m in record.members if (record.id, m) in by_member}
        loose = [t for t in traces if episode_of(t) not in recorded]
        solo = [Episode.solo(t) for t in loose if t.episode_id is None]
        cut_short = len({t.episode_id for t in loose if t.episode_id is not None})
        return LogRead([*records, *solo], truncated_tail=traces_tail or records_tail, unreadable=unreadable,
                       cut_short=cut_short, problems=problems)

    def repair(self) -> bool:
        """End both files with a newline: cut a truncated last line off (True when one was), or terminate a
        complete one that lost only its newline."""
        self.close()
        cut = [_repair(self.traces, Trace.model_validate_json), _repair(self.episodes, Episode.model_validate_json)]
        return any(cut)

    def set_aside(self, read: LogRead) -> dict[Path, Path]:
        """Append the lines `read` could not read to `<file>.unreadable` beside the file that held them (before a
        rewrite drops them from it); each such file by the one whose lines it holds."""
        aside = {path: path.with_name(path.name + ".unreadable") for path in read.unreadable}
        for path, lines in read.unreadable.items():
            with aside[path].open("ab") as out:
                out.write(b"".join(line + b"\n" for line in lines))
        return aside

    def close(self) -> None:
        outs, self._out = list(self._out.values()), {}
        for out in outs:
            with contextlib.suppress(OSError):  # every line is flushed as written: only a failed write's is left,
                out.close()                     # and that write raised already (a full disk)

    def _line(self, path: Path, text: str) -> None:
        if path not in self._out:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._out[path] = path.open("a", encoding="utf-8")
        self._out[path].write(text)
        self._out[path].flush()


def record_line(episode: Episode) -> str:
    """An episode's line in an episodes file: its record without its members' traces."""
    return episode.model_dump_json(exclude={"traces"}) + "\n"


def _member_traces(episode: Episode) -> list[Trace]:
    return [episode.traces[m] for m in episode.members if m in episode.traces]


def _parse(path: Path, parse: Callable[[bytes], R]) -> tuple[list[R], bool, list[bytes], str]:
    """The readable lines of a JSONL file parsed; whether its last line was cut off; the other lines that could
    not be read (text garbage, bytes that are not UTF-8, records with fields this version does not know), as found;
    why the first of those could not be read ("" when all could)."""
    if not path.exists():
        return [], False, [], ""
    found: list[R] = []
    tail, bad, why = False, [], ""
    lines = path.read_bytes().split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            found.append(parse(line))
        except (ValidationError, ValueError) as exc:
            if i == len(lines) - 1:
                tail = True
            else:
                why = why or f"line {i + 1}: " + (record_problem(exc) if isinstance(exc, ValidationError) else str(exc))
                bad.append(line)
    return found, tail, bad, why


def _repair(path: Path, parse: Callable[[bytes], object]) -> bool:
    if not path.exists():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    start = data.rfind(b"\n") + 1
    try:
        parse(data[start:])
    except (ValidationError, ValueError):
        with path.open("r+b") as f:
            f.truncate(start)
        return True
    with path.open("ab") as f:
        f.write(b"\n")
    return False

