"""Run folder index: every line of an eval or RL run folder's trace and episode files, by byte offset, with a
small summary each, so pages are served from the index and read one record from disk when shown.

The index only reads the folder. It follows files as they grow (`refresh` reads the lines appended since the
last call and picks up new step files) and starts over when a file was replaced (a resume rewrites
`traces.jsonl`). A line that is not a record stays a row, marked with why (corrupt, or a newer schema), and a
last line without its newline is reported as incomplete until it is finished.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tracegym.config.run_dir import read_toml
from tracegym.core.episode import Episode
from tracegym.core.errors import UsageError
from tracegym.core.trace import SCHEMA_VERSION, Trace
from tracegym.eval.run_folder import CONFIG, EPISODES, SUMMARY, TRACES
from tracegym.train.rl_folder import EPISODES as RL_EPISODES
from tracegym.train.rl_folder import TRACES as RL_TRACES
from tracegym.train.rl_folder import RLFolder, held_out_folder, step_of

CHUNK = 1 << 20
"""Bytes read from a file at a time when indexing (more when one line is longer)."""
SEARCH_CHUNK = 4 << 20
"""Bytes read from a file at a time when searching (a search never holds more of a file than this)."""
SEARCHES_KEPT = 8
"""Searches whose matches are kept, so paging through one does not scan again."""


class RunKind(StrEnum):
    """Which kind of run a folder holds."""

    EVAL = "eval"
    RL = "rl"


class RowKind(StrEnum):
    """What a row stands for: a trace, or a multi-agent episode (whose member traces live elsewhere)."""

    TRACE = "trace"
    EPISODE = "episode"


class RowError(Exception):
    """A row that cannot be shown: out of range (`status` 404) or not a readable record (422)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Source:
    """One JSONL file of the folder and how far it has been indexed."""

    path: Path
    kind: RowKind
    step: int | None
    held_out: str | None = None
    """The `evals/<env>` folder of a held-out evaluation's episodes (None for the training rollouts)."""
    offset: int = 0
    """Bytes indexed: the file's complete lines up to here are rows."""
    lines: int = 0
    inode: int = 0
    tail: int = 0
    """Bytes after the last newline: a line being written, or cut off by a killed writer."""


@dataclass(slots=True)
class Row:
    """One line of a source: where it is, and the summary the run page sorts and filters on."""

    source: int
    offset: int
    length: int
    line: int
    """1-based line number in its file."""
    problem: str | None = None
    """Why the line is not a readable record (None when it is one)."""
    task_key: str = ""
    index: int = 0
    """The rollout index of a trace, the episode index of an episode."""
    reward: float | None = None
    member_rewards: tuple[tuple[str, float | None], ...] = ()
    """An episode's reward per member, in seat order."""
    stop_reason: str = ""
    errors: tuple[str, ...] = ()
    """The kinds of the errors recorded (an episode: its own and its members'), each once."""
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration: float = 0.0
    taskset: str = ""
    step: int | None = None
    member: str | None = None
    episode_id: str | None = None
    held_out: str | None = None
    """The environment of a held-out evaluation's episode, as its `evals/<env>` folder names it."""

    @property
    def rewards(self) -> list[float]:
        """The rewards a reward filter looks at: the trace's, or each member's that was decided."""
        if self.member_rewards:
            return [r for _, r in self.member_rewards if r is not None]
        return [] if self.reward is None else [self.reward]


