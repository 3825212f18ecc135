"""Taskset environment: a tracegym taskset as an `openenv` Environment class, for openenv's own `create_app` (and
the tooling around it: its web UI, `openenv push`): `create_app(TasksetEnvironment.of(taskset), TasksetAction,
TasksetObservation, max_concurrent_envs=64)`. Each instance is one session (`TasksetSession`), as on our server.
Its `rubric` is the taskset's reward functions as an OpenEnv rubric (`TasksetRubric`: one child per reward, named
as the reward), scored on each episode's last observation, so OpenEnv's tooling reads each reward's `last_score`."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, ClassVar

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata
from openenv.core.rubrics import Rubric

from tracegym.envs.taskset import Taskset
from tracegym.interop.openenv_protocol import ResetChoice, TasksetAction, TasksetObservation, TasksetState
from tracegym.interop.openenv_session import TaskPicker, TasksetSession


class RewardRubric(Rubric):
    """One reward function of the taskset: its score in a finished episode's observation (0 before the end, or
    where it could not be scored)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, action: Any, observation: Any) -> float:
        score = getattr(observation, "rewards", {}).get(self.name)
        return float(score) if score is not None else 0.0


class TasksetRubric(Rubric):
    """The taskset's rewards as a rubric: a child per reward function (`named_rubrics()`), the whole the episode's
    reward (their weighted sum, as the observation's `reward` carries it)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        for name in names:
            setattr(self, name, RewardRubric(name))

    def forward(self, action: Any, observation: Any) -> float:
        for child in self.children():
            child(action, observation)
        reward = getattr(observation, "reward", None)
        return float(reward) if reward is not None else 0.0


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
        super().__init__(rubric=TasksetRubric(reward_names(self.picker)))
        self.session = TasksetSession(self.picker.taskset, self.picker)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          **kwargs: Any) -> TasksetObservation:
        self._loop = asyncio.get_running_loop()
        return await self.session.reset(ResetChoice(seed=seed, episode_id=episode_id, **kwargs))

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> TasksetObservation:
        assert isinstance(action, TasksetAction)
        observation = await self.session.step(action)
        if observation.done and self.rubric is not None:
            self.rubric(action, observation)  # each reward's `last_score`, for OpenEnv's tooling
        return observation

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


def reward_names(picker: TaskPicker) -> list[str]:
    """The reward functions of the taskset's first task (the same for most tasksets), in evaluation order."""
    return [scorer.name for scorer in picker.taskset.task(picker.row(0)).scorers_of_kind("reward")]
