"""RunRequest: the payload of a `run` request (task data, endpoint, sampling, rollout indices, timeouts, retries,
whether they are a group; for a multi-agent taskset, episodes and their seat binding)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.envs.canary import CanaryAgent
from tracegym.envs.evaluate import INFRA_RETRIES
from tracegym.envs.rollout import Timeouts
from tracegym.envs.seats import Seat
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
    group: bool = True
    """The rollouts are one group of the task: the taskset's group rewards (`envs.group_scoring`) score them
    together once all are done. False: each is left with its group scores None, as a rollout run alone."""
    episodes: bool = False
    """Run episodes of a multi-agent taskset (the indices are episode indices; the reply holds Episodes)."""
    agent: CanaryAgent | None = None
    """Played by a canary agent instead of the endpoint's model (`envs.canary`: `gold` replies with the task's gold
    replies, `noop` with an empty one): the rewards a taskset pays them, checked on the same server as training.
    A task without gold replies gives a `gold` request no rollouts (an empty reply)."""
    seats: dict[str, Seat] = Field(default_factory=dict)
    """The episodes' seat binding: member id -> Seat (its model an Endpoint); members left out play as
    `endpoint`."""

    @model_validator(mode="after")
    def _agents_play_alone(self) -> RunRequest:
        if self.agent is not None and self.episodes:
            raise ValueError("a canary agent plays a single-agent taskset's rollouts, not episodes")
        return self

    @field_validator("seats")
    @classmethod
    def _endpoints_only(cls, seats: dict[str, Seat]) -> dict[str, Seat]:
        """A seat's model crosses the wire as its Endpoint; a live client (in process only) cannot."""
        for name, seat in seats.items():
            if seat.model is not None and not isinstance(seat.model, Endpoint):
                raise ValueError(f"seat {name!r}: an env server reaches a model through its Endpoint, not a "
                                 f"{type(seat.model).__name__}")
        return seats
