"""Scorers: reward, metric and stop functions, marked by decorators, called the same way sync or async.

A scorer is a plain function `(task, trace)` or a Task method `(self, trace)`; it may be async. Rewards carry
a weight (the trace's reward is the weighted sum) and all scorers an order (lower runs first). A reward or
metric returns a real number or a bool (numpy's scalars included); anything else, a numeric string too, is
an error on the trace naming it, and it scores None. The decorators return the function itself, marked, so
editors and type checkers see its own signature.

A group reward or metric (`@reward(group=True)`) scores the rollouts of one task together (e.g. each against the
group's best, or a vote among them): `(task, traces)` or a Task method `(self, traces)`, given the traces of the
group that ended normally (in rollout-index order, each already scored by the others) and returning one number per
trace, in that order. `envs.group_scoring` runs it once the group's rollouts are all done.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, SupportsFloat, TypeGuard, TypeVar, overload

from tracegym.core.errors import TaskError, UsageError
from tracegym.envs.thread_lane import TASK_CODE

ScorerKind = Literal["reward", "metric", "stop"]
_MARK = "__tracegym_scorer__"
_CACHE = "_scorer_cache"
F = TypeVar("F", bound=Callable[..., Any])


class NotApplicable(Exception):
    """Raised by a reward or metric that does not apply to this rollout (TRL's `None`, e.g. a reward of another
    environment in a multi-environment run): nothing is recorded for it, and the total is over the others."""


@dataclass(frozen=True)
class Scorer:
    """A scoring function with what the rollout loop needs to know about it."""

    fn: Callable[..., Any]
    kind: ScorerKind
    name: str
    weight: float = 1.0
    order: int = 0
    group: bool = False
    """Scores a task's group of rollouts at once (`envs.group_scoring`), not each rollout alone."""

    def number(self, value: object) -> float:
        """A reward's or metric's result as a float. Any real number is one (int, float, bool, Fraction, numpy's
        scalars); anything else, the string "0.5" included, is a TaskError naming this scorer and the type."""
        if isinstance(value, numbers.Real) or _is_numpy_bool(value):
            return float(value)
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise TaskError(f"{self.kind} {self.name!r} returned {type(value).__name__} {shown}; "
                        f"a {self.kind} must return a number or a bool")

    def numbers(self, values: object, count: int) -> list[float]:
        """A group scorer's result as one float per trace of its group of `count`: a sequence of that length (a
        list, a tuple, a numpy array) whose items are each a `number`; anything else is a TaskError naming this
        scorer."""
        items = None if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable) else list(
            values)
        if items is None or len(items) != count:
            got = type(values).__name__ if items is None else f"{len(items)} values"
            raise TaskError(f"group {self.kind} {self.name!r} returned {got}; it must return {count} numbers, "
                            "one per trace of the group")
        return [self.number(value) for value in items]

    def bind(self, target: object) -> Scorer:
        """This scorer with its function bound to `target` (a method's instance)."""
        return replace(self, fn=self.fn.__get__(target))


def _is_numpy_bool(value: object) -> TypeGuard[SupportsFloat]:
    """numpy's bool scalar is the one numpy scalar not registered as a `numbers.Real` (no numpy import here)."""
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")


def mark(target: object, scorer: Scorer) -> None:
    """Mark `target` (a function, or a callable object such as a judge) as `scorer`: `as_scorer` reads it back."""
    setattr(target, _MARK, scorer)


def _mark(kind: ScorerKind, fn: F | None, **meta: Any) -> F | Callable[[F], F]:
    def decorate(f: F) -> F:
        name = meta.pop("name", None) or f.__name__
        mark(f, Scorer(f, kind, name, **meta))
        return f

    return decorate(fn) if fn is not None else decorate


@overload
def reward(fn: F, *, weight: float = 1.0, order: int = 0, name: str | None = None, group: bool = False) -> F: ...
@overload
def reward(fn: None = None, *, weight: float = 1.0, order: int = 0, name: str | None = None,
           group: bool = False) -> Callable[[F], F]: ...
def reward(fn: F | None = None, *, weight: float = 1.0, order: int = 0,
           name: str | None = None, group: bool = False) -> F | Callable[[F], F]:
    """Mark a reward function; usable bare (`@reward`) or with arguments (`@reward(weight=0.5)`); `group=True`:
    a group reward, `(task, traces) -> list of numbers` (see the module's docstring)."""
    return _mark("reward", fn, weight=weight, order=order, name=name, group=group)


@overload
def metric(fn: F, *, order: int = 0, name: str | None = None, group: bool = False) -> F: ...
@overload
def metric(fn: None = None, *, order: int = 0, name: str | None = None,
           group: bool = False) -> Callable[[F], F]: ...
def metric(fn: F | None = None, *, order: int = 0, name: str | None = None,
           group: bool = False) -> F | Callable[[F], F]:
    """Mark a metric: scored and reported like a reward but never part of the total; `group=True` as for a
    reward."""
    return _mark("metric", fn, order=order, name=name, group=group)


@overload
def stop(fn: F, *, order: int = 0, name: str | None = None) -> F: ...
@overload
def stop(fn: None = None, *, order: int = 0, name: str | None = None) -> Callable[[F], F]: ...
def stop(fn: F | None = None, *, order: int = 0, name: str | None = None) -> F | Callable[[F], F]:
    """Mark a stop condition: checked after every turn; a true result ends the rollout."""
    return _mark("stop", fn, order=order, name=name)


def as_scorer(fn: Callable[..., Any], kind: ScorerKind) -> Scorer:
    """The scorer of a decorated function, or an undecorated one with default weight and order."""
    scorer = getattr(fn, _MARK, None)
    if scorer is None:
        return Scorer(fn, kind, getattr(fn, "__name__", repr(fn)))
    if scorer.kind != kind:
        raise UsageError(f"{scorer.name} is marked as a {scorer.kind}, but was given as a {kind}")
    return scorer


def scorers_of(cls: type) -> list[Scorer]:
    """The scorers declared as methods on a class (and its bases), unbound; found once per class.

    The most-derived definition of a name runs. An override with its own decorator takes that decorator's
    settings; one without keeps the base's (kind, weight, order, name); one set to None is no scorer at all."""
    cached = cls.__dict__.get(_CACHE)
    if cached is not None:
        return cached
    found: dict[str, Scorer] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            scorer = getattr(value, _MARK, None)
            if isinstance(scorer, Scorer):
                found[attr] = replace(scorer, fn=value)
            elif attr in found and value is None:
                del found[attr]
            elif attr in found:
                found[attr] = replace(found[attr], fn=value)
    scorers = list(found.values())
    setattr(cls, _CACHE, scorers)
    return scorers


async def call_maybe_async(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call task code `fn`: awaited when async, on a daemon thread of the task-code lane when sync (so a stage
    timeout can cut it; a sync call past its timeout is abandoned, see `thread_lane`)."""
    return await TASK_CODE.call(fn, *args, **kwargs)
