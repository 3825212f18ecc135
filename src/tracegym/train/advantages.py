"""Advantages: how much better each rollout of a group did than its baseline, and which groups carry no signal.

An advantage function maps one group's rewards to one advantage per rollout:
`fn(rewards: Sequence[float], *, key: str = "") -> list[float]`. `key` names what the baseline belongs to
(`baseline_key`: the taskset, the task and, in a multi-agent episode, the member) for functions that keep state
across steps; plain functions may leave it out. The default is `group_mean` (reward minus the group's mean,
optionally divided by its std); `RAE` is SPIRAL's role-conditioned EMA baseline for multi-agent self-play. Any
function or class can be named by import path (`"package.module:function"`); a stateful one (`RAE`,
`EMABaseline`) has `state_dict()` / `load_state_dict()` so its state is checkpointed with the run. The RL
config's `[orchestrator.advantage]` section (`AdvantageConfig`) picks one; `build_advantages` makes it.

Groups are hierarchical when `per_episode` names members (glob patterns on member ids): each episode's matching
members form one group of their own (`episode_group_key`: e.g. a proposer-solver episode's solvers, grouped by the
task proposed in it), while the other members keep their baseline key (the proposer: per task, i.e. by its prompt,
across the group's episodes). Two levels, each with its own baseline, as prime-rl's hierarchical GRPO has them.

>>> group_mean([1.0, 0.0, 0.0, 1.0])
[0.5, -0.5, -0.5, 0.5]
>>> adv = GroupAdvantages(group_mean)
>>> adv([0.3, 0.3, 0.3]) is None, adv.filtered
(True, 1)
>>> RAE(alpha=0.9)([1.0, 1.0], key="kuhn-poker/deal-3/player_0")
[0.9, 0.81]
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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


class RAE:
    """Role-conditioned advantage estimation (SPIRAL, arXiv 2506.24119, Algorithm 1): one exponential moving
    average baseline per key (taskset, task, member), updated with each reward *before* it is subtracted:
    `b <- alpha * b + (1 - alpha) * R; A = R - b`. A key seen for the first time starts at b = 0. Each reward
    of a group is one update, in order, so it works with groups of one.
    """

    def __init__(self, alpha: float = 0.9) -> None:
        if not 0.0 < alpha < 1.0:
            raise UsageError(f"RAE alpha must be in (0, 1), got {alpha}")
        self.alpha = alpha
        self.baselines: dict[str, float] = {}

    def __call__(self, rewards: Sequence[float], *, key: str = "") -> list[float]:
        baseline = self.baselines.get(key, 0.0)
        advantages = []
        for reward in rewards:
            baseline = self.alpha * baseline + (1.0 - self.alpha) * reward
            advantages.append(reward - baseline)
        if advantages:
            self.baselines[key] = baseline
        return advantages

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The baselines of a checkpoint (alpha stays the configured one: a resume may change it on purpose)."""
        self.baselines = {str(k): float(v) for k, v in state["baselines"].items()}


def baseline_key(taskset: str, task_key: str, member: str | None = None) -> str:
    """What a stateful baseline is kept per: `taskset/task_key/member` (parts that are unset left out, so a
    single-agent trace of an unnamed taskset is keyed by its task alone)."""
    return "/".join(part for part in (taskset, task_key, member) if part)


def episode_group_key(taskset: str, task_key: str, episode_id: str, member: str,
                      per_episode: Sequence[str]) -> str | None:
    """The key of the per-episode group `member` joins (`taskset/task/episode-ID/PATTERN`, the first pattern of
    `per_episode` its id matches), or None when it matches none (its usual `baseline_key` then applies)."""
    pattern = next((p for p in per_episode if fnmatch.fnmatchcase(member, p)), None)
    return None if pattern is None else baseline_key(taskset, task_key, f"episode-{episode_id}/{pattern}")


def has_signal(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """False when every reward of the group is the same (within `tol`): no rollout is better than another."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > tol


def load_advantage_fn(path: str = DEFAULT_ADVANTAGE, **options: Any) -> AdvantageFn:
    """The advantage function named `"package.module:name"`; a class is instantiated with `options`, a
    function gets them as keyword arguments (`load_advantage_fn(DEFAULT_ADVANTAGE, std=True)`)."""
    target = import_advantage(path)
    if isinstance(target, type):
        return _accepting_key(target(**options))
    if not callable(target):
        raise UsageError(f"{path!r} is not callable")
    return _accepting_key(functools.partial(target, **options) if options else target)


def import_advantage(path: str) -> Any:
    """The object `"package.module:name"` names (not yet instantiated or bound to options)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"advantage function must be given as 'package.module:name', got {path!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load advantage function {path!r}: {exc}") from None