@dataclass
class RunFolderIndex:
    """The index of one run folder; `open` it, then `refresh` to read what was appended."""

    path: Path
    kind: RunKind
    sources: list[Source] = field(default_factory=list)
    traces: list[Row] = field(default_factory=list)
    episodes: list[Row] = field(default_factory=list)
    unreadable: int = 0
    """Rows whose line is not a record."""
    tasksets: set[str] = field(default_factory=set)
    """The tasksets the rows name."""
    generation: int = 0
    """Bumped each time the index starts over (a file was replaced): row numbers from before mean nothing."""
    _members: dict[str, dict[str, int]] = field(default_factory=dict)
    """Eval runs: episode id -> member -> row of its trace."""
    _searches: OrderedDict[tuple[RowKind, str], tuple[int, int, list[int]]] = field(default_factory=OrderedDict)
    """(kind, query) -> (generation, rows scanned, matching rows), newest last."""

    @classmethod
    def open(cls, path: Path) -> RunFolderIndex:
        """The (empty) index of the run folder at `path`; a UsageError naming what is wrong when it is not one."""
        if not path.is_dir():
            what = "a file, not a directory" if path.exists() else "no such directory"
            raise UsageError(f"{str(path)!r} is not a run folder: {what}")
        rl = RLFolder(path)
        if rl.metrics.path.exists() or (path / RL_TRACES).is_dir() or (path / RL_EPISODES).is_dir():
            return cls(path, RunKind.RL)
        if (path / CONFIG).is_file() or (path / TRACES).is_file():
            return cls(path, RunKind.EVAL)
        raise UsageError(f"{str(path)!r} is not a run folder: it has no {CONFIG}, {TRACES} or "
                         f"{rl.metrics.path.name}")

    # --- following the files -----------------------------------------------------------------------------
    def refresh(self, max_lines: int | None = None) -> int:
        """Index lines appended since the last call (at most `max_lines`) and new files; returns how many lines
        were read. A file that was replaced or shrank makes the index start over."""
        self._discover()
        if any(self._replaced(s) for s in self.sources):
            self._restart()
        budget = sys.maxsize if max_lines is None else max_lines
        read = 0
        for number, source in enumerate(self.sources):
            read += self._read(number, source, budget - read)
            if read >= budget:
                break
        return read

    @property
    def pending_bytes(self) -> int:
        """Bytes of complete lines not indexed yet (0 once caught up)."""
        return sum(max(0, _size(s.path) - s.offset - s.tail) for s in self.sources)

    def _discover(self) -> None:
        known = {s.path for s in self.sources}
        for source in self._files():
            if source.path not in known and source.path.exists():
                source.inode = _inode(source.path)
                self.sources.append(source)

    def _files(self) -> Iterator[Source]:
        if self.kind is RunKind.EVAL:
            yield Source(self.path / TRACES, RowKind.TRACE, None)
            yield Source(self.path / EPISODES, RowKind.EPISODE, None)
            return
        rl = RLFolder(self.path)
        folders = [(RowKind.TRACE, RL_TRACES, None), (RowKind.EPISODE, RL_EPISODES, None),
                   *((RowKind.EPISODE, held_out_folder(env), env) for env in rl.held_out_envs())]
        for kind, folder, held_out in folders:
            for path in rl.step_records(folder):
                yield Source(path, kind, step_of(path), held_out)

    def _replaced(self, source: Source) -> bool:
        return _inode(source.path) != source.inode or _size(source.path) < source.offset + source.tail

    def _restart(self) -> None:
        self.sources, self.traces, self.episodes, self.unreadable = [], [], [], 0
        self.tasksets.clear()
        self._members.clear()
        self._searches.clear()
        self.generation += 1
        self._discover()

    def _read(self, number: int, source: Source, budget: int) -> int:
        """Index up to `budget` complete lines of one source from where it stopped."""
        read = 0
        with source.path.open("rb") as f:
            while read < budget:
                f.seek(source.offset)
                chunk = _complete_lines(f)
                if chunk is None:  # no complete line past the offset (being written, or cut off)
                    source.tail = f.tell() - source.offset
                    break
                lines = chunk.split(b"\n")[:-1][: budget - read]
                for line in lines:
                    self._add(number, source, line)
                read += len(lines)
        return read

    def _add(self, number: int, source: Source, line: bytes) -> None:
        source.lines += 1
        row = Row(number, source.offset, len(line), source.lines, step=source.step, held_out=source.held_out)
        source.offset += len(line) + 1
        source.tail = 0
        if not line.strip():
            return
        if source.kind is RowKind.TRACE:
            _summarize_trace(row, line)
            self.traces.append(row)
            if row.episode_id is not None and row.member is not None:
                self._members.setdefault(row.episode_id, {})[row.member] = len(self.traces) - 1
        else:
            self._summarize_episode(row, line)
            self.episodes.append(row)
        self.unreadable += row.problem is not None
        self.tasksets.add(row.taskset)

    def _summarize_episode(self, row: Row, line: bytes) -> None:
        try:
            episode = Episode.model_validate_json(line)
        except (ValidationError, ValueError) as exc:
            row.problem = problem_of(line, exc, "episode")
            return
        members = list(episode.traces.values()) or self._member_traces(episode.id)
        _fill(row, episode, members)
        row.index = episode.episode_index
        row.member_rewards = tuple((m, episode.rewards.get(m)) for m in episode.members)
        row.episode_id = episode.id
        if episode.error is not None:
            row.errors = tuple(sorted({*row.errors, episode.error.kind.value}))

    def _member_traces(self, episode_id: str) -> list[Trace]:
        """An eval episode's member traces (written before its record, so already indexed)."""
        rows = [self.traces[n] for n in self._members.get(episode_id, {}).values()]
        return [self._parse(r, Trace) for r in rows if r.problem is None]

    # --- reading records ---------------------------------------------------------------------------------
    @property
    def first_shown(self) -> RowKind:
        """What the run page lists unless asked: a multi-agent run's episodes, else traces (an RL run whose only
        episodes are held-out evaluations' trains on traces)."""
        played = any(s.kind is RowKind.EPISODE and s.held_out is None and s.lines for s in self.sources)
        return RowKind.EPISODE if played else RowKind.TRACE

    def rows(self, kind: RowKind) -> list[Row]:
        return self.traces if kind is RowKind.TRACE else self.episodes

    def row(self, kind: RowKind, number: int) -> Row:
        """Row `number` of `kind`; a RowError (404) when there is none."""
        rows = self.rows(kind)
        if not 0 <= number < len(rows):
            raise RowError(f"there is no {kind.value} {number}: this run has {len(rows)} (numbered from 0)", 404)
        return rows[number]

    def raw(self, row: Row) -> bytes:
        """The line of a row as it is on disk."""
        with self.sources[row.source].path.open("rb") as f:
            f.seek(row.offset)
            return f.read(row.length)

    def where(self, row: Row) -> str:
        """`traces.jsonl line 7`: where a row is, for messages."""
        return f"{self.sources[row.source].path.relative_to(self.path)} line {row.line}"

    def trace(self, number: int) -> Trace:
        """Trace row `number`, read from disk; a RowError when it is out of range or unreadable."""
        row = self.row(RowKind.TRACE, number)
        return self._parse(row, Trace)

    def episode(self, number: int) -> Episode:
        """Episode row `number` with its members' traces; a RowError when it is out of range or unreadable."""
        row = self.row(RowKind.EPISODE, number)
        episode = self._parse(row, Episode)
        if self.kind is RunKind.EVAL:  # an eval run stores the member traces in traces.jsonl
            for member, number_ in self._members.get(episode.id, {}).items():
                if member in episode.members and self.traces[number_].problem is None:
                    episode.traces[member] = self._parse(self.traces[number_], Trace)
        return episode

    def _parse(self, row: Row, model: type[Trace] | type[Episode]) -> Any:
        if row.problem is not None:
            raise RowError(f"{self.where(row)}: {row.problem}", 422)
        try:
            return model.model_validate_json(self.raw(row))
        except (ValidationError, ValueError) as exc:  # the file changed under us since it was indexed
            raise RowError(f"{self.where(row)}: {problem_of(self.raw(row), exc, model.__name__.lower())}", 422) \
                from None

    # --- searching message text --------------------------------------------------------------------------
    def search(self, query: str, kind: RowKind = RowKind.TRACE) -> list[int]:
        """Rows of `kind` with a message whose text (or tool call) contains `query`, ignoring case (an episode:
        in one of its members' traces). Scans the files a chunk at a time; the matches of recent queries are
        kept and extended as lines are appended."""
        if kind is RowKind.EPISODE and self.kind is RunKind.EVAL:  # its members' traces are trace rows
            ids = {self.traces[n].episode_id for n in self.search(query)} - {None}
            return [n for n, row in enumerate(self.episodes) if row.episode_id in ids]
        rows, key = self.rows(kind), query.casefold()
        generation, scanned, found = self._searches.pop((kind, key), (self.generation, 0, []))
        if generation != self.generation:
            scanned, found = 0, []
        # the query as it appears inside a JSON string; bytes.lower() folds ASCII only, so other text is checked
        # on every line
        needle = json.dumps(key)[1:-1].encode() if key.isascii() else b""
        for number in self._lines_containing(rows, needle, scanned):
            if any(_mentions(trace, key) for trace in self._traces_in(rows[number], kind)):
                found.append(number)
        self._searches[(kind, key)] = (self.generation, len(rows), found)
        while len(self._searches) > SEARCHES_KEPT:
            self._searches.popitem(last=False)
        return found

    def _traces_in(self, row: Row, kind: RowKind) -> list[Trace]:
        if kind is RowKind.TRACE:
            return [self._parse(row, Trace)]
        return list(self._parse(row, Episode).traces.values())

    def _lines_containing(self, rows: list[Row], needle: bytes, start: int) -> Iterator[int]:
        """Readable rows of `rows` from `start` on whose raw line contains `needle` (lowercased)."""
        number = start
        while number < len(rows):
            first = rows[number]
            with self.sources[first.source].path.open("rb") as f:
                f.seek(first.offset)
                chunk = f.read(SEARCH_CHUNK).lower()
            end = first.offset + len(chunk)
            while number < len(rows):
                row = rows[number]
                if row.source != first.source or row.offset + row.length > end:
                    break
                begin = row.offset - first.offset
                if row.problem is None and chunk.find(needle, begin, begin + row.length) >= 0:
                    yield number
                number += 1
            if number < len(rows) and rows[number] is first:  # one line longer than a chunk
                if first.problem is None and needle in self.raw(first).lower():
                    yield number
                number += 1

    # --- the folder's other files ------------------------------------------------------------------------
    def summary(self) -> dict[str, Any] | None:
        """`summary.json` as written (None when the run has not written one yet)."""
        path = self.path / SUMMARY
        if not path.exists():
            return None
        try:
            value = json.loads(path.read_text())
        except ValueError as exc:
            raise RowError(f"{SUMMARY} is not valid JSON: {exc}", 422) from None
        return value if isinstance(value, dict) else None

    def config(self) -> dict[str, Any]:
        """The resolved config the run saved (empty when it has none yet)."""
        path = self.path / CONFIG
        return read_toml(path) if path.exists() else {}

    def model(self) -> str:
        """The model the saved config names ('' when it names none)."""
        model = self.config().get("model")
        return str(model.get("name") or "") if isinstance(model, dict) else ""

    def metrics(self) -> list[dict[str, Any]]:
        """An RL run's orchestrator records (per step, per held-out evaluation, per bad trace)."""
        return RLFolder(self.path).metrics.read() if self.kind is RunKind.RL else []

    def trainer_metrics(self) -> list[dict[str, Any]]:
        """An RL run's trainer records, one per step."""
        return RLFolder(self.path).trainer_metrics.read() if self.kind is RunKind.RL else []

    def held_out_envs(self) -> list[str]:
        """The held-out environments whose evaluation episodes are indexed (an RL run), by name."""
        return sorted({s.held_out for s in self.sources if s.held_out is not None})

    def steps(self) -> list[int]:
        """The steps whose traces or episodes are indexed, in order."""
        return sorted({s.step for s in self.sources if s.step is not None})

    def incomplete(self) -> list[str]:
        """A line per file whose last line has no newline yet."""
        return [f"{s.path.relative_to(self.path)}: the last line is incomplete ({s.tail} bytes, no newline yet): "
                "it is being written, or a killed writer cut it off" for s in self.sources if s.tail]


