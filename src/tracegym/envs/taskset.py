"""Taskset: loads TaskData rows (a list or a lazy, possibly infinite generator) and builds a Task for each.

Either subclass it (set `id` and `task_class`, override `load`) or build one from rows and functions:
`Taskset(id="qa", data=[...], rewards=[exact_match])`. `head(n)` and `shuffle(seed)` return new views;
`taskset[i]` and `taskset.row(key)` look one row up, reading no further than it.

A Taskset is generic over its config: `class Sorting(Taskset[SortConfig])` takes SortConfig options (its
`Config`, set from the type argument) and reads `self.config` as a SortConfig; its tasks get the same object
as `task.config`. A generated taskset names its row maker instead of writing `load`: `row_maker = make_row`
draws `config.num_tasks` rows (an endless stream when `infinite`) with `seeded_rows`.

Every row has a key (its TaskData `id`): the one the taskset gives, else its position in `load()` order, set
as the row is loaded. Views keep it (a shuffled row is still task "3"), traces record it, and a resumed run
matches on it, so identical rows stay separate tasks and the key is the same on every run of the same data.
"""

from __future__ import annotations

import collections
import copy
import itertools
import operator
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

from pydantic import ValidationError

from tracegym.core.errors import UsageError
from tracegym.core.task_data import TaskData
from tracegym.envs.harness import Harness
from tracegym.envs.harness_choice import HarnessChoice
from tracegym.envs.scorers import Scorer, scorers_of
from tracegym.envs.task import Task, class_tools, make_scorers, type_argument
from tracegym.envs.taskset_config import C, ConfigT, TasksetConfig, config_from, first_error
from tracegym.envs.tools import Tool
from tracegym.runtimes.catalog import runtime_for

Row = TaskData | Mapping[str, Any]
R = TypeVar("R", bound=Row)