def _accepting_key(fn: Callable[..., list[float]]) -> AdvantageFn:
    """`fn` itself when it takes `key=`; else a wrapper that drops it (so plain `f(rewards)` functions work)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    if "key" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn

    @functools.wraps(fn)
    def without_key(rewards: Sequence[float], *, key: str = "") -> list[float]:
        return fn(rewards)

    if isinstance(fn, Stateful):  # keep the state reachable through the wrapper
        without_key.state_dict = fn.state_dict
        without_key.load_state_dict = fn.load_state_dict
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
        """Counts and the function's state; a stateful function resumed from a state without its own is an
        error (a silent cold start would change the run)."""
        self.groups, self.filtered = int(state["groups"]), int(state["filtered"])
        if isinstance(self.fn, Stateful):
            if "fn" not in state:
                raise UsageError("the checkpoint holds no state of the advantage function (it was made with another "
                                 "[orchestrator.advantage]); resume with the advantage the run had, or start a new run")
            self.fn.load_state_dict(state["fn"])


BUILT_IN = {"group_mean": "tracegym.train.advantages:group_mean", "rae": "tracegym.train.advantages:RAE"}
"""Advantages named without an import path."""


class AdvantageConfig(BaseModel):
    """How advantages are computed (`[orchestrator.advantage]`), whatever the episodes fan out into."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = "group_mean"
    """`group_mean` (reward minus its group's mean), `rae` (SPIRAL's role-conditioned EMA baseline per (taskset,
    task, member), updated before it is subtracted; works with groups of one), or your own function or class as
    `package.module:name` (called as `fn(rewards, *, key)`, or `fn(rewards)`)."""
    alpha: float = Field(default=0.9, gt=0.0, lt=1.0)
    """RAE's EMA decay: `b <- alpha * b + (1 - alpha) * R`."""
    std: bool = False
    """group_mean: divide by the group's reward std."""
    filter_no_signal: bool | None = None
    """Drop groups whose rewards are all equal (they carry no group-relative gradient); unset: on for group
    baselines (group_mean, an import path), off for rae (whose baseline is not the group's)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for your own function or class."""
    baseline_per: Literal["task", "taskset"] = "task"
    """What a multi-agent member's baseline is kept per: each (taskset, task, member), or (taskset, member) as
    SPIRAL keys it (one baseline per game and role: with many distinct deals, few tasks repeat)."""
    per_episode: tuple[str, ...] = ()
    """Hierarchical groups: members (glob patterns on member ids, e.g. `["solver_*"]`) whose units are grouped per
    episode, all the members one pattern matches in one episode together (a proposer-solver episode's solvers:
    grouped by the task proposed in it); the others keep their groups per (task, member) (the proposer: by its
    prompt, across the group's episodes). Empty: every member per (task, member)."""

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in BUILT_IN and ":" not in name:
            raise ValueError(f"unknown advantage {name!r}: use {', '.join(BUILT_IN)} or 'package.module:name'")
        if name not in BUILT_IN:
            try:  # an import path that does not load fails here, at config load
                import_advantage(name)
            except UsageError as exc:
                raise ValueError(str(exc)) from None
        return name

    @model_validator(mode="after")
    def _options_fit(self) -> AdvantageConfig:
        # a default value is not "given": the resolved config (every field written out) must load again
        wrong = {"alpha": self.name != "rae", "std": self.name != "group_mean", "options": self.name in BUILT_IN}
        default = AdvantageConfig.model_fields
        given = sorted(f for f, applies in wrong.items()
                       if applies and getattr(self, f) != default[f].get_default(call_default_factory=True))
        if given:
            raise ValueError(f"{', '.join(given)} does not apply to advantage {self.name!r}")
        if self.per_episode and self.name == "rae":
            raise ValueError("per_episode does not apply to advantage 'rae': an episode's group never repeats, so "
                             "its EMA baseline would start cold every time (use group_mean)")
        if any(not p.strip() for p in self.per_episode):
            raise ValueError("per_episode: a member pattern is empty")
        return self

    @property
    def filters(self) -> bool:
        """Whether groups without signal are dropped."""
        return self.filter_no_signal if self.filter_no_signal is not None else self.name != "rae"


def build_advantages(config: AdvantageConfig) -> GroupAdvantages:
    """The advantages `config` describes."""
    options: dict[str, dict[str, Any]] = {"rae": {"alpha": config.alpha},
                                          "group_mean": {"std": True} if config.std else {}}
    path = BUILT_IN.get(config.name, config.name)
    return GroupAdvantages(load_advantage_fn(path, **options.get(config.name, config.options)),
                           filter_no_signal=config.filters)