def _summarize_trace(row: Row, line: bytes) -> None:
    try:
        trace = Trace.model_validate_json(line)
    except (ValidationError, ValueError) as exc:
        row.problem = problem_of(line, exc, "trace")
        return
    _fill(row, trace)
    row.index, row.reward = trace.rollout_index, trace.reward
    row.member, row.episode_id = trace.member, trace.episode_id


def _complete_lines(f: Any) -> bytes | None:
    """From the file's position, the bytes up to and including the last newline of the next chunk (more when
    one line is longer than a chunk); None when no newline follows."""
    chunk = f.read(CHUNK)
    end = chunk.rfind(b"\n") + 1
    while not end and len(chunk) % CHUNK == 0 and chunk:
        more = f.read(CHUNK)
        if not more:
            break
        chunk += more
        end = chunk.rfind(b"\n") + 1
    return chunk[:end] if end else None


def problem_of(line: bytes, exc: Exception, what: str) -> str:
    """Why a line is not a record: not JSON, a schema newer than this tracegym reads, or not a valid `what`."""
    try:
        data = json.loads(line)
    except ValueError as error:
        return f"corrupt line: not JSON ({error})"
    version = data.get("schema_version") if isinstance(data, dict) else None
    if isinstance(version, int) and version > SCHEMA_VERSION:
        return (f"unknown schema version {version}: written by a newer tracegym (this one reads version "
                f"{SCHEMA_VERSION}); upgrade tracegym to view it")
    first = exc.errors()[0] if isinstance(exc, ValidationError) else None
    detail = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(exc)
    return f"not a valid {what}: {detail}"


