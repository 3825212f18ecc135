"""tracegym: language-model RL environments with exact token traces.

Define a taskset, evaluate a model on it, serve it out of process, train on it. The names below are the
public surface:
- define a taskset: `Task`, `Taskset`, `TasksetConfig`, `TaskData`, `reward`, `metric`, `stop`, `Message`
  (and `EnvironmentTask` / `EnvironmentTaskset` for TRL-style environment classes); `reward(group=True)` for a
  reward over a task's group of rollouts, `Judge` for a reward a judge model gives;
- run rollouts in this process: `run_rollout` (one), `run_group` (the rollouts of one task), `evaluate` (a
  taskset), with `Sampling` and `Timeouts`; `load_taskset` / `known_tasksets` find tasksets by id;
- reach a model: `Endpoint` (or a live client from `make_client`); write one: `ModelClient`, `ModelRequest`,
  `ModelResponse`, `ToolCall`;
- read the result: `Trace`, `StopReason`, `ErrorKind` (who is at fault), `FailureKind` (what went wrong: one per
  failed trace, `Trace.failure`); the errors worth catching, or raising from a model client;
- several agents in one episode: `MultiAgentTask` with its `Member`s and `Slot`s (raise `InvalidMove` from
  `move`), played by `run_episode` / `evaluate_episodes` with seats bound by `Seat`; each returns an `Episode`
  (one Trace per member, rewards and `Outcome`s).
Everything else is reachable by its module path but may change: e.g. `evaluate_iter` (traces as they finish)
and the `rollout` loop in `tracegym.envs`, `ChatClient` / `TokenClient` in `tracegym.models`, and
`tracegym.serve.env_client.EnvClient`, whose methods take the same arguments as the three run functions.
"""

from tracegym.core.episode import Episode, Outcome
from tracegym.core.errors import (
    ContextLengthError,
    ErrorKind,
    FailureKind,
    InfrastructureError,
    JudgeError,
    ModelError,
    TracegymError,
    UsageError,
)
from tracegym.core.messages import Message, ToolCall
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason, Trace
from tracegym.envs.environment import EnvironmentTask, EnvironmentTaskset
from tracegym.envs.evaluate import evaluate, evaluate_episodes, run_episode, run_group, run_rollout
from tracegym.envs.judge import Judge
from tracegym.envs.multi_agent import InvalidMove, MultiAgentTask
from tracegym.envs.registry import known_tasksets, load_taskset
from tracegym.envs.rollout import Timeouts
from tracegym.envs.schedule import Member, Slot
from tracegym.envs.scorers import metric, reward, stop
from tracegym.envs.seats import Seat
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset, TasksetConfig
from tracegym.models.client import ModelClient, ModelRequest, ModelResponse
from tracegym.models.connect import make_client
from tracegym.models.endpoint import Endpoint

__version__ = "0.1.0"

__all__ = [
    "ContextLengthError",
    "Endpoint",
    "EnvironmentTask",
    "EnvironmentTaskset",
    "Episode",
    "ErrorKind",
    "FailureKind",
    "InfrastructureError",
    "InvalidMove",
    "Judge",
    "JudgeError",
    "Member",
    "Message",
    "ModelClient",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "MultiAgentTask",
    "Outcome",
    "Sampling",
    "Seat",
    "Slot",
    "StopReason",
    "Task",
    "TaskData",
    "Taskset",
    "TasksetConfig",
    "Timeouts",
    "ToolCall",
    "Trace",
    "TracegymError",
    "UsageError",
    "evaluate",
    "evaluate_episodes",
    "known_tasksets",
    "load_taskset",
    "make_client",
    "metric",
    "reward",
    "run_episode",
    "run_group",
    "run_rollout",
    "stop",
]
