"""Run folder index: every trace and multi-agent episode of an eval or RL run folder's episode logs
(`config.episode_log`), by byte offset, with a small summary each, so pages are served from the index and read one
record from disk when shown.

Every folder is read as episode logs: an eval run's one (`traces.jsonl`, `episodes.jsonl`), an RL run's one per
step and per held-out evaluation. Each member trace is a trace row; each multi-agent episode record is an episode
row, joined with its members' trace rows by episode id. A single-agent rollout's solo record adds no row (its trace
row is the rollout), and neither does a trace with no record. An old layout reads through the same join: a folder
without records lists its traces, and an old RL episodes line with its members' traces inside makes those traces
trace rows of that line.

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
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tracegym.config.episode_log import EpisodeLog
from tracegym.config.run_dir import read_toml
from tracegym.core.cut_policy import CutPolicy
from tracegym.core.episode import SOLO, Episode
from tracegym.core.errors import UsageError
from tracegym.core.record import record_problem
from tracegym.core.trace import SCHEMA_VERSION, Trace
from tracegym.eval.run_folder import CONFIG, EPISODES, SUMMARY, TRACES
from tracegym.eval.run_summary import summarize_run
from tracegym.train.rl_folder import EPISODES as RL_EPISODES
from tracegym.train.rl_folder import TRACES as RL_TRACES
from tracegym.train.rl_folder import RLFolder

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
    """What a row stands for: a trace, or a multi-agent episode (whose member traces are trace rows)."""

    TRACE = "trace"
    EPISODE = "episode"


class RowError(Exception):
    """A row that cannot be shown: out of range (`status` 404) or not a readable record (422)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Source:
    """One file of an episode log of the folder (`kind`: its traces file or its episodes file) and how far it has
    been indexed."""

    path: Path
    kind: RowKind
    step: int | None
    held_out: str | None = None
    """The `evals/<env>` folder of a held-out evaluation's log (None for the training rollouts and an eval run)."""
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
    """The environment of a held-out evaluation's trace or episode, as its `evals/<env>` folder names it."""

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
    _members: dict[tuple[int | None, str | None, str], dict[str, int]] = field(default_factory=dict)
    """A multi-agent episode (`_joined`) -> member -> its trace row: the join of an episode log."""
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
        were read. A file that was replaced or shrank makes the index start over.

        A record is written after its members' traces, so the episodes files are read only as far as they went
        before the traces files were read, and only once those are read to their end: an episode row always
        finds its member traces indexed, even while the run appends both."""
        self._discover()
        if any(self._replaced(s) for s in self.sources):
            self._restart()
        written = {n: _size(s.path) for n, s in enumerate(self.sources) if s.kind is RowKind.EPISODE}
        budget = sys.maxsize if max_lines is None else max_lines
        read = 0
        for number in sorted(range(len(self.sources)), key=lambda n: n in written):  # traces files first
            read += self._read(number, self.sources[number], budget - read, written.get(number, sys.maxsize))
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
        """The two files of each episode log of the folder."""
        for log, step, held_out in self._logs():
            yield Source(log.traces, RowKind.TRACE, step, held_out)
            yield Source(log.episodes, RowKind.EPISODE, step, held_out)

    def _logs(self) -> Iterator[tuple[EpisodeLog, int | None, str | None]]:
        """Each episode log of the folder with its step and held-out environment: an eval run's one; an RL run's
        per training step, then per held-out environment and step."""
        if self.kind is RunKind.EVAL:
            yield EpisodeLog(self.path / TRACES, self.path / EPISODES), None, None
            return
        rl = RLFolder(self.path)
        for held_out in (None, *rl.held_out_envs()):
            for step in rl.steps(held_out):
                yield rl.step_log(step, held_out), step, held_out

    def _replaced(self, source: Source) -> bool:
        return _inode(source.path) != source.inode or _size(source.path) < source.offset + source.tail

    def _restart(self) -> None:
        self.sources, self.traces, self.episodes, self.unreadable = [], [], [], 0
        self.tasksets.clear()
        self._members.clear()
        self._searches.clear()
        self.generation += 1
        self._discover()

    def _read(self, number: int, source: Source, budget: int, end: int) -> int:
        """Index up to `budget` complete lines of one source from where it stopped, up to byte `end`."""
        read = 0
        with source.path.open("rb") as f:
            while read < budget:
                f.seek(source.offset)
                chunk = _complete_lines(f, end - source.offset)
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
        model = Trace if source.kind is RowKind.TRACE else Episode
        try:
            record = model.model_validate_json(line)
        except (ValidationError, ValueError) as exc:
            row.problem = problem_of(line, exc, source.kind.value)
            self._keep(self.rows(source.kind), row)
            return
        if isinstance(record, Trace):
            self._add_trace(row, record)
        else:
            self._add_episode(row, record)

    def _add_trace(self, row: Row, trace: Trace) -> Row:
        _fill_trace(row, trace)
        self._keep(self.traces, row)
        if trace.episode_id is not None and trace.member is not None:
            self._members.setdefault(_joined(row), {})[trace.member] = len(self.traces) - 1
        return row

    def _add_episode(self, row: Row, episode: Episode) -> None:
        """An episodes line: an old layout's members' traces inside it become trace rows of the line; a solo
        record adds no row (its trace row is the rollout)."""
        inside = [self._add_trace(replace(row), t) for t in episode.traces.values()]
        if episode.is_solo:
            return
        row.episode_id = episode.id
        joined = self._members.get(_joined(row), {})
        _fill_episode(row, episode, inside or [self.traces[joined[m]] for m in episode.members if m in joined])
        self._keep(self.episodes, row)

    def _keep(self, rows: list[Row], row: Row) -> None:
        rows.append(row)
        self.unreadable += row.problem is not None
        self.tasksets.add(row.taskset)

    # --- reading records ---------------------------------------------------------------------------------
    @property
    def first_shown(self) -> RowKind:
        """What the run page lists unless asked: a multi-agent run's episodes, else traces (an RL run whose only
        episodes are held-out evaluations' trains on traces)."""
        played = any(r.held_out is None and r.problem is None for r in self.episodes)
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
        """`traces.jsonl line 7`: where a row is, for messages (a member's trace inside an old layout's episodes
        line: `episodes/step-000001.jsonl line 2, member judge`)."""
        source = self.sources[row.source]
        inside = f", member {row.member}" if source.kind is RowKind.EPISODE and row.member is not None else ""
        return f"{source.path.relative_to(self.path)} line {row.line}{inside}"

    def trace(self, number: int) -> Trace:
        """Trace row `number`, read from disk; a RowError when it is out of range or unreadable."""
        return self._trace_of(self.row(RowKind.TRACE, number))

    def episode(self, number: int) -> Episode:
        """Episode row `number` with its members' traces; a RowError when it is out of range or unreadable."""
        row = self.row(RowKind.EPISODE, number)
        episode: Episode = self._parse(row, Episode)
        if not episode.traces:  # a record of an episode log: its members' traces are trace rows
            joined = self._members.get(_joined(row), {})
            episode.traces = {m: self._trace_of(self.traces[joined[m]]) for m in episode.members
                              if m in joined and self.traces[joined[m]].problem is None}
        return episode

    def _trace_of(self, row: Row) -> Trace:
        """The trace of a trace row: its line, or in an old layout's episodes line, its member's trace."""
        if self.sources[row.source].kind is RowKind.TRACE:
            trace: Trace = self._parse(row, Trace)
            return trace
        return self._parse(row, Episode).traces[SOLO if row.member is None else row.member]

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
        if kind is RowKind.EPISODE:  # its members' traces are trace rows
            played = {_joined(self.traces[n]) for n in self.search(query) if self.traces[n].episode_id is not None}
            return [n for n, row in enumerate(self.episodes) if _joined(row) in played]
        rows, key = self.traces, query.casefold()
        generation, scanned, found = self._searches.pop((kind, key), (self.generation, 0, []))
        if generation != self.generation:
            scanned, found = 0, []
        # the query as it appears inside a JSON string; bytes.lower() folds ASCII only, so other text is checked
        # on every line
        needle = json.dumps(key)[1:-1].encode() if key.isascii() else b""
        for number in self._lines_containing(rows, needle, scanned):
            if _mentions(self._trace_of(rows[number]), key):
                found.append(number)
        self._searches[(kind, key)] = (self.generation, len(rows), found)
        while len(self._searches) > SEARCHES_KEPT:
            self._searches.popitem(last=False)
        return found

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
        """`summary.json` as written (None when the run has not written one yet). One that cannot be read is
        computed again from the run's episodes, as the run would have written it, with a `recomputed` entry
        saying why: every trace of the run is still readable."""
        path = self.path / SUMMARY
        if not path.exists():
            return None
        try:
            value = json.loads(path.read_text())
        except ValueError as exc:
            why = f"{SUMMARY} is not valid JSON ({exc})"
        else:
            if isinstance(value, dict):
                return value
            why = f"{SUMMARY} holds a {type(value).__name__}, not the run's figures"
        return {"recomputed": f"{why}: these figures are computed again from the run's traces",
                **self._computed_summary()}

    def _computed_summary(self) -> dict[str, Any]:
        threshold = self.config().get("pass_threshold", 1.0)
        episodes = EpisodeLog(self.path / TRACES, self.path / EPISODES).read().episodes
        summary = summarize_run(episodes, pass_threshold=threshold if isinstance(threshold, int | float) else 1.0,
                                cuts=saved_cuts(self.config().get("cuts")))
        return summary.model_dump(mode="json")

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
        """The held-out environments whose evaluations are indexed (an RL run), by name."""
        return sorted({s.held_out for s in self.sources if s.held_out is not None})

    def steps(self) -> list[int]:
        """The steps whose traces or episodes are indexed, in order."""
        return sorted({s.step for s in self.sources if s.step is not None})

    def incomplete(self) -> list[str]:
        """A line per file whose last line has no newline yet."""
        return [f"{s.path.relative_to(self.path)}: the last line is incomplete ({s.tail} bytes, no newline yet): "
                "it is being written, or a killed writer cut it off" for s in self.sources if s.tail]