def _fill(row: Row, record: Trace | Episode, members: list[Trace] | None = None) -> None:
    """The summary fields a trace and an episode share (an episode's totals are over its members' traces)."""
    row.task_key = sys.intern(record.task_key)
    row.taskset = sys.intern(record.taskset)
    row.stop_reason = sys.intern(record.stop_reason.value if record.stop_reason else "none")
    if isinstance(record, Trace):  # the common case, without the loops over members (indexing is per line)
        row.errors = tuple(sorted({e.kind.value for e in record.errors})) if record.errors else ()
        row.turns, row.duration = record.num_turns, float(record.duration())
        row.prompt_tokens, row.completion_tokens = record.usage.prompt_tokens, record.usage.completion_tokens
        return
    traces = members or []
    row.errors = tuple(sorted({e.kind.value for t in traces for e in t.errors}))
    row.turns = sum(t.num_turns for t in traces)
    row.prompt_tokens = sum(t.usage.prompt_tokens for t in traces)
    row.completion_tokens = sum(t.usage.completion_tokens for t in traces)
    row.duration = float(max((t.duration() for t in traces), default=0.0))


def _mentions(trace: Trace, key: str) -> bool:
    """True when a message of the trace (any branch) has `key` in its text or a tool call, ignoring case."""
    for node in trace.graph.nodes:
        message = node.message
        if key in message.text.casefold() or any(key in f"{c.name} {c.arguments}".casefold()
                                                 for c in message.tool_calls):
            return True
    return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _inode(path: Path) -> int:
    try:
        return path.stat().st_ino
    except OSError:
        return 0
