"""Environment tasks: class-based environments in TRL's `environment_factory` shape, run unmodified.

The contract is TRL's (`GRPOTrainer(environment_factory=...)`): a zero-argument constructor; `reset(**row)` gets
the row's own keys (no others) and may return text, or content blocks, that is appended as is to the prompt's
last message; every public function of the class (static methods too) but `reset` and `get_reward` is a tool,
offered with the schema transformers' `get_json_schema` gives it (`return` included); an optional `get_reward()`
is the environment's own reward (weight 1, named after its class). Reward functions are TRL-shaped (see
`trl_reward`) or tracegym-shaped, `fn(task, trace)` with the instance at `task.env`.

A row without a prompt is an environment that owns its data (its `reset` returns the prompt); with no rows at
all such a taskset is an endless stream of them, as TRL's placeholder dataset. A dict of classes is TRL's
multi-environment shape: each row's `environment` column picks its class and only that class's tools, and is
not passed to `reset`. An environment whose `done` attribute turns true ends the rollout after that turn (TRL's
examples keep one, and raise from their tools once it is set). Instances are pooled as TRL pools them (see
`environment_pool`): made once, reset for each rollout, at most one per concurrent rollout, never shared, closed
when the taskset is closed (`EnvironmentTaskset.close()`, or at the latest when the interpreter exits).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.core.errors import TaskError, UsageError
from tracegym.core.messages import ContentPart, Message, TextPart
from tracegym.core.task_data import TaskData
from tracegym.core.tool_spec import ToolSpec
from tracegym.core.trace import Trace
from tracegym.envs.environment_pool import EnvironmentPool, close_instance
from tracegym.envs.scorers import NotApplicable, call_maybe_async, reward, stop
from tracegym.envs.task import Task
from tracegym.envs.taskset import Row, Taskset
from tracegym.envs.taskset_config import ConfigT
from tracegym.envs.tools import Tool, content_parts
from tracegym.envs.trl_reward import COLUMNS_FIELD, dataset_row, is_trl_reward, trl_reward

RESERVED = ("reset", "get_reward", "close")
"""Method names that are never tools: TRL's `reset` and `get_reward`, and `close`, the hook the pool closes an
instance by (TRL 1.16 would list a public `close` as a tool, and never call it)."""
ENVIRONMENT_COLUMN = "environment"
"""The row column that picks a row's environment from a dict of them."""
EMPTY_PROMPT = ({"role": "user", "content": ""},)
"""The prompt of a row that has none (TRL's): `reset`'s text is appended to it."""

EnvironmentFactory = Callable[[], Any]


class EnvironmentRow(TaskData):
    """A TRL dataset row: any columns, the prompt optional, and the keys the row had (`trl_columns`, set when it
    is loaded), so that `reset(**row)` and reward functions get exactly those."""

    prompt: str | list[Message] = ""
    trl_columns: list[str] | None = None
    """The row's own keys, in order; None for a row that does not say (then every field counts)."""


@dataclass(frozen=True)
class EnvironmentKind:
    """One environment of a taskset: its factory, its class, its tools by method name, and its pool of
    instances."""

    name: str | None
    factory: EnvironmentFactory
    env_class: type
    tools: dict[str, Tool]
    pool: EnvironmentPool


class Environments:
    """The environment class a taskset runs, or TRL's dict of them chosen per row by its `environment` column."""

    def __init__(self, factory: EnvironmentFactory | Mapping[str, EnvironmentFactory]) -> None:
        self.multiple = isinstance(factory, Mapping)
        named: dict[str | None, Any] = ({name: f for name, f in factory.items()} if isinstance(factory, Mapping)
                                        else {None: factory})
        if not named:
            raise UsageError("an environment dict needs at least one environment")
        self.kinds = {name: _kind(name, f) for name, f in named.items()}
        pools = [k.pool for k in self.kinds.values()]
        self._finalizer = weakref.finalize(self, _close_pools, pools)  # at the latest when the interpreter exits

    def close(self) -> None:
        """Close every instance the pools made (the taskset's end); safe to call twice."""
        self._finalizer()

    def kind_for(self, data: TaskData) -> EnvironmentKind | None:
        """The row's environment; None when its `environment` names none of the dict's."""
        return self.kinds.get(getattr(data, ENVIRONMENT_COLUMN, None)) if self.multiple else self.kinds[None]

    def reset_row(self, data: TaskData) -> dict[str, Any]:
        """What `reset` gets: the row's own keys, without the `environment` that chose it."""
        row = dataset_row(data)
        if self.multiple:
            row.pop(ENVIRONMENT_COLUMN, None)
        return row

    def own_rewards(self) -> list[Callable[..., Any]]:
        """The `get_reward` of each class that has one, once per class (a dict may name a class twice)."""
        classes = [k.env_class for k in self.kinds.values() if callable(getattr(k.env_class, "get_reward", None))]
        return [_own_reward(c) for c in dict.fromkeys(classes)]


