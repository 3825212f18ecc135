"""Task stream: an endless, seeded stream of one environment's tasks, drawn from its env server by position, so the
orchestrator never imports the taskset's code.

A finite taskset is gone through in a new seeded order each pass (pass `e` in the order `random.Random(seed + e)`
shuffles its positions into: the order `Taskset.shuffle(seed + e)` gives its rows); its rows are read from the
server once, when the stream is made. An endless one is read forward, `ahead(n)` rows at a time before a step
draws them. A resumed run skips as many draws as it had made (positions only: no row is read for them).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence

from tracegym.core.errors import UsageError
from tracegym.core.task_data import TaskData

FetchRows = Callable[[Sequence[int]], Awaitable[list[TaskData]]]
"""Reads the server's rows at these positions (`EnvClient.rows`)."""


class TaskStream:
    """The tasks of one environment, in the order the run draws them."""

    def __init__(self, env_id: str, size: int | None, seed: int, fetch: FetchRows,
                 rows: Sequence[TaskData] = ()) -> None:
        """`size`: the taskset's rows (None: endless); `rows`: those already read, from position 0."""
        if size == 0:
            raise UsageError(f"environment {env_id!r} has no tasks")
        self.env_id, self.size, self.seed, self.fetch = env_id, size, seed, fetch
        self.rows = dict(enumerate(rows))
        self.drawn = 0
        """Rows drawn so far (a resume draws as many again, to go on where the run was)."""
        self._order: tuple[int, list[int]] = (-1, [])

    def position(self, draw: int) -> int:
        """The row position of the stream's `draw`-th draw."""
        if self.size is None:
            return draw
        epoch, offset = divmod(draw, self.size)
        if self._order[0] != epoch:
            order = list(range(self.size))
            random.Random(self.seed + epoch).shuffle(order)
            self._order = (epoch, order)
        return self._order[1][offset]

    def next(self) -> TaskData:
        """The next task (its row read already: all of a finite taskset's, an endless one's by `ahead`)."""
        position = self.position(self.drawn)
        if position not in self.rows:
            raise UsageError(f"environment {self.env_id!r}: task {position} was drawn before it was read (the step "
                             "drew more tasks than it read ahead)")
        self.drawn += 1
        return self.rows.pop(position) if self.size is None else self.rows[position]  # an endless one is not kept

    async def ahead(self, count: int) -> None:
        """Read the rows of the next `count` draws that are not read yet (one request)."""
        wanted = [p for p in dict.fromkeys(self.position(self.drawn + i) for i in range(count)) if p not in self.rows]
        if wanted:
            self.rows.update(zip(wanted, await self.fetch(wanted), strict=True))

    def skip_to(self, drawn: int) -> None:
        """Go on as a stream that had drawn `drawn` rows."""
        self.drawn = max(self.drawn, drawn)