class Taskset(Generic[ConfigT]):
    """A source of tasks with shared behaviour."""

    id: str = ""
    """The id the registry and traces know it by (`reverse-text`); `id=` sets it on one built from parts."""
    description: str = ""
    """One line saying what the tasks ask and how they are scored."""
    Config: ClassVar[type[TasksetConfig]] = TasksetConfig
    """The config class: the type argument (`Taskset[MyConfig]`), set when the class is defined."""
    task_class: ClassVar[type[Task[Any, Any]]] = Task
    infinite: ClassVar[bool] = False
    """True when `load` never ends; such a taskset must be bounded (`head`) before it is shuffled or run."""
    row_maker: ClassVar[Callable[[random.Random, Any, int], Row] | None] = None
    """A generated taskset's `make_row(rng, config, index)`: then `load` returns `seeded_rows(row_maker, config,
    config.num_tasks)`, or an endless stream when `infinite` (the config needs `num_tasks` unless it is)."""
    runtime_override: str | None = None
    """The runtime every task's sandbox opens in, over its task class's choice (`with_runtime`); None: theirs."""
    harness_override: Harness | None = None
    """What drives every rollout, over its task class's `harness` (`with_harness`); None: theirs."""
    shows_images: bool = False
    """Its tasks show the model images (in their prompts or tool results): a model that takes text only is refused
    before any rollout (`envs.image_input`). A taskset whose rows' prompts hold images is found out without it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        named = type_argument(cls, Taskset, cls.Config)
        own = cls.__dict__.get("Config", named)
        if own is not named:
            raise TypeError(f"{cls.__name__}: Config = {own.__name__} differs from its type argument {named.__name__}")
        cls.Config = named
        if cls.row_maker is not None and not cls.infinite and "num_tasks" not in named.model_fields:
            raise TypeError(f"{cls.__name__}: row_maker needs {named.__name__}.num_tasks (or infinite = True)")

    def __init__(
        self,
        config: ConfigT | Mapping[str, Any] | None = None,
        *,
        id: str | None = None,
        description: str | None = None,
        data: Iterable[Row] | None = None,
        rewards: Sequence[Callable[..., Any]] = (),
        metrics: Sequence[Callable[..., Any]] = (),
        stops: Sequence[Callable[..., Any]] = (),
        tools: Sequence[Callable[..., Any]] = (),
        max_turns: int | None = None,
    ) -> None:
        # the class's Config is its type argument, so what config_from validates is a ConfigT
        self.config = cast(ConfigT, config_from(type(self).Config, config, id or type(self).id))
        if id is not None:
            self.id = id
        if description is not None:
            self.description = description
        self._data = data
        self._scorers = make_scorers(rewards, metrics, stops)
        self._tools = [Tool.from_function(f) for f in tools]
        self._max_turns = max_turns
        self._views: tuple[Callable[[Iterable[TaskData]], Iterable[TaskData]], ...] = ()
        self._bounded = not self.infinite
        class_tools(self.task_class)  # a tool with a missing hint or docstring fails here, at load time

    # --- loading -----------------------------------------------------------------------------------------
    def load(self) -> Iterable[Row]:
        """The rows of this taskset, in order: the `row_maker`'s, else the `data` given; override to load them
        another way (a generator may be infinite)."""
        make_row = type(self).row_maker  # read on the class, so a plain function is not bound as a method
        if make_row is not None:
            count = None if self.infinite else cast(Any, self.config).num_tasks  # __init_subclass__ checked it is there
            return seeded_rows(make_row, self.config, count)
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

    def capacity(self) -> int | None:
        """The most rollouts it can run at once (a remote environment holding that many sessions), where known;
        None: no limit of its own. `tracegym eval` runs at most that many whatever `-c` says (noted)."""
        return None

    def __len__(self) -> int:
        if not self._bounded:
            raise UsageError(f"taskset {self.id!r} is infinite; bound it with head(n) first")
        return sum(1 for _ in self)

    def head(self, n: int) -> Self:
        """A view of the first `n` tasks."""
        view = self._with_view(lambda rows: itertools.islice(rows, n))
        view._bounded = True
        return view

    def shuffle(self, seed: int = 0, bound: int | None = None) -> Self:
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

    def _with_view(self, view: Callable[[Iterable[TaskData]], Iterable[TaskData]]) -> Self:
        clone = copy.copy(self)
        clone._views = (*self._views, view)
        return clone

    # --- building tasks ----------------------------------------------------------------------------------
    @property
    def scorers(self) -> list[Scorer]:
        """Every scorer its tasks run, unbound: the task class's own, then those given to the taskset."""
        return [*scorers_of(self.task_class), *self._scorers]

    @property
    def data_class(self) -> type[TaskData]:
        """The row type: the task class's (`class MyTask(Task[MyData])`), decided there once."""
        return self.task_class.data_class

    def as_data(self, row: Row) -> TaskData:
        """A row as this taskset's TaskData type (rows read back from a trace or the wire included)."""
        if isinstance(row, self.data_class):
            return row
        fields = row.model_dump() if isinstance(row, TaskData) else dict(row)
        try:
            return self.data_class.model_validate(fields)
        except ValidationError as exc:
            raise UsageError(f"taskset {self.id!r}: bad task row: {first_error(exc)}") from None

    def task(self, row: Row) -> Task[Any, ConfigT]:
        """A fresh Task for one rollout of this row."""
        return self.task_class(self.as_data(row), **self._task_options())

    def with_runtime(self, name: str | None) -> Self:
        """This taskset with every task's sandbox opened in runtime `name` (under the limits the task gives its
        programs), whatever runtime its task class chooses: a command's `--env.runtime`. None: itself."""
        if name is None:
            return self
        runtime_for(name)  # an unknown name fails here, listing the known ones
        clone = copy.copy(self)
        clone.runtime_override = name
        return clone

    def with_harness(self, choice: HarnessChoice | None) -> Self:
        """This taskset with every rollout driven by the agent program `choice` describes instead of its task
        class's harness (tracegym's own turn loop, by default): a command's `--env.harness.*`. None: itself. A
        multi-agent taskset is refused by name: a program plays one seat's rollout, not an episode."""
        from tracegym.envs.multi_agent import is_multi_agent  # it imports this module

        if choice is None:
            return self
        if is_multi_agent(self):
            raise UsageError(f"harness: taskset {self.id!r} is multi-agent; a program harness drives a single "
                             "rollout, not an episode of several seats")
        clone = copy.copy(self)
        clone.harness_override = choice.harness()
        return clone

    def _task_options(self) -> dict[str, Any]:
        """What every Task of this taskset is built with besides its row (a task class that needs more adds it)."""
        override: dict[str, Any] = {"runtime": self.runtime_override} if self.runtime_override is not None else {}
        if self.harness_override is not None:
            override["harness"] = self.harness_override
        return {"config": self.config, "scorers": self._scorers, "tools": self._tools, "taskset_id": self.id,
                "max_turns": self._max_turns, **override}


def seeded_rows(make_row: Callable[[random.Random, C, int], R], config: C, count: int | None) -> Iterator[R]:
    """Generated rows `make_row(rng, config, 0)`, `make_row(rng, config, 1)`, ... drawn in order from one
    `random.Random(config.seed)`: `count` of them, or an endless stream when None. The same seed gives the same
    rows (and keys) on every run, which resume and rescoring rely on."""
    rng = random.Random(config.seed)
    for index in itertools.count() if count is None else range(count):
        yield make_row(rng, config, index)
