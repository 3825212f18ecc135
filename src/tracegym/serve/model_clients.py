"""Model clients: a worker's live model clients, one per endpoint, the least recently used closed past a limit."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator, Callable

from tracegym.models.client import ModelClient
from tracegym.models.endpoint import Endpoint

MODEL_CLIENTS = 32
"""Most model clients a worker keeps (each holds a connection pool); a long-running server may see many endpoints
(one per model name, LoRA adapter or policy version), and one it no longer uses must not cost memory forever."""


class ModelClients:
    """`async with clients.use(endpoint) as model: ...`; past `limit` endpoints the least recently used client is
    closed, at once when idle, else when the last rollout using it ends."""

    def __init__(self, make: Callable[[Endpoint], ModelClient], limit: int = MODEL_CLIENTS) -> None:
        self._make, self.limit = make, limit
        self._kept: collections.OrderedDict[Endpoint, ModelClient] = collections.OrderedDict()
        self._users: collections.Counter[int] = collections.Counter()
        self._dropped: dict[int, ModelClient] = {}
        """Clients evicted while in use, by id: closed when their last user is done."""

    def __len__(self) -> int:
        return len(self._kept)

    @contextlib.asynccontextmanager
    async def use(self, endpoint: Endpoint) -> AsyncIterator[ModelClient]:
        """The endpoint's client (made on first use), held until the block ends."""
        model = self._kept.get(endpoint)
        if model is None:
            model = self._kept[endpoint] = self._make(endpoint)
        else:
            self._kept.move_to_end(endpoint)
        self._users[id(model)] += 1  # before any await: another new endpoint's eviction must see it in use
        try:
            while len(self._kept) > self.limit:
                await self._drop(self._kept.popitem(last=False)[1])
            yield model
        finally:
            self._users[id(model)] -= 1
            if not self._users[id(model)]:
                del self._users[id(model)]
                if self._dropped.pop(id(model), None) is not None:
                    await _close(model)

    async def _drop(self, model: ModelClient) -> None:
        if self._users[id(model)]:
            self._dropped[id(model)] = model
        else:
            await _close(model)

    async def aclose(self) -> None:
        """Close every client (the worker is stopping: no rollout uses one any more)."""
        for model in [*self._kept.values(), *self._dropped.values()]:
            await _close(model)
        self._kept.clear()
        self._dropped.clear()


async def _close(model: ModelClient) -> None:
    with contextlib.suppress(Exception):  # a client that fails to close has nothing left to give back
        await model.aclose()
