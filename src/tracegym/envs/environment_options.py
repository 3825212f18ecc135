"""Environment options: what a TRL environment class named as a taskset id (`path/file.py:EnvClass`) runs with.

A TRL user has an environment class (or TRL's dict of them), reward functions written for it and a dataset of
rows; `tracegym eval path/file.py:EnvClass --taskset.rows rows.jsonl --taskset.rewards reward_func` runs them
as written. The registry turns such a class into a taskset factory here, so it is called with no config (TRL's
classes take none) and its options are typed `--taskset.*` flags like any taskset's.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import Field

from tracegym.core.errors import UsageError
from tracegym.envs.environment import EnvironmentTaskset
from tracegym.envs.scorers import reward
from tracegym.envs.taskset import Taskset
from tracegym.envs.taskset_config import TasksetConfig, config_from


class EnvironmentOptions(TasksetConfig):
    """Options of a TRL environment class run as a taskset."""

    rows: str | None = None
    """A file of task rows as a TRL dataset holds them (JSON Lines, one object a line, or a JSON list): `prompt`
    (chat messages or text) and the columns `reset(**row)` reads; with a dict of classes, an `environment` column.
    Unset: the class owns its data (its `reset` returns the prompt), an endless stream: bound it with -n."""
    rewards: list[str] = Field(default_factory=list)
    """Reward functions written for TRL (e.g. `reward_func(environments, **kwargs)`): names of functions in the
    class's own file, or `package.module:function`. A class's `get_reward` is a reward too (weight 1)."""
    reward_weights: list[float] | None = None
    """One weight per reward function, as TRL's `reward_weights`; unset: 1 each."""


def is_environment(target: Any) -> bool:
    """True for what TRL's `environment_factory` takes and tracegym's registry would otherwise call with a config:
    a class (not a Taskset) with a `reset` method, or a dict of such classes."""
    if isinstance(target, Mapping):
        return bool(target) and all(is_environment(v) for v in target.values())
    return isinstance(target, type) and not issubclass(target, Taskset) and callable(getattr(target, "reset", None))


def environment_target(target: Any, name: str) -> Any:
    """`target` itself, or for an environment class (or dict of them) a factory of its taskset named `name`."""
    if not is_environment(target):
        return target
    classes = list(target.values()) if isinstance(target, Mapping) else [target]
    for cls in classes:
        _check_made_without_arguments(cls, name)
    module = sys.modules.get(classes[0].__module__)

    def build(config: EnvironmentOptions | Mapping[str, Any] | None = None) -> EnvironmentTaskset[EnvironmentOptions]:
        options = config_from(EnvironmentOptions, config, name)
        data = read_rows(options.rows) if options.rows else None
        taskset = EnvironmentTaskset(target, options, id=name, data=data, rewards=reward_functions(options, module))
        if not options.rewards and not taskset.environments.own_rewards():
            where = f" in {module.__file__}" if module is not None and module.__file__ else ""
            raise UsageError(f"taskset {name!r} has no reward: name its reward functions with --taskset.rewards NAME "
                             f"(functions{where}), or give the class a get_reward method (as TRL requires one)")
        return taskset

    build.__name__ = build.__qualname__ = name
    return build


def _check_made_without_arguments(cls: type, name: str) -> None:
    """Refuse, before any rollout, a class TRL's environment_factory could not make: TRL calls it with no
    arguments."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # no signature to read: making one says what it takes
        return
    needed = [p.name for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if needed:
        raise UsageError(f"taskset {name!r}: {cls.__name__}() needs {', '.join(repr(n) for n in needed)}, but an "
                         "environment class is made with no arguments (as TRL's environment_factory makes it): give "
                         "them defaults or read them from the environment")


def reward_functions(options: EnvironmentOptions, module: ModuleType | None) -> list[Callable[..., Any]]:
    """The named reward functions, each with its weight."""
    weights = options.reward_weights
    if weights is not None and len(weights) != len(options.rewards):
        raise UsageError(f"--taskset.reward-weights has {len(weights)} weights for {len(options.rewards)} rewards")
    functions = [_function(name, module) for name in options.rewards]
    return functions if weights is None else [_weighted(f, w) for f, w in zip(functions, weights, strict=True)]


def _function(spec: str, module: ModuleType | None) -> Callable[..., Any]:
    module_name, _, attr = spec.rpartition(":")
    try:
        source = import_module(module_name) if module_name else module
    except ImportError as exc:
        raise UsageError(f"--taskset.rewards {spec!r}: cannot import {module_name!r} ({exc})") from None
    fn = getattr(source, attr, None)
    if not callable(fn):
        where = module_name or (source.__name__ if source is not None else "the class's module")
        raise UsageError(f"--taskset.rewards {spec!r}: no function {attr!r} in {where}")
    return fn


def _weighted(fn: Callable[..., Any], weight: float) -> Callable[..., Any]:
    """`fn` under its own name with a weight, marking a wrapper (the user's function is left as it is)."""

    @functools.wraps(fn)
    def weighted(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return reward(weighted, weight=weight, name=fn.__name__)


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows from a JSON Lines file (or one JSON list); a bad line is a UsageError naming the file and line."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--taskset.rows {path!r}: no such file")
    text = file.read_text()
    if text.lstrip().startswith("["):
        rows = _parsed(text, path, 1)
        if not isinstance(rows, list):
            raise UsageError(f"--taskset.rows {path!r}: not a JSON list of rows")
        numbered = list(enumerate(rows, start=1))
    else:
        numbered = [(n, _parsed(line, path, n)) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    bad = next((n for n, row in numbered if not isinstance(row, dict)), None)
    if bad is not None:
        raise UsageError(f"--taskset.rows {path!r}: row {bad} is not a JSON object")
    return [row for _, row in numbered]


def _parsed(text: str, path: str, line: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--taskset.rows {path!r}: line {line + exc.lineno - 1}: {exc.msg}") from None
