"""Task: a TaskData plus behaviour (scorers, tools, environment responses); one instance per rollout.

Subclass Task to give behaviour as methods: decorate rewards, metrics and stops, list tools in `tools`,
and override `setup`, `prompt` or `env_response`. Tasksets build a fresh Task for every rollout, so instance
state (a game board, a sandbox handle) is never shared between concurrent rollouts.

Overriding a decorated reward, metric or stop in a subclass: the most-derived method runs. Without a
decorator it keeps the base's settings (kind, weight, order, name); with one, its own decorator's settings
replace them; `exact = None` in the subclass makes `exact` no scorer at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from tracegym.core.messages import Message
from tracegym.core.task_data import TaskData
from tracegym.core.tool_spec import ToolSpec
from tracegym.envs.scorers import Scorer, as_scorer, call_maybe_async, scorers_of
from tracegym.envs.tools import Tool

if TYPE_CHECKING:
    from tracegym.core.trace import Trace

EnvResponse = str | Message | list[Message] | None


class Task:
    """Behaviour for one TaskData. Class attributes are defaults; the taskset may add scorers and tools."""

    tools: ClassVar[Sequence[Callable[..., Any]]] = ()
    """Plain functions offered to the model as tools."""
    max_turns: ClassVar[int] = 10
    """Model turns before the rollout ends with `max_turns`."""
    parallel_tools: ClassVar[bool] = True
    """Run several tool calls of one turn concurrently (False for tools that share mutable state)."""

    def __init__(
        self,
        data: TaskData,
        *,
        scorers: Sequence[Scorer] = (),
        tools: Sequence[Tool] = (),
        taskset_id: str = "",
        max_turns: int | None = None,
    ) -> None:
        self.data = data
        self.taskset_id = taskset_id
        self.max_turns = max_turns if max_turns is not None else type(self).max_turns  # type: ignore[misc]
        own = [s.bind(self) for s in scorers_of(type(self))]
        self.scorers: list[Scorer] = sorted([*own, *scorers], key=lambda s: s.order)
        self._tools: dict[str, Tool] = {t.name: t for t in [*class_tools(type(self)), *tools]}

    # --- hooks to override -------------------------------------------------------------------------------
    async def setup(self) -> None:
        """Prepare per-rollout state before the first model call."""

    def prompt(self) -> list[Message]:
        """The messages the rollout starts from (default: the task data's system prompt and prompt)."""
        return self.data.initial_messages()

    async def env_response(self, trace: Trace) -> EnvResponse:
        """Answer an assistant turn that made no tool call; None (the default) ends the rollout."""
        return None

    async def cleanup(self) -> None:
        """Release per-rollout resources; runs however the rollout ended."""

    # --- used by the rollout loop ------------------------------------------------------------------------
    def tool(self, name: str) -> Tool | None:
        """The tool of that name, if the task offers it."""
        return self._tools.get(name)

    def tool_specs(self) -> list[ToolSpec]:
        """Specs of every tool offered to the model."""
        return [t.spec for t in self._tools.values()]

    def scorers_of_kind(self, kind: str) -> list[Scorer]:
        """The task's rewards, metrics or stops, in evaluation order."""
        return [s for s in self.scorers if s.kind == kind]

    async def call_scorer(self, scorer: Scorer, trace: Trace) -> Any:
        """Run one scorer; methods get `(trace)`, plain functions `(task, trace)`."""
        if getattr(scorer.fn, "__self__", None) is self:
            return await call_maybe_async(scorer.fn, trace)
        return await call_maybe_async(scorer.fn, self, trace)


def class_tools(cls: type[Task]) -> list[Tool]:
    """The Tools of a Task class's `tools` attribute, derived once per class."""
    cache = cls.__dict__.get("_tool_cache")
    if cache is None:
        cache = [Tool.from_function(fn) for fn in cls.tools]
        cls._tool_cache = cache  # type: ignore[attr-defined]
    return cache


def make_scorers(rewards: Sequence[Callable[..., Any]], metrics: Sequence[Callable[..., Any]],
                 stops: Sequence[Callable[..., Any]]) -> list[Scorer]:
    """Scorers from plain or decorated functions given to a taskset."""
    return [
        *(as_scorer(f, "reward") for f in rewards),
        *(as_scorer(f, "metric") for f in metrics),
        *(as_scorer(f, "stop") for f in stops),
    ]
