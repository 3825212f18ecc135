"""Taskset environment: a tracegym taskset as an `openenv` Environment class, for openenv's own `create_app` (and
the tooling around it: its web UI, `openenv push`): `create_app(TasksetEnvironment.of(taskset), TasksetAction,
TasksetObservation, max_concurrent_envs=64)`. Each instance is one session (`TasksetSession`), as on our server."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, ClassVar

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata

from tracegym.envs.taskset import Taskset
from tracegym.interop.openenv_protocol import ResetChoice, TasksetAction, TasksetObservation, TasksetState
from tracegym.interop.openenv_session import TaskPicker, TasksetSession


class TasksetEnvironment(Environment[TasksetAction, TasksetObservation, TasksetState]):
    """One session of a taskset; async (openenv's server awaits `reset_async` and `step_async` on its loop)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    picker: ClassVar[TaskPicker]

    @classmethod
    @functools.cache
    def of(cls, taskset: Taskset) -> type[TasksetEnvironment]:
        """The Environment class (the factory `create_app` takes) serving `taskset`."""
        return type(f"{type(taskset).__name__}Environment", (cls,), {"picker": TaskPicker(taskset)})

    def __init__(self) -> None:
        super().__init__()
        self.session = TasksetSession(self.picker.taskset, self.picker)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          **kwargs: Any) -> TasksetObservation:
        self._loop = asyncio.get_running_loop()
        return await self.session.reset(ResetChoice(seed=seed, episode_id=episode_id, **kwargs))

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> TasksetObservation:
        assert isinstance(action, TasksetAction)
        return await self.session.step(action)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TasksetObservation:
        raise NotImplementedError("TasksetEnvironment runs on its server's event loop: call reset_async")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> TasksetObservation:
        raise NotImplementedError("TasksetEnvironment runs on its server's event loop: call step_async")

    @property
    def state(self) -> TasksetState:
        return self.session.state()

    def get_metadata(self) -> EnvironmentMetadata:
        taskset = self.picker.taskset
        return EnvironmentMetadata(name=taskset.id, description=taskset.description or f"tracegym taskset {taskset.id}")

    def close(self) -> None:
        """End the running rollout; openenv calls this from a worker thread, so it is handed to the session's loop."""
        if self._loop is not None and not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.session.close(), self._loop)
