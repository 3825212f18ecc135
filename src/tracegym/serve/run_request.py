"""RunRequest: the payload of a `run` request (task data, endpoint, sampling, rollout indices, timeouts, retries)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny

from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.envs.evaluate import INFRA_RETRIES
from tracegym.envs.rollout import Timeouts
from tracegym.models.endpoint import Endpoint


class RunRequest(BaseModel):
    """Rollouts of one task against one endpoint; the server answers with one trace per rollout index."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    data: SerializeAsAny[TaskData]
    endpoint: Endpoint
    sampling: Sampling | None = None
    rollout_indices: list[int] = Field(default_factory=lambda: [0], min_length=1, max_length=4096)
    timeouts: Timeouts | None = None
    infra_retries: int = Field(default=INFRA_RETRIES, ge=0, le=100)

