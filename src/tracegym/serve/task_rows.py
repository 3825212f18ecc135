"""Task rows: the rows of an env server's taskset by position, so a client draws tasks without the taskset's code.

A finite taskset's rows are read once, on the first request; an endless one's as far as asked (positions are
drawn in order, so the stream is read forward and its rows kept). A request names at most `MAX_ROWS` positions;
a position past the end, or one that is not an integer, is a `BadRequest` naming it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from tracegym.core.task_data import TaskData
from tracegym.envs.taskset import Taskset
from tracegym.serve.wire import WireError

MAX_ROWS = 4096
"""Positions one `rows` request may name."""


class TaskRows:
    """The rows of one taskset, by position, as plain data."""

    def __init__(self, taskset: Taskset) -> None:
        self.taskset = taskset
        self._rows: list[TaskData] = []
        self._more: Iterator[TaskData] | None = None
        self._done = False

    def describe(self) -> dict[str, Any]:
        """For the server's `info`: how many rows the taskset has (`size`, None: it never ends), or why its rows
        cannot be read (`rows_error`: a taskset that only runs the rows its clients send, say)."""
        if not self.taskset.bounded:
            return {"size": None}
        try:
            self._read_to(None)
        except Exception as exc:  # the taskset's own code: its failure is said, never the server's end
            return {"size": None, "rows_error": f"{type(exc).__name__}: {exc}"}
        return {"size": len(self._rows)}

    def rows(self, request_id: str, payload: Any) -> list[dict[str, Any]]:
        """The rows at the positions `payload["indices"]` names, in that order, as plain data."""
        indices = payload.get("indices") if isinstance(payload, dict) else None
        if not isinstance(indices, list) or len(indices) > MAX_ROWS or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices):
            raise WireError(f"rows: `indices` must be a list of at most {MAX_ROWS} positions (integers >= 0)",
                            request_id)
        if indices:
            try:
                self._read_to(max(indices))
            except Exception as exc:  # the taskset's own code, as in `describe`
                raise WireError(f"rows: taskset {self.taskset.id!r} cannot give its rows: {type(exc).__name__}: {exc}",
                                request_id) from None
        past = [i for i in indices if i >= len(self._rows)]
        if past:
            raise WireError(f"rows: taskset {self.taskset.id!r} has {len(self._rows)} rows; no position {past[0]}",
                            request_id)
        return [self._rows[i].model_dump(mode="json") for i in indices]

    def _read_to(self, index: int | None) -> None:
        """Read the taskset's rows up to position `index` (None: all of them)."""
        wanted = None if index is None else index + 1 - len(self._rows)
        if self._done or (wanted is not None and wanted <= 0):
            return
        if self._more is None:
            self._more = iter(self.taskset)  # the taskset's load() runs now, at the first read, not at start
        read = list(self._more if wanted is None else itertools.islice(self._more, wanted))
        self._rows += read
        if wanted is None or len(read) < wanted:
            self._done, self._more = True, None
