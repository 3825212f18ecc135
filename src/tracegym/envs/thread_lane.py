"""Thread lane: where sync tools and scorers run, on daemon threads, at most `limit` calls at once.

Python cannot kill a thread. A sync call that runs past its stage timeout is therefore *abandoned*, not
stopped: the rollout moves on at the timeout, the call's thread runs on until the function returns (forever,
if it never does), and its slot goes back to the lane at once, so hung calls never shrink the room healthy
calls have; a new thread takes the hung one's place. The threads are daemons: an abandoned one never blocks
the event loop's or the interpreter's exit. Idle threads are reused (starting one per call cost ~6x as much
as `asyncio.to_thread`). Tools and scorers have separate lanes, so tools that hang or crowd in never delay
scoring.

Task code that raises a BaseException that is not an Exception (`sys.exit()`, a custom subclass) must end its
rollout, not the process: `contained` turns it into a `TaskExit`, an ordinary task error. Raised on a lane
thread, even `KeyboardInterrupt` or `CancelledError` is task code's own (signals reach only the main thread, and
the caller's cancellation is raised in the caller), so all are converted. Raised by async task code on the event
loop, `CancelledError` is a real cancellation and `KeyboardInterrupt` may be the user's Ctrl-C (asyncio raises
the second one wherever the main thread is): both pass, as does `GeneratorExit` (a coroutine being closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tracegym.core.errors import TaskExit

T = TypeVar("T")
LANE_LIMIT = 32
"""Sync calls of one lane running at once (per event loop); abandoned calls do not count."""


class ThreadLane:
    """Runs sync callables on daemon threads, at most `limit` at a time per event loop."""

    def __init__(self, name: str, limit: int = LANE_LIMIT) -> None:
        self.name, self.limit = name, limit
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary())
        self._lock = threading.Lock()
        self._abandoned = 0
        self._jobs: queue.SimpleQueue[Callable[[], Callable[[], None] | None]] = queue.SimpleQueue()
        """Each job runs its call and returns how to hand its outcome to the caller (None: nobody waits)."""
        self._idle = 0
        """Threads waiting for a job that no queued job has claimed yet."""

    @property
    def abandoned(self) -> int:
        """Threads whose caller gave up (timeout or cancel) and that are still running."""
        return self._abandoned

    async def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`: awaited when async, on a lane thread when sync (an awaitable result is
        awaited too). Cancelling the caller abandons the thread and frees its slot."""
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):  # noqa: B004 (async __call__)
            return await contained(fn(*args, **kwargs))
        result = await self._in_thread(fn, args, kwargs)
        if inspect.isawaitable(result):
            return await contained(result)
        return result

    async def _in_thread(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(loop, asyncio.Semaphore(self.limit))
        async with slots:
            future: asyncio.Future[Any] = loop.create_future()
            state = {"abandoned": False, "finished": False}
            context = contextvars.copy_context()

            def work() -> Callable[[], None] | None:
                try:
                    outcome: tuple[bool, Any] = (True, context.run(fn, *args, **kwargs))
                except Exception as exc:  # handed to the caller, who decides
                    outcome = (False, exc)
                except BaseException as exc:  # task code's own on this thread, never a Ctrl-C or a cancellation
                    outcome = (False, TaskExit(exc))
                with self._lock:
                    state["finished"] = True
                    if state["abandoned"]:
                        self._abandoned -= 1
                        return None

                def deliver() -> None:
                    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
                        loop.call_soon_threadsafe(_settle, future, outcome)
                return deliver

            self._submit(work)
            try:
                return await future
            except asyncio.CancelledError:
                with self._lock:
                    if not state["finished"]:
                        state["abandoned"] = True
                        self._abandoned += 1
                raise

    def _submit(self, job: Callable[[], Callable[[], None] | None]) -> None:
        """Queue `job` for an idle thread, or start a thread for it when none is idle."""
        with self._lock:
            self._jobs.put(job)
            if self._idle:
                self._idle -= 1
                return
        threading.Thread(target=self._serve, name=f"tracegym-{self.name}", daemon=True).start()

    def _serve(self) -> None:
        """A lane thread: run jobs until `limit` other threads are idle already. It counts itself idle before it
        hands a job's outcome over, so the caller's next call finds it."""
        while True:
            deliver = self._jobs.get()()
            with self._lock:
                stays = self._idle < self.limit
                if stays:
                    self._idle += 1
            if deliver is not None:
                deliver()
            del deliver  # it holds the outcome (a new object, maybe): a thread waiting for work must not keep it
            if not stays:
                return


PASSING = (asyncio.CancelledError, KeyboardInterrupt, GeneratorExit)
"""BaseExceptions from task code that are not contained: they mean the caller's cancel, the user's Ctrl-C or a
coroutine being closed (see the module docstring); every other one ends only the rollout it came from."""


async def contained(aw: Awaitable[T]) -> T:
    """Await task code; a BaseException it raises that is not an Exception becomes a `TaskExit` (raised here, in
    the task that awaits it: one that left a task would stop the event loop). `PASSING` ones pass."""
    try:
        return await aw
    except (Exception, *PASSING):
        raise
    except BaseException as exc:  # SystemExit and the like from user code: caught so it ends one rollout, not
        # the worker or the eval (an Exception is the rollout loop's to classify; PASSING ones are not task code's)
        raise TaskExit(exc) from exc


def contained_call(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` for sync task code run on the event loop itself (building a Task): as `contained`."""
    try:
        return fn(*args)
    except (Exception, *PASSING):
        raise
    except BaseException as exc:  # as in `contained`: a SystemExit from building a Task ends this rollout only
        raise TaskExit(exc) from exc


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():  # the caller gave up in the meantime
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


TOOLS = ThreadLane("tool")
"""The lane of sync tool calls."""
TASK_CODE = ThreadLane("task")
"""The lane of every other sync call into task code: rewards, metrics, stops, an environment's `reset`."""
