"""Task: a TaskData plus behaviour (scorers, tools, environment responses); one instance per rollout.

Subclass Task to give behaviour as methods: decorate rewards, metrics and stops, list tools in `tools`,
and override `setup`, `prompt` or `env_response`. Tasksets build a fresh Task for every rollout, so instance
state (a game board, a sandbox handle) is never shared between concurrent rollouts.

A Task is generic over its row type and its taskset's config type: in `class SortTask(Task[SortData,
SortConfig])`, `self.data` is a SortData and `self.config` the taskset's SortConfig, for the type checker and
at run time (rows are read as the first type argument). `Task[SortData]` alone leaves the config a
TasksetConfig; a bare `Task` reads plain TaskData rows.

Overriding a decorated reward, metric or stop in a subclass: the most-derived method runs. Without a
decorator it keeps the base's settings (kind, weight, order, name); with one, its own decorator's settings
replace them; `exact = None` in the subclass makes `exact` no scorer at all.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, cast

from typing_extensions import TypeVar

from tracegym.core.errors import StageTimeout
from tracegym.core.messages import Message
from tracegym.core.task_data import TaskData
from tracegym.core.tool_spec import ToolSpec
from tracegym.envs.scorers import Scorer, as_scorer, call_maybe_async, scorers_of
from tracegym.envs.task_sandbox import TaskSandbox
from tracegym.envs.taskset_config import ConfigT, TasksetConfig
from tracegym.envs.tools import Tool
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.sandbox import Runtime, Sandbox

if TYPE_CHECKING:
    from tracegym.core.trace import Trace
    from tracegym.envs.harness import Harness, ProgramRun

EnvResponse = str | Message | list[Message] | None
DataT = TypeVar("DataT", bound=TaskData, default=TaskData, covariant=True)
"""A task's row type: `Task[MyData]` reads `self.data` as a MyData."""
T = TypeVar("T")
_TOOL_CACHE = "_tool_cache"