def _close_pools(pools: list[EnvironmentPool]) -> None:
    for pool in pools:
        pool.close()


def _kind(name: str | None, factory: Any) -> EnvironmentKind:
    label = "environment" if name is None else f"environment {name!r}"
    if not callable(factory):
        raise UsageError(f"{label}: {factory!r} is not a class or a factory")
    env_class = factory if isinstance(factory, type) else _probed_class(factory)
    if not callable(getattr(env_class, "reset", None)):
        raise UsageError(f"{label}: {env_class.__name__} has no reset method (TRL's environment classes need one)")
    return EnvironmentKind(name, factory, env_class, _class_tools(env_class), EnvironmentPool(factory, label))


def _probed_class(factory: Callable[[], Any]) -> type:
    """The class a factory makes: one instance probed, as TRL does, and closed at once (unlike TRL, which keeps
    it: a process that loads the taskset may run no rollout, and must hold no server session for it)."""
    probe = factory()
    close_instance(probe)
    return type(probe)


def _own_reward(env_class: type[Any]) -> Callable[..., Any]:
    async def own(task: EnvironmentTask, trace: Trace) -> float:
        if type(task.env) is not env_class:  # exactly that class, as TRL scores it
            raise NotApplicable
        value = await call_maybe_async(task.counted(task.env.get_reward))
        if value is None:  # TRL: None is "does not apply" (left out of its sum), not an error
            raise NotApplicable
        return value

    return reward(own, name=env_class.__name__)


def environment_tools(env_class: type) -> list[Tool]:
    """The tools of an environment class, TRL's set: what `inspect.getmembers(cls, inspect.isfunction)` lists
    (methods and static methods, not class methods or properties) but `reset`, `get_reward`, `close` and `_names`.
    Each has the schema `get_json_schema` gives it; a missing hint or docstring is a UsageError now."""
    return list(_class_tools(env_class).values())


def _class_tools(env_class: type) -> dict[str, Tool]:
    tools = {}
    for member, fn in inspect.getmembers(env_class, inspect.isfunction):
        if member in RESERVED or member.startswith("_"):
            continue
        static = isinstance(inspect.getattr_static(env_class, member), staticmethod)
        tool = Tool.from_function(fn, name=fn.__name__, skip_self=not static)
        spec = trl_spec(fn)
        tools[member] = dataclasses.replace(tool, spec=spec or tool.spec, text=str)  # TRL: `str(result)`
    return tools


def trl_spec(fn: Callable[..., Any]) -> ToolSpec | None:
    """The schema TRL offers the model for a tool: transformers' `get_json_schema` of it. None without
    transformers, or for a hint it cannot describe (a pydantic model): tracegym's own schema describes those. A
    docstring it cannot read is refused with its reason, as TRL refuses the class (a Google-style `x (int):` line)."""
    try:
        from transformers.utils import get_json_schema  # imported here: a second's import, for env classes only
        from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException
    except ImportError:
        return None
    try:
        function = get_json_schema(fn)["function"]
    except DocstringParsingException as exc:
        raise UsageError(f"tool {fn.__qualname__}: TRL refuses it: {exc} (write each argument as `name: "
                         "description` under Args:, its type in the hint)") from None
    except TypeHintParsingException:
        return None
    return ToolSpec(name=function["name"], description=function.get("description") or "",
                    parameters=function["parameters"], returns=function.get("return"))


def with_observation(messages: list[Message], observation: Any) -> list[Message]:
    """The prompt as TRL assembles it: `reset`'s result appended as is to the last message, text to text,
    content blocks (images) as parts."""
    if observation is None or not messages:
        return messages
    last = messages[-1]
    added: str | list[ContentPart] = content_parts(observation) if isinstance(observation, list) else str(observation)
    if isinstance(added, str) and not isinstance(last.content, list):
        content: str | list[ContentPart] = (last.content or "") + added
    else:
        before = last.content if isinstance(last.content, list) else [TextPart(text=last.content or "")]
        content = [*before, *([TextPart(text=added)] if isinstance(added, str) else added)]
    return [*messages[:-1], last.model_copy(update={"content": content})]


class Calls:
    """How many calls on one environment instance are running (a sync call abandoned at its timeout runs on)."""

    def __init__(self) -> None:
        self.running = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.running += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.running -= 1


