"""Episode builders: finished multi-agent episodes made in one call, for tests and benchmarks of training."""

from __future__ import annotations

from typing import Any

from tracegym.core.episode import Episode, Outcome
from tracegym.core.messages import assistant, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import RewardScore, StopReason, Trace

OUTCOME_OF = {1.0: Outcome.WIN, -1.0: Outcome.LOSS, 0.0: Outcome.DRAW}
"""A zero-sum game's outcome by reward (other rewards get none)."""


def member_trace(member: str, reward: float | None, *, task: TaskData, taskset: str, episode_id: str,
                 completion_ids: tuple[int, ...] = (7, 8)) -> Trace:
    """A member's trace: one sampled, tokenized turn with logprobs (trainable as it is), and its reward."""
    trace = Trace(task=task, taskset=taskset, member=member, episode_id=episode_id, stop_reason=StopReason.COMPLETED)
    trace.graph.add(user(f"you are {member}"))
    trace.prompt_length = 1
    trace.graph.add_model_turn(assistant("move"), prompt_ids=[1, 2, 3], completion_ids=list(completion_ids),
                               completion_logprobs=[-0.5] * len(completion_ids), temperature=1.0)
    trace.rewards["reward"] = RewardScore(score=reward)
    return trace


def make_episode(rewards: dict[str, float | None], *, trainable: dict[str, bool] | None = None,
                 task: TaskData | None = None, taskset: str = "game", **fields: Any) -> Episode:
    """A finished episode whose members (in the order of `rewards`) got those rewards, each with its own
    trainable trace; every member trains unless `trainable` says otherwise. Outcomes follow the rewards'
    signs (`OUTCOME_OF`); `fields` set anything else on the episode (an error, metrics)."""
    data = task or TaskData(prompt="deal")
    fields.setdefault("stop_reason", StopReason.COMPLETED)
    episode = Episode(task=data, taskset=taskset, members=list(rewards),
                      trainable=trainable if trainable is not None else dict.fromkeys(rewards, True), **fields)
    for member, reward in rewards.items():
        episode.traces[member] = member_trace(member, reward, task=data, taskset=taskset, episode_id=episode.id)
        episode.rewards[member] = reward
        if reward in OUTCOME_OF and "outcomes" not in fields:
            episode.outcomes[member] = OUTCOME_OF[reward]
    return episode