def _joined(row: Row) -> tuple[int | None, str | None, str]:
    """What joins a multi-agent episode's record with its members' traces: its episode log (by step and held-out
    environment) and its id."""
    return row.step, row.held_out, row.episode_id or ""


def _complete_lines(f: Any, limit: int) -> bytes | None:
    """From the file's position, the bytes up to and including the last newline of the next chunk (more when
    one line is longer than a chunk), reading at most `limit` bytes; None when no newline follows within them."""
    chunk = b""
    while len(chunk) < limit:
        more = f.read(min(CHUNK, limit - len(chunk)))
        if not more:
            break
        chunk += more
        end = chunk.rfind(b"\n", len(chunk) - len(more)) + 1
        if end:
            return chunk[:end]
    return None


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
    return f"not a valid {what}: {record_problem(exc) if isinstance(exc, ValidationError) else exc}"


def _fill_common(row: Row, record: Trace | Episode) -> None:
    """The summary fields a trace and an episode share."""
    row.task_key = sys.intern(record.task_key)
    row.taskset = sys.intern(record.taskset)
    row.stop_reason = sys.intern(record.stop_reason.value if record.stop_reason else "none")


def _fill_trace(row: Row, trace: Trace) -> None:
    _fill_common(row, trace)
    row.index, row.reward = trace.rollout_index, trace.reward
    row.member, row.episode_id = trace.member, trace.episode_id
    row.errors = tuple(sorted({e.kind.value for e in trace.errors})) if trace.errors else ()
    row.turns, row.duration = trace.num_turns, float(trace.duration())
    row.prompt_tokens, row.completion_tokens = trace.usage.prompt_tokens, trace.usage.completion_tokens


def _fill_episode(row: Row, episode: Episode, members: list[Row]) -> None:
    """An episode's summary: its own fields, and totals over its members' trace rows (their errors joined to its
    own)."""
    _fill_common(row, episode)
    row.index, row.episode_id = episode.episode_index, episode.id
    row.member_rewards = tuple((m, episode.rewards.get(m)) for m in episode.members)
    own = {episode.error.kind.value} if episode.error is not None else set()
    row.errors = tuple(sorted(own.union(*(m.errors for m in members))))
    row.turns = sum(m.turns for m in members)
    row.prompt_tokens = sum(m.prompt_tokens for m in members)
    row.completion_tokens = sum(m.completion_tokens for m in members)
    row.duration = max((m.duration for m in members), default=0.0)


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


def saved_cuts(saved: Any) -> CutPolicy:
    """The cut policy a run's saved config holds; the default (keep every reward) when it holds none that reads."""
    try:
        return CutPolicy.model_validate(saved or {})
    except ValidationError:
        return CutPolicy()
