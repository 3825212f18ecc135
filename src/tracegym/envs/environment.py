"""Environment tasks: class-based environments in TRL's `environment_factory` shape, run unmodified.

The contract: a zero-argument constructor; `reset(**fields)` receives the task's fields and may return text
appended to the prompt; every public method (not static, not a class method, not `reset`) is a tool; rewards
read state back from the instance. One instance per rollout, never shared. Reward functions may be TRL-shaped,
`fn(prompts, completions, environments, **columns) -> list[float]` (each column a list, one value per
completion, as TRL passes them), or tracegym-shaped, `fn(task, trace)` with the instance at `task.env`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tracegym.core.messages import Message, user
from tracegym.core.tool_spec import ToolSpec
from tracegym.core.trace import Trace
from tracegym.envs.scorers import _MARK, Scorer, call_maybe_async
from tracegym.envs.task import DataT, Task
from tracegym.envs.taskset import Taskset
from tracegym.envs.taskset_config import ConfigT
from tracegym.envs.tools import Tool


class EnvironmentTask(Task[DataT, ConfigT]):
    """A Task whose tools are the methods of a fresh environment instance (at `self.env` once set up)."""

    parallel_tools = False  # the methods share the instance's state: run a turn's calls in order

    def __init__(self, data: DataT, *, env_factory: Callable[[], Any], env_tools: Sequence[Tool],
                 **options: Any) -> None:
        super().__init__(data, **options)
        self.env_factory = env_factory
        self.env: Any = None
        self._env_tools = list(env_tools)
        self._reset_text: str | None = None

    async def setup(self) -> None:
        self.env = self.env_factory()
        result = await call_maybe_async(self.env.reset, **self.data.fields())
        self._reset_text = None if result is None else str(result)
        self._tools.update({t.name: t.bound_to(getattr(self.env, t.name)) for t in self._env_tools})

    def tool_specs(self) -> list[ToolSpec]:
        return [*super().tool_specs(), *(t.spec for t in self._env_tools if t.name not in self._tools)]

    def prompt(self) -> list[Message]:
        messages = super().prompt()
        if not self._reset_text:
            return messages
        last = messages[-1] if messages else None
        if last is not None and last.role == "user" and isinstance(last.content, str):
            return [*messages[:-1], user(f"{last.content}\n\n{self._reset_text}")]
        return [*messages, user(self._reset_text)]


def environment_tools(env_class: type) -> list[Tool]:
    """Tools from a class's public methods; a missing hint or docstring is a UsageError now."""
    tools = []
    for name in dir(env_class):
        if name.startswith("_") or name == "reset":
            continue
        static = inspect.getattr_static(env_class, name)
        if isinstance(static, staticmethod | classmethod | property) or not inspect.isfunction(static):
            continue
        tools.append(Tool.from_function(static, name=name, skip_self=True))
    return tools


def trl_reward(fn: Callable[..., Any]) -> Callable[[Task[Any, Any], Trace], Any]:
    """Adapt a TRL reward function (batched, keyword arguments) to tracegym's `(task, trace)` shape."""

    @functools.wraps(fn)
    async def score(task: Task[Any, Any], trace: Trace) -> float:
        # TRL passes every dataset column but the prompt as a list with one value per completion: a batch of one
        fields = {k: [v] for k, v in task.data.fields().items() if k != "prompt"}
        values = await call_maybe_async(
            fn,
            prompts=[[m.to_openai() for m in trace.prompt]],
            completions=[[m.to_openai() for m in trace.completion]],
            environments=[getattr(task, "env", None)],
            **fields,
        )
        return float(values[0])

    marked: Scorer | None = getattr(fn, _MARK, None)
    if marked is not None:
        setattr(score, _MARK, Scorer(score, marked.kind, marked.name, marked.weight, marked.order))
    return score


def is_trl_reward(fn: Callable[..., Any]) -> bool:
    """True for a reward written for TRL: it takes `environments` or `completions` by keyword."""
    params = inspect.signature(fn).parameters
    return "environments" in params or "completions" in params


class EnvironmentTaskset(Taskset[ConfigT]):
    """A taskset whose tasks run a class-based environment: `EnvironmentTaskset(MyEnv, id=..., data=...)`."""

    task_class = EnvironmentTask

    def __init__(self, env_factory: type, config: ConfigT | Mapping[str, Any] | None = None, *,
                 rewards: Sequence[Callable[..., Any]] = (), **options: Any) -> None:
        self.env_factory = env_factory
        self._env_tools = environment_tools(env_factory)
        adapted = [trl_reward(f) if is_trl_reward(f) else f for f in rewards]
        super().__init__(config, rewards=adapted, **options)

    def _task_options(self) -> dict[str, Any]:
        return {**super()._task_options(), "env_factory": self.env_factory, "env_tools": self._env_tools}