class EnvironmentTask(Task[EnvironmentRow, ConfigT]):
    """A Task whose tools are the methods of an environment instance from its pool, reset for this rollout (at
    `self.env` once set up) and given back at cleanup."""

    parallel_tools = False  # the methods share the instance's state: run a turn's calls in order

    def tool_error_text(self, exc: Exception) -> str:
        """TRL's: `str({"error": str(exc)})`."""
        return str({"error": str(exc)})

    def __init__(self, data: EnvironmentRow, *, environments: Environments, **options: Any) -> None:
        super().__init__(data, **options)
        self.environments = environments
        self.kind = environments.kind_for(data)
        self.env: Any = None
        self.observation: Any = None
        """What `reset` returned."""
        self._calls = Calls()
        self._reset = False

    async def setup(self) -> None:
        if self.kind is None:
            raise TaskError(f"the row's {ENVIRONMENT_COLUMN} {getattr(self.data, ENVIRONMENT_COLUMN, None)!r} is "
                            f"not among the environments: {', '.join(map(str, self.environments.kinds))}")
        self.env = await self.kind.pool.take()
        reset = self.counted(self.env.reset)
        self.observation = await call_maybe_async(reset, **self.environments.reset_row(self.data))
        self._reset = True
        self._tools.update({t.name: t.bound_to(self.counted(getattr(self.env, member)))
                            for member, t in self.kind.tools.items()})

    async def cleanup(self) -> None:
        """Give the instance back to its pool: reused when its reset succeeded and no call on it still runs,
        else closed."""
        env, self.env = self.env, None
        if env is not None and self.kind is not None:
            await self.kind.pool.give_back(env, reusable=self._reset and not self._calls.running)
        await super().cleanup()

    def counted(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` (a method of the instance), counted in `_calls` while it runs; sync or async as `fn` is."""
        calls = self._calls
        if inspect.iscoroutinefunction(fn):
            async def counted_async(*args: Any, **kwargs: Any) -> Any:
                with calls:
                    return await fn(*args, **kwargs)
            return functools.wraps(fn)(counted_async)

        def counted(*args: Any, **kwargs: Any) -> Any:
            with calls:
                return fn(*args, **kwargs)
        return functools.wraps(fn)(counted)

    def tool_specs(self) -> list[ToolSpec]:
        own = self.kind.tools.values() if self.kind is not None else ()
        return [*super().tool_specs(), *(t.spec for t in own if t.name not in self._tools)]

    def prompt(self) -> list[Message]:
        return with_observation(super().prompt(), self.observation)

    @stop
    def done(self, trace: Trace) -> bool:
        """The environment says its episode is over (a true `done` attribute)."""
        value = getattr(self.env, "done", False)
        return not callable(value) and bool(value)


class EnvironmentTaskset(Taskset[ConfigT]):
    """A taskset whose tasks run a class-based environment: `EnvironmentTaskset(MyEnv, id=..., data=rows,
    rewards=[...])`, or TRL's dict `{"name": EnvClass, ...}` with an `environment` column in every row. Without
    `data` the environment owns its data: an endless stream of rows without a prompt (bound it: `head(n)`)."""

    task_class = EnvironmentTask

    def __init__(self, env_factory: EnvironmentFactory | Mapping[str, EnvironmentFactory],
                 config: ConfigT | Mapping[str, Any] | None = None, *, data: Iterable[Row] | None = None,
                 rewards: Sequence[Callable[..., Any]] = (), **options: Any) -> None:
        self.environments = Environments(env_factory)
        if data is None and self.environments.multiple:
            raise UsageError(f"a dict of environments needs rows with an {ENVIRONMENT_COLUMN!r} column choosing "
                             "each row's environment (as TRL does): pass data=")
        adapted = [trl_reward(f) if is_trl_reward(f) else f for f in rewards]
        super().__init__(config, data=data, rewards=[*adapted, *self.environments.own_rewards()], **options)
        self._bounded = data is not None

    def close(self) -> None:
        """Close the environment instances this taskset's rollouts made (also at the latest at interpreter exit)."""
        self.environments.close()

    @property
    def env_factory(self) -> Any:
        """The environment class (or the dict of them) this taskset runs."""
        kinds = self.environments.kinds
        return {n: k.factory for n, k in kinds.items()} if self.environments.multiple else kinds[None].factory

    def load(self) -> Iterable[Row]:
        if self._data is None:
            return itertools.repeat({"prompt": list(EMPTY_PROMPT)})
        return self._data

    def as_data(self, row: Row) -> TaskData:
        """A row, remembering which keys it had (a row read back from a trace already says)."""
        if isinstance(row, Mapping) and COLUMNS_FIELD not in row:
            row = {**row, COLUMNS_FIELD: list(row)}
        elif isinstance(row, TaskData) and getattr(row, COLUMNS_FIELD, None) is None:
            row = {**row.fields(), COLUMNS_FIELD: [k for k in row.fields() if k in row.model_fields_set]}
        return super().as_data(row)

    def _task_options(self) -> dict[str, Any]:
        return {**super()._task_options(), "environments": self.environments}
