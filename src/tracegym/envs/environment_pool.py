"""Environment pool: the reusable instances of one TRL environment class, at most one per concurrent rollout.

TRL constructs an environment once and resets it often (`GRPOTrainer` keeps a pool per environment and grows it
only when a batch needs more instances at once than it has; its async worker takes one from the pool per rollout
and puts it back when the rollout ends). A class that wraps a server client (every OpenEnv example in TRL's docs)
holds one server session per instance, so a new instance per rollout would hold one more session each time. Here
a rollout takes a free instance, made only when none is free, and gives it back when it ends. An instance is
closed instead of reused when its `reset` failed or a call on it is still running (a sync call abandoned at its
timeout: reusing it would share it between two rollouts). `close()` closes every instance the pool made, and runs
at the latest when the interpreter exits. Closing honours what the class offers: `__exit__` for a context manager
(entered when made), else `close()` (sync, or a coroutine awaited to its end); then the pool drops the instance,
so its `__del__` runs.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from tracegym.envs.scorers import call_maybe_async

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 10.0
"""Seconds `close()` waits for the instances' own close hooks before it gives up on them (named in a warning)."""


class EnvironmentPool:
    """Free instances of one environment, handed to one rollout at a time."""

    def __init__(self, factory: Callable[[], Any], label: str) -> None:
        self.factory, self.label = factory, label
        self._free: list[Any] = []
        self._made: list[Any] = []
        self._lock = threading.Lock()
        self.closed = False

    @property
    def size(self) -> int:
        """Instances made and not yet closed (free or in a rollout)."""
        return len(self._made)

    async def take(self) -> Any:
        """A free instance, or a new one (made on the task-code lane: a constructor may connect to a server)."""
        with self._lock:
            if self._free:
                return self._free.pop()
        instance = await call_maybe_async(_made, self.factory)
        with self._lock:
            self._made.append(instance)
        return instance

    async def give_back(self, instance: Any, *, reusable: bool) -> None:
        """The instance back in the pool, or closed when it may not be reused (or the pool is closed)."""
        with self._lock:
            if reusable and not self.closed:
                self._free.append(instance)
                return
            if instance in self._made:
                self._made.remove(instance)
        await call_maybe_async(close_instance, instance)

    def close(self) -> None:
        """Close every instance this pool made (free or still in a rollout); later ones are closed as they come
        back. Each close hook gets `CLOSE_TIMEOUT` seconds in all; one still running then is named and left."""
        with self._lock:
            self.closed = True
            instances, self._made, self._free = self._made, [], []
        if instances:
            close_all(instances, self.label)


def _made(factory: Callable[[], Any]) -> Any:
    instance = factory()
    if _is_context_manager(instance):
        instance.__enter__()  # TRL's code never enters it; a `with`-shaped class gets its `__exit__` at close
    return instance


def _is_context_manager(instance: Any) -> bool:
    return callable(getattr(type(instance), "__enter__", None)) and callable(getattr(type(instance), "__exit__", None))


def close_instance(instance: Any) -> None:
    """Close one instance by its own hook: `__exit__(None, None, None)`, else `close()` (a coroutine it returns is
    run to its end); a class with neither is only dropped (its `__del__` runs when the last reference goes)."""
    if _is_context_manager(instance):
        result = instance.__exit__(None, None, None)
    elif callable(getattr(instance, "close", None)):
        result = instance.close()
    else:
        return
    if inspect.isawaitable(result):
        asyncio.run(_awaited(result))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def close_all(instances: list[Any], label: str) -> None:
    """Close the instances on a daemon thread (a hook that hangs never blocks exit); a hook that raises, or is
    still running after `CLOSE_TIMEOUT`, is named in a warning."""

    def run() -> None:
        for instance in instances:
            try:
                close_instance(instance)
            except Exception as exc:  # one failed close must not keep the others open
                log.warning("%s: closing %s failed: %s: %s", label, type(instance).__name__, type(exc).__name__, exc)

    thread = threading.Thread(target=run, name=f"tracegym-close:{label}", daemon=True)
    thread.start()
    thread.join(CLOSE_TIMEOUT)
    if thread.is_alive():
        log.warning("%s: closing its %d instances took over %.0f s; left to finish on their own", label,
                    len(instances), CLOSE_TIMEOUT)
