"""Advantages: how much better each rollout of a group did than its baseline, and which groups carry no signal.

An advantage function maps one group's rewards to one advantage per rollout:
`fn(rewards: Sequence[float], *, key: str = "") -> list[float]`. `key` names what the baseline belongs to
(the task, or the member of a multi-agent episode) for functions that keep state across steps; plain functions
may leave it out. The default is `group_mean` (reward minus the group's mean, optionally divided by its std).
Any function or class can be named by import path (`"package.module:function"`); a stateful one (`EMABaseline`)
has `state_dict()` / `load_state_dict()` so its state is checkpointed with the run.

>>> group_mean([1.0, 0.0, 0.0, 1.0])
[0.5, -0.5, -0.5, 0.5]
>>> adv = GroupAdvantages(group_mean)
>>> adv([0.3, 0.3, 0.3]) is None, adv.filtered
(True, 1)
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from tracegym.core.errors import UsageError

DEFAULT_ADVANTAGE = "tracegym.train.advantages:group_mean"


class AdvantageFn(Protocol):
    """One group's rewards -> one advantage per rollout."""

    def __call__(self, rewards: Sequence[float], *, key: str = "") -> list[float]: ...


@runtime_checkable
class Stateful(Protocol):
    """An advantage function whose state outlives a step and must be checkpointed."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def group_mean(rewards: Sequence[float], *, key: str = "", std: bool = False, eps: float = 1e-6) -> list[float]:
    """Reward minus the group's mean; with `std`, divided by the group's (population) std plus `eps`."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centered = [r - mean for r in rewards]
    if not std:
        return centered
    sd = math.sqrt(sum(c * c for c in centered) / len(centered))
    return [c / (sd + eps) for c in centered]


class EMABaseline:
    """Baseline = an exponential moving average of past mean rewards, one per key (task or member).

    A key seen for the first time starts at its group's mean (so its first advantages equal `group_mean`'s).
    """

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 <= decay < 1.0:
            raise UsageError(f"EMABaseline decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.baselines: dict[str, float] = {}

    def __call__(self, rewards: Sequence[float], *, key: str = "") -> list[float]:
        if not rewards:
            return []
        mean = sum(rewards) / len(rewards)
        baseline = self.baselines.get(key, mean)
        self.baselines[key] = self.decay * baseline + (1.0 - self.decay) * mean
        return [r - baseline for r in rewards]

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay = float(state["decay"])
        self.baselines = {str(k): float(v) for k, v in state["baselines"].items()}


def has_signal(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """False when every reward of the group is the same (within `tol`): no rollout is better than another."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > tol


def load_advantage_fn(path: str = DEFAULT_ADVANTAGE, **options: Any) -> AdvantageFn:
    """The advantage function named `"package.module:name"`; a class is instantiated with `options`, a
    function gets them as keyword arguments (`load_advantage_fn(DEFAULT_ADVANTAGE, std=True)`)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"advantage function must be given as 'package.module:name', got {path!r}")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load advantage function {path!r}: {exc}") from None
    if isinstance(target, type):
        return _accepting_key(target(**options))
    if not callable(target):
        raise UsageError(f"{path!r} is not callable")
    return _accepting_key(functools.partial(target, **options) if options else target)


def _accepting_key(fn: Callable[..., list[float]]) -> AdvantageFn:
    """`fn` itself when it takes `key=`; else a wrapper that drops it (so plain `f(rewards)` functions work)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn  # type: ignore[return-value]
    if "key" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn  # type: ignore[return-value]

    @functools.wraps(fn)
    def without_key(rewards: Sequence[float], *, key: str = "") -> list[float]:
        return fn(rewards)

    if isinstance(fn, Stateful):  # keep the state reachable through the wrapper
        without_key.state_dict = fn.state_dict  # type: ignore[attr-defined]
        without_key.load_state_dict = fn.load_state_dict  # type: ignore[attr-defined]
    return without_key


class GroupAdvantages:
    """What the orchestrator holds: the advantage function, the no-signal filter, and the counts of both.

    `adv(rewards, key=...)` returns the group's advantages, or None when the group is filtered out (all rewards
    equal, when `filter_no_signal`). `state_dict()` covers the counts and the function's own state.
    """

    def __init__(self, fn: AdvantageFn | None = None, *, filter_no_signal: bool = True) -> None:
        self.fn: AdvantageFn = fn if fn is not None else group_mean
        self.filter_no_signal = filter_no_signal
        self.groups = 0
        """Groups seen."""
        self.filtered = 0
        """Groups dropped for having no signal."""

    def __call__(self, rewards: Sequence[float], *, key: str = "") -> list[float] | None:
        self.groups += 1
        if self.filter_no_signal and not has_signal(rewards):
            self.filtered += 1
            return None
        advantages = self.fn(rewards, key=key)
        if len(advantages) != len(rewards):
            raise UsageError(f"advantage function returned {len(advantages)} values for {len(rewards)} rewards")
        return advantages

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"groups": self.groups, "filtered": self.filtered}
        if isinstance(self.fn, Stateful):
            state["fn"] = self.fn.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups, self.filtered = int(state["groups"]), int(state["filtered"])
        if "fn" in state and isinstance(self.fn, Stateful):
            self.fn.load_state_dict(state["fn"])
