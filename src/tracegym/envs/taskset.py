"""Taskset: loads TaskData rows (a list or a lazy, possibly infinite generator) and builds a Task for each.

Either subclass it (set `id`, `Config`, `task_class`, override `load`) or build one from rows and functions:
`Taskset(id="qa", data=[...], rewards=[exact_match])`. `head(n)` and `shuffle(seed)` return new views;
`taskset[i]` and `taskset.row(key)` look one row up, reading no further than it.

Every row has a key (its TaskData `id`): the one the taskset gives, else its position in `load()` order, set
as the row is loaded. Views keep it (a shuffled row is still task "3"), traces record it, and a resumed run
matches on it, so identical rows stay separate tasks and the key is the same on every run of the same data.
"""

from __future__ import annotations

import collections
import copy
import difflib
import itertools
import operator
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from tracegym.core.errors import UsageError
from tracegym.core.task_data import TaskData
from tracegym.envs.task import Task, class_tools, make_scorers
from tracegym.envs.tools import Tool

Row = TaskData | Mapping[str, Any]


class TasksetConfig(BaseModel):
    """Options of a taskset; subclass it per taskset (every field with a default and a docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    seed: int = 0
    """Seed for generated tasks."""


class Taskset:
    """A source of tasks with shared behaviour."""

    id: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Config: ClassVar[type[TasksetConfig]] = TasksetConfig
    task_class: ClassVar[type[Task]] = Task
    data_class: ClassVar[type[TaskData]] = TaskData
    infinite: ClassVar[bool] = False
    """True when `load` never ends; such a taskset must be bounded (`head`) before it is shuffled or run."""

    def __init__(
        self,
        config: TasksetConfig | Mapping[str, Any] | None = None,
        *,
        id: str | None = None,
        data: Iterable[Row] | None = None,
        rewards: Sequence[Callable[..., Any]] = (),
        metrics: Sequence[Callable[..., Any]] = (),
        stops: Sequence[Callable[..., Any]] = (),
        tools: Sequence[Callable[..., Any]] = (),
        max_turns: int | None = None,
    ) -> None:
        self.config = config_from(type(self).Config, config, id or type(self).id)
        if id is not None:
            self.id = id  # type: ignore[misc]
        self._data = data
        self._scorers = make_scorers(rewards, metrics, stops)
        self._tools = [Tool.from_function(f) for f in tools]
        self._max_turns = max_turns
        self._views: tuple[Callable[[Iterable[TaskData]], Iterable[TaskData]], ...] = ()
        self._bounded = not self.infinite
        class_tools(self.task_class)  # a tool with a missing hint or docstring fails here, at load time

    # --- loading -----------------------------------------------------------------------------------------
    def load(self) -> Iterable[Row]:
        """The rows of this taskset, in order; override to generate them (a generator may be infinite)."""
        if self._data is None:
            raise UsageError(f"taskset {self.id!r} has no data: pass data=[...] or override load()")
        return self._data

    def __iter__(self) -> Iterator[TaskData]:
        rows: Iterable[TaskData] = (self.keyed(row, position) for position, row in enumerate(self.load()))
        for view in self._views:
            rows = view(rows)
        return iter(rows)

    def keyed(self, row: Row, position: int) -> TaskData:
        """Row `position` of `load()` as this taskset's TaskData with its key: its own id, else its position."""
        data = self.as_data(row)
        return data if data.id is not None else data.model_copy(update={"id": str(position)})

    def __getitem__(self, index: int) -> TaskData:
        """The row at `index` of this view, reading at most `index + 1` rows; a negative index counts from
        the end, so it reads them all (and needs a bounded taskset)."""
        if isinstance(index, str):
            raise TypeError(f"taskset indices are positions; look a key up with taskset.row({index!r})")
        index = operator.index(index)
        if index < 0:
            if not self._bounded:
                raise UsageError(f"taskset {self.id!r} is infinite; bound it with head(n) before a negative index")
            rows = list(self)
            if -index > len(rows):
                raise IndexError(f"taskset {self.id!r} has {len(rows)} tasks; no index {index}")
            return rows[index]
        read = collections.deque(enumerate(itertools.islice(self, index + 1)), maxlen=1)  # keeps only the last
        if not read or read[0][0] < index:
            raise IndexError(f"taskset {self.id!r} has {read[0][0] + 1 if read else 0} tasks; no index {index}")
        return read[0][1]

    def row(self, key: str, *, within: int | None = None) -> TaskData:
        """The row whose key is `key`, searched in this view's order and read only as far as it; `within`
        bounds the search to the first rows (an infinite taskset needs it). A KeyError when it is not there."""
        if within is None and not self._bounded:
            raise UsageError(f"taskset {self.id!r} is infinite; look a key up with row(key, within=N)")
        rows = iter(self) if within is None else itertools.islice(self, within)
        found = next((data for data in rows if data.key == key), None)
        if found is None:
            where = "" if within is None else f" in its first {within}"
            raise KeyError(f"taskset {self.id!r} has no task with key {key!r}{where}")
        return found

    @property
    def bounded(self) -> bool:
        """False for an infinite taskset that no `head` or `shuffle(bound=...)` has bounded."""
        return self._bounded

    def __len__(self) -> int:
        if not self._bounded:
            raise UsageError(f"taskset {self.id!r} is infinite; bound it with head(n) first")
        return sum(1 for _ in self)

    def head(self, n: int) -> Taskset:
        """A view of the first `n` tasks."""
        view = self._with_view(lambda rows: itertools.islice(rows, n))
        view._bounded = True
        return view

    def shuffle(self, seed: int = 0, bound: int | None = None) -> Taskset:
        """A view in a seeded random order; an infinite taskset needs `bound` (or a `head` before)."""
        if bound is None and not self._bounded:
            raise UsageError(f"taskset {self.id!r} is infinite; shuffle(seed, bound=N) or head(N) first")

        def shuffled(rows: Iterable[TaskData]) -> Iterable[TaskData]:
            items = list(rows if bound is None else itertools.islice(rows, bound))
            random.Random(seed).shuffle(items)
            return items

        view = self._with_view(shuffled)
        view._bounded = True
        return view

    def _with_view(self, view: Callable[[Iterable[TaskData]], Iterable[TaskData]]) -> Taskset:
        clone = copy.copy(self)
        clone._views = (*self._views, view)
        return clone

    # --- building tasks ----------------------------------------------------------------------------------
    def as_data(self, row: Row) -> TaskData:
        """A row as this taskset's TaskData type (rows read back from a trace or the wire included)."""
        if isinstance(row, self.data_class):
            return row
        fields = row.model_dump() if isinstance(row, TaskData) else dict(row)
        try:
            return self.data_class.model_validate(fields)
        except ValidationError as exc:
            raise UsageError(f"taskset {self.id!r}: bad task row: {first_error(exc)}") from None

    def task(self, row: Row) -> Task:
        """A fresh Task for one rollout of this row."""
        return self.task_class(
            self.as_data(row),
            scorers=self._scorers,
            tools=self._tools,
            taskset_id=self.id,
            max_turns=self._max_turns,
        )


def config_from(cls: type[TasksetConfig], value: TasksetConfig | Mapping[str, Any] | None, owner: str):
    """Validate a taskset config, turning pydantic's report into one line naming the field."""
    if isinstance(value, cls):
        return value
    try:
        return cls.model_validate(dict(value or {}))
    except ValidationError as exc:
        raise UsageError(f"taskset {owner!r}: {first_error(exc, known=cls.model_fields)}") from None


def first_error(exc: ValidationError, known: Iterable[str] = ()) -> str:
    """The first problem of a validation error as `field 'x': message`; an unknown top-level field also gets
    the closest of the `known` field names and the list of them."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(row)"
    text = f"field {where!r}: {err['msg']} (got {err.get('input')!r})"
    known = sorted(known)
    if err["type"] != "extra_forbidden" or len(err["loc"]) != 1 or not known:
        return text
    close = difflib.get_close_matches(str(err["loc"][0]), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{text}{hint} Known fields: {', '.join(known)}"
