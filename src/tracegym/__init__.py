"""tracegym: language-model RL environments with exact token traces.

Define a taskset, evaluate a model on it, serve it out of process, train on it. The names below are the
public surface; everything else is reachable by its module path but may change.
"""

from tracegym.core.errors import (
    ContextLengthError,
    ErrorKind,
    InfrastructureError,
    ModelError,
    StageTimeout,
    TaskError,
    ToolError,
    TraceError,
    TracegymError,
    UsageError,
)
from tracegym.core.graph import MessageGraph, Node
from tracegym.core.messages import ImagePart, Message, TextPart, ToolCall
from tracegym.core.sample import Sample
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.timing import Span
from tracegym.core.tool_spec import ToolSpec
from tracegym.core.trace import RewardScore, StopReason, Trace, Usage
from tracegym.envs.environment import EnvironmentTask, EnvironmentTaskset
from tracegym.envs.evaluate import evaluate, evaluate_iter, run_group, run_rollout
from tracegym.envs.registry import known_tasksets, load_taskset
from tracegym.envs.rollout import Timeouts, rollout
from tracegym.envs.scorers import metric, reward, stop
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset, TasksetConfig
from tracegym.envs.tools import Tool
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelClient, ModelRequest, ModelResponse
from tracegym.models.connect import make_client
from tracegym.models.endpoint import Endpoint
from tracegym.models.token_client import TokenClient

__version__ = "0.1.0"

__all__ = [
    "ChatClient",
    "ContextLengthError",
    "Endpoint",
    "EnvironmentTask",
    "EnvironmentTaskset",
    "ErrorKind",
    "ImagePart",
    "InfrastructureError",
    "Message",
    "MessageGraph",
    "ModelClient",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "Node",
    "RewardScore",
    "Sample",
    "Sampling",
    "Span",
    "StageTimeout",
    "StopReason",
    "Task",
    "TaskData",
    "TaskError",
    "Taskset",
    "TasksetConfig",
    "TextPart",
    "Timeouts",
    "TokenClient",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolSpec",
    "Trace",
    "TraceError",
    "TracegymError",
    "Usage",
    "UsageError",
    "evaluate",
    "evaluate_iter",
    "known_tasksets",
    "load_taskset",
    "make_client",
    "metric",
    "reward",
    "rollout",
    "run_group",
    "run_rollout",
    "stop",
]
