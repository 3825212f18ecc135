"""Row query: what the run page's table shows, parsed from the URL's query string (filters, search, sort, page).

Every field has a query-string parameter of the same name, so the page's filter form is a plain GET form and a
filtered view is a link. A value that cannot be read is a QueryError naming the parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import urlencode

from tracegym.core.errors import ErrorKind
from tracegym.core.trace import StopReason
from tracegym.view.run_folder_index import Row, RowKind

PAGE_SIZES = (25, 50, 100, 200, 500)
STOP_REASONS = (*(r.value for r in StopReason), "none")
"""`none`: no stop reason recorded (the rollout never finished)."""
ERROR_CHOICES = ("none", "any", *(k.value for k in ErrorKind), "unreadable")
"""`none`/`any`: rows without / with an error; `unreadable`: lines that are not records."""
PHASES = ("train", "held-out")
"""An RL run's traces and episodes: its training rollouts, or a held-out evaluation's (`evals/<env>/`)."""
SORT_KEYS: dict[str, Callable[[Row], Any]] = {
    "line": lambda r: (r.step or 0, r.source, r.line),
    "task": lambda r: r.task_key,
    "index": lambda r: r.index,
    "reward": lambda r: max(r.rewards, default=-math.inf),
    "stop": lambda r: r.stop_reason,
    "errors": lambda r: (len(r.errors), r.errors),
    "turns": lambda r: r.turns,
    "tokens": lambda r: r.completion_tokens,
    "duration": lambda r: r.duration,
    "step": lambda r: r.step or 0,
    "taskset": lambda r: r.taskset,
    "phase": lambda r: r.held_out or "",
}


class QueryError(ValueError):
    """A query-string parameter that cannot be read; the message names it and what it accepts."""


@dataclass(frozen=True)
class RowQuery:
    """Filters, search, sort order and page of the run page's table."""

    show: RowKind = RowKind.TRACE
    """Which rows: traces, or episodes (a multi-agent run)."""
    reward_min: float | None = None
    reward_max: float | None = None
    stop: str = ""
    error: str = ""
    taskset: str = ""
    step: int | None = None
    phase: str = ""
    """`train` or `held-out` (`PHASES`): an RL run's training or held-out evaluation rows."""
    q: str = ""
    """Text to find in the messages."""
    sort: str = "line"
    desc: bool = False
    page: int = 1
    per_page: int = 50
    live: bool = False
    """Reload the page every few seconds (a run still being written)."""

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> RowQuery:
        """The query a URL asks for; blank parameters mean "no filter"."""
        unknown = sorted(set(params) - {f.name for f in fields(cls)})
        if unknown:
            raise QueryError(f"unknown parameter {unknown[0]!r}; known: {', '.join(f.name for f in fields(cls))}")
        get = {k: v.strip() for k, v in params.items() if v.strip()}
        query = cls(
            show=_choice(get, "show", [k.value for k in RowKind], RowKind(cls.show)),
            reward_min=_number(get, "reward_min"),
            reward_max=_number(get, "reward_max"),
            stop=_choice(get, "stop", STOP_REASONS, ""),
            error=_choice(get, "error", ERROR_CHOICES, ""),
            taskset=get.get("taskset", "")[:200],
            step=_integer(get, "step", 0, None),
            phase=_choice(get, "phase", PHASES, ""),
            q=get.get("q", "")[:200],
            sort=_choice(get, "sort", list(SORT_KEYS), "line"),
            desc=_choice(get, "desc", ["0", "1"], "0") == "1",
            page=_integer(get, "page", 1, 1) or 1,
            per_page=_choice(get, "per_page", [str(n) for n in PAGE_SIZES], cls.per_page),
            live=_choice(get, "live", ["0", "1"], "0") == "1",
        )
        return replace(query, show=RowKind(query.show), per_page=int(query.per_page))

    def _filters(self) -> list[Callable[[Row], bool]]:
        """One check per filter that is set (the search is applied by the index)."""
        checks: list[Callable[[Row], bool]] = []
        if self.reward_min is not None or self.reward_max is not None:
            low = -math.inf if self.reward_min is None else self.reward_min
            high = math.inf if self.reward_max is None else self.reward_max
            if self.show is RowKind.TRACE:
                checks.append(lambda r: r.reward is not None and low <= r.reward <= high)
            else:
                checks.append(lambda r: any(low <= x <= high for x in r.rewards))
        if self.stop:
            checks.append(lambda r: r.stop_reason == self.stop and r.problem is None)
        if self.error:
            checks.append(lambda r: _error_matches(self.error, r))
        if self.taskset:
            checks.append(lambda r: r.taskset == self.taskset)
        if self.step is not None:
            checks.append(lambda r: r.step == self.step)
        if self.phase:
            held_out = self.phase == "held-out"
            checks.append(lambda r: (r.held_out is not None) == held_out)
        return checks

    @property
    def filtered(self) -> bool:
        """True when any filter or search is set."""
        return any((self.reward_min is not None, self.reward_max is not None, self.stop, self.error, self.taskset,
                    self.step is not None, self.phase, self.q))

    def select(self, rows: list[Row], searched: list[int] | None) -> list[int]:
        """The numbers of the rows to show, filtered and sorted (`searched`: the rows the search found)."""
        chosen = list(range(len(rows))) if searched is None else list(searched)
        for check in self._filters():  # each filter narrows the list in one comprehension: ~50 ns a row
            chosen = [n for n in chosen if check(rows[n])]
        if self.sort != "line" or self.desc:
            key = SORT_KEYS[self.sort]
            unreadable = [n for n in chosen if rows[n].problem is not None]  # listed last, whatever the order
            chosen = [n for n in chosen if rows[n].problem is None]
            chosen.sort(key=lambda n: key(rows[n]), reverse=self.desc)
            chosen += unreadable
        return chosen

    def url(self, **changes: Any) -> str:
        """`?…`: this query with some fields changed (defaults left out, so links stay short)."""
        changed = replace(self, **changes)
        default = RowQuery()
        params = {}
        for f in fields(self):
            value = getattr(changed, f.name)
            if value != getattr(default, f.name) and value is not None:
                params[f.name] = "1" if value is True else str(value.value if isinstance(value, RowKind) else value)
        return "?" + urlencode(params)


def _error_matches(choice: str, row: Row) -> bool:
    if choice == "unreadable":
        return row.problem is not None
    if row.problem is not None:
        return False
    if choice == "none":
        return not row.errors
    return bool(row.errors) if choice == "any" else choice in row.errors


def _choice(get: dict[str, str], name: str, allowed: Any, default: Any) -> Any:
    if name not in get:
        return default
    if get[name] not in allowed:
        raise QueryError(f"{name}={get[name][:40]!r} is not one of: {', '.join(map(str, allowed))}")
    return get[name]


def _number(get: dict[str, str], name: str) -> float | None:
    if name not in get:
        return None
    try:
        value = float(get[name])
    except ValueError:
        raise QueryError(f"{name}={get[name][:40]!r} is not a number") from None
    if math.isnan(value):
        raise QueryError(f"{name}=nan is not a number")
    return value


def _integer(get: dict[str, str], name: str, low: int, default: int | None) -> int | None:
    if name not in get:
        return default
    text = get[name]
    if not text.isdigit() or int(text) < low or len(text) > 9:
        raise QueryError(f"{name}={text[:40]!r} is not a whole number from {low}")
    return int(text)