class Task(Generic[DataT, ConfigT]):
    """Behaviour for one TaskData. Class attributes are defaults; the taskset may add scorers and tools."""

    data_class: ClassVar[type[TaskData]] = TaskData
    """The row type, taken from the first type argument (`Task[MyData]`); rows are validated into it."""
    _config_class: ClassVar[type[TasksetConfig]] = TasksetConfig
    """The config type, taken from the second type argument; a task built without a taskset reads its defaults."""
    tools: ClassVar[Sequence[Callable[..., Any]]] = ()
    """Plain functions offered to the model as tools."""
    max_turns: int = 10
    """Model turns before the rollout ends with `max_turns` (the taskset's `max_turns=` overrides it)."""
    parallel_tools: ClassVar[bool] = True
    """Run several tool calls of one turn concurrently (False for tools that share mutable state)."""
    tool_result_limit: ClassVar[int | None] = 100_000
    """Characters of one tool result's text the model is shown (about 25k tokens); None: no limit. A longer result
    is cut or refused as `tool_result_over` says, never passed on whole (a 70k-token result overflows most
    contexts: the next model call would end the rollout overlong)."""
    tool_result_over: ClassVar[Literal["cut", "refuse"]] = "cut"
    """What becomes of a tool result over `tool_result_limit`: `cut` (its text up to the limit, then a note saying
    how much was left out; counted in the trace's `tool_results_cut` metric) or `refuse` (the call fails as a tool
    error the model is told of, naming the limit)."""
    harness: Harness | None = None
    """What drives a rollout after `setup`: None runs tracegym's own turn loop; a `ProgramHarness` runs an agent
    program whose model calls come through the interception proxy (`envs.harness`)."""
    program: ProgramRun | None = None
    """This rollout's agent program once a program harness has started it: exit status, bounded output, working
    directory (for rewards; the directory is removed after scoring)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.data_class = type_argument(cls, Task, cls.data_class)
        cls._config_class = type_argument(cls, Task, cls._config_class, index=1)

    def __init__(
        self,
        data: DataT,
        *,
        config: ConfigT | None = None,
        scorers: Sequence[Scorer] = (),
        tools: Sequence[Tool] = (),
        taskset_id: str = "",
        max_turns: int | None = None,
        runtime: str | None = None,
        harness: Harness | None = None,
    ) -> None:
        self.data = data
        # the class's _config_class is its type argument, so its defaults are a ConfigT
        self.config = config if config is not None else cast(ConfigT, self._config_class())
        """The taskset's config (the same object for all its tasks); the config class's defaults without one."""
        self.taskset_id = taskset_id
        if max_turns is not None:
            self.max_turns = max_turns
        own = [s.bind(self) for s in scorers_of(type(self))]
        self.scorers: list[Scorer] = sorted([*own, *scorers], key=lambda s: s.order)
        self._tools: dict[str, Tool] = {t.name: t for t in [*class_tools(type(self)), *tools]}
        self._sandbox: TaskSandbox | None = None
        self.runtime_override = runtime
        """The runtime the command's config names for this task's env (`--env.runtime`), over `runtime()`'s."""
        if harness is not None:  # the command's config names the env's harness (`--env.harness.*`)
            self.harness = harness

    # --- hooks to override -------------------------------------------------------------------------------
    async def setup(self) -> None:
        """Prepare per-rollout state before the first model call."""

    def prompt(self) -> list[Message]:
        """The messages the rollout starts from (default: the task data's system prompt and prompt)."""
        return self.data.initial_messages()

    async def env_response(self, trace: Trace) -> EnvResponse:
        """Answer an assistant turn that made no tool call; None (the default) ends the rollout."""
        return None

    def tool_error_text(self, exc: Exception) -> str:
        """What the model reads when a tool call failed (`exc`: what it raised, a bad argument, or its timeout)."""
        return f"Error: {exc}" if isinstance(exc, StageTimeout) else f"Error: {type(exc).__name__}: {exc}"

    def gold(self) -> str | Message | list[str | Message] | None:
        """What a correct agent replies, for `tracegym validate` (the gold must pass; an empty reply must not): one
        reply for every turn, or a list of them, one per turn (a Message may call tools). Default: the row's
        answer as text; None (not checked) when it has none. Override where the answer is not the reply itself
        (markup around it, a tool to call first, code to write)."""
        return None if self.data.answer is None else str(self.data.answer)

    async def cleanup(self) -> None:
        """Release per-rollout resources; runs however the rollout ended. The base closes the rollout's sandbox:
        an override of a task that uses one calls `await super().cleanup()`."""
        if self._sandbox is not None:
            await self._sandbox.close()

    def sandbox_records(self) -> dict[str, float]:
        """What this rollout's sandbox saw its programs do outside the task, as trace metrics (`TaskSandbox.records`);
        empty when it opened none."""
        return {} if self._sandbox is None else self._sandbox.records()

    def runtime(self) -> Runtime:
        """Where this rollout's sandboxed tools and programs run (`sandbox()`): a limited subprocess under default
        limits; override to choose another runtime or limits (from the taskset's config, say)."""
        return runtime_for("subprocess")

    def sandbox_runtime(self) -> Runtime:
        """The runtime this rollout's sandbox opens: `runtime()`, or the one the command's config names for the
        env (`runtime_override`) under the limits `runtime()` gives its programs."""
        own = self.runtime()
        if self.runtime_override is None:
            return own
        return runtime_for(self.runtime_override, getattr(own, "limits", None))

    async def sandbox(self) -> Sandbox:
        """This rollout's sandbox, opened on first use (RuntimeUnavailable when `runtime()` cannot run on this
        host) and closed by `cleanup`."""
        return await self._rollout_sandbox().get()

    def _rollout_sandbox(self) -> TaskSandbox:
        if self._sandbox is None:
            self._sandbox = TaskSandbox(self.sandbox_runtime())
        return self._sandbox

    # --- used by the rollout loop ------------------------------------------------------------------------
    def tool(self, name: str) -> Tool | None:
        """The tool of that name, if the task offers it; a sandboxed one calls into this rollout's sandbox."""
        found = self._tools.get(name)
        if found is None or not found.sandboxed:
            return found
        return found.bound_to(functools.partial(self._rollout_sandbox().call_tool, found.fn))

    def tool_specs(self) -> list[ToolSpec]:
        """Specs of every tool offered to the model."""
        return [t.spec for t in self._tools.values()]

    def scorers_of_kind(self, kind: str) -> list[Scorer]:
        """The task's rewards, metrics or stops, in evaluation order."""
        return [s for s in self.scorers if s.kind == kind]

    async def call_scorer(self, scorer: Scorer, trace: Trace | list[Trace]) -> Any:
        """Run one scorer; methods get `(trace)`, plain functions `(task, trace)` (a group scorer: the group's
        traces in place of the trace)."""
        if getattr(scorer.fn, "__self__", None) is self:
            return await call_maybe_async(scorer.fn, trace)
        return await call_maybe_async(scorer.fn, self, trace)


def type_argument(cls: type, generic: type, default: type[T], index: int = 0) -> type[T]:
    """The class `cls` names as type argument `index` of `generic` (or of a generic subclass of it that keeps
    its type parameters in the same order) in its own bases, else `default`: for
    `class SortTask(Task[SortData, SortConfig])` and `generic=Task`, SortData (index 1: SortConfig)."""
    for base in cls.__dict__.get("__orig_bases__", ()):
        origin, named = typing.get_origin(base), typing.get_args(base)[index:index + 1]
        if isinstance(origin, type) and issubclass(origin, generic) and named and isinstance(named[0], type):
            return named[0]
    return default


def class_tools(cls: type[Task[Any, Any]]) -> list[Tool]:
    """The Tools of a Task class's `tools` attribute, derived once per class."""
    cache = cls.__dict__.get(_TOOL_CACHE)
    if cache is None:
        cache = [Tool.from_function(fn) for fn in cls.tools]
        setattr(cls, _TOOL_CACHE, cache)
    return cache


def make_scorers(rewards: Sequence[Callable[..., Any]], metrics: Sequence[Callable[..., Any]],
                 stops: Sequence[Callable[..., Any]]) -> list[Scorer]:
    """Scorers from plain or decorated functions given to a taskset."""
    return [
        *(as_scorer(f, "reward") for f in rewards),
        *(as_scorer(f, "metric") for f in metrics),
        *(as_scorer(f, "stop") for f in stops),
    ]
