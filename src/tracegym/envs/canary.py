"""Canary agents: the two agents whose rewards say whether a taskset's rewards can be trusted, `gold` (each task's
own gold replies, `Task.gold`, which must pass) and `noop` (an empty reply every turn, which must not earn reward).

`tracegym validate` runs them before anything trains; the RL loop's `canary` tripwire runs them again during
training through the same env servers as the policy's rollouts (`RunRequest.agent`), so a reward that changes
under a running job (a grader the policy can write to, a judge that drifts, state leaking between rollouts) shows
while it happens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from tracegym.core.messages import Message, assistant
from tracegym.core.task_data import TaskData
from tracegym.envs.taskset import Taskset
from tracegym.models.client import ModelRequest, ModelResponse

CanaryAgent = Literal["gold", "noop"]
GOLD: CanaryAgent = "gold"
NOOP: CanaryAgent = "noop"


class ReplyModel:
    """A model that answers turn k of a rollout with reply k (the last one again past the end): the gold agent's
    replies, or the no-op agent's empty one."""

    def __init__(self, name: str, replies: Sequence[Message]) -> None:
        self._name, self.replies = name, list(replies)

    @property
    def name(self) -> str:
        return self._name

    async def complete(self, request: ModelRequest) -> ModelResponse:
        turn = sum(m.role == "assistant" for m in request.messages)
        message = self.replies[min(turn, len(self.replies) - 1)]
        return ModelResponse(message, "tool_calls" if message.tool_calls else "stop")

    async def aclose(self) -> None:
        """Nothing to release."""


def gold_replies(taskset: Taskset, row: TaskData) -> list[Message] | None:
    """The task's gold replies as messages, one per turn; None when it declares none."""
    gold = taskset.task(row).gold()
    if gold is None:
        return None
    replies = gold if isinstance(gold, list) else [gold]
    return [assistant(r) if isinstance(r, str) else r for r in replies]


def canary_model(agent: CanaryAgent, taskset: Taskset, row: TaskData) -> ReplyModel | None:
    """The model that plays `agent` on one task; None for `gold` on a task without gold replies."""
    if agent == NOOP:
        return ReplyModel(NOOP, [assistant("")])
    replies = gold_replies(taskset, row)
    return None if replies is None else ReplyModel(GOLD, replies)
