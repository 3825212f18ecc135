"""OpenEnv protocol of a served taskset: the action a remote agent sends, the observation and state it gets back,
the reset's choice of task and the error frames, as subclasses of the `openenv` package's own models (so its
clients, `/schema` readers and validators take them as any OpenEnv environment's)."""

from __future__ import annotations

import json
from typing import Any

from openenv.core.env_server.types import Action, Observation, State, WSErrorCode
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracegym.core.image_ref import decoded
from tracegym.core.messages import Message, ToolCall, assistant
from tracegym.core.tool_spec import ToolSpec


class ToolCallAction(BaseModel):
    """One tool call of an agent turn."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    """The tool's name (see the reset observation's `tools`)."""
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """Its arguments: an object, or its JSON text as a model wrote it."""
    id: str | None = None
    """The call's id; one is made up when missing."""


class TasksetAction(Action):
    """One agent turn: what the model said (`message`), the tools it called (`tool_calls`), or both."""

    message: str | None = None
    """The assistant's text (the answer, or a move in a chat environment)."""
    tool_calls: list[ToolCallAction] = Field(default_factory=list)
    """Tool calls; their results come back as `tool` messages in the observation."""

    @model_validator(mode="after")
    def _says_something(self) -> TasksetAction:
        if self.message is None and not self.tool_calls:
            raise ValueError("an action needs a `message`, `tool_calls` or both")
        return self

    def to_message(self, turn: int) -> Message:
        """The assistant message this turn adds to the rollout."""
        calls = [ToolCall(id=c.id or f"call_{turn}_{i}", name=c.name,
                          arguments=c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments))
                 for i, c in enumerate(self.tool_calls)]
        return assistant(self.message, calls)


class TasksetObservation(Observation):
    """What the agent sees after a reset or a step: the messages the rollout added since its last turn (the prompt
    at reset; tool results and the environment's answer after a step); the reward and scores once `done`."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    """New messages in OpenAI chat shape (the agent's own turn left out)."""
    text: str = ""
    """Their text, joined by blank lines (what a model reads)."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """At reset: the task's tools in OpenAI `tools` shape."""
    task: str = ""
    """The task's key."""
    rewards: dict[str, float | None] = Field(default_factory=dict)
    """Once done: each reward function's score (the total is `reward`)."""
    metrics: dict[str, float | None] = Field(default_factory=dict)
    """Once done: the task's metrics."""
    stop_reason: str | None = None
    """Once done: why the rollout ended (`completed`, `stop_condition`, `max_turns`, ...)."""


class TasksetState(State):
    """A session's state: its task, the turns taken, and how its rollout ended."""

    task: str | None = None
    done: bool = False
    reward: float | None = None
    stop_reason: str | None = None


class ResetChoice(BaseModel):
    """Which task a reset starts: by `key`, by `index`, drawn by `seed`, or (none given) the next in turn."""

    model_config = ConfigDict(extra="forbid")
    index: int | None = Field(default=None, ge=0)
    """Position in the taskset."""
    seed: int | None = None
    """Draws a task at random with this seed (the same seed, the same task)."""
    key: str | None = None
    """The task's key (its id)."""
    split: str | None = None
    """The Task API's split (`openenv_task_api.SPLIT`, every task), given with `index` by its clients."""
    episode_id: str | None = Field(default=None, max_length=255)
    """A name the client gives the rollout (OpenEnv's episode; kept in the state)."""


def mcp_tools(specs: list[ToolSpec]) -> list[dict[str, Any]]:
    """Tools as MCP's `tools/list` lists them."""
    return [{"name": s.name, "description": s.description, "inputSchema": s.parameters} for s in specs]


def mcp_content(content: Any) -> list[dict[str, Any]]:
    """A tool message's content (text, or OpenAI content parts) as MCP content blocks: text as text blocks, an
    image given as a base64 data URI as an image block; a ValueError naming any other image (MCP image blocks carry
    the bytes, and images elsewhere are never fetched)."""
    if not isinstance(content, list):
        return [{"type": "text", "text": content if isinstance(content, str) else json.dumps(content)}]
    blocks = []
    for part in content:
        if part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            found = decoded(url)
            if found is None:
                raise ValueError(f"an image not given as a base64 data URI ({url[:80]!r}) cannot be an MCP image "
                                 "block")
            blocks.append({"type": "image", "data": url.split(",", 1)[1], "mimeType": found[0]})
        else:
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
    return blocks


def error_frame(code: WSErrorCode, message: str, **data: Any) -> dict[str, Any]:
    """An OpenEnv error message (`{"type": "error", "data": {"message", "code", ...}}`)."""
    return {"type": "error", "data": {"message": message, "code": code.value, **data}}


def step_result(observation: TasksetObservation) -> dict[str, Any]:
    """An observation in the wire shape openenv's clients parse (reward and done beside the observation)."""
    fields = observation.model_dump(exclude={"reward", "done"})
    return {"observation": fields, "reward": observation.reward, "done": observation.done,
            **({"metadata": observation.metadata} if observation.metadata else {})}


def schemas() -> dict[str, Any]:
    """What `GET /schema` answers."""
    return {"action": TasksetAction.model_json_schema(), "observation": TasksetObservation.model_json_schema(),
            "state": TasksetState.model_json_schema()}


MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a frame or body may have (a deeper one is refused, not parsed further)."""


class TooDeep(ValueError):
    """JSON nested deeper than MAX_DEPTH."""


def loads(text: str | bytes) -> Any:
    """Parse a frame or body: ValueError when it is not JSON, TooDeep when nested past MAX_DEPTH (a nesting bomb
    is refused with a message instead of exhausting the parser's stack)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"JSON nested too deeply (more than {MAX_DEPTH} levels)") from None
    brackets = (b"[", b"{") if isinstance(text, bytes) else ("[", "{")
    if text.count(brackets[0]) + text.count(brackets[1]) <= MAX_DEPTH:  # type: ignore[arg-type]
        return value  # too few to nest that deep: no need to walk it
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth >= MAX_DEPTH:
                    raise TooDeep(f"JSON nested too deeply (more than {MAX_DEPTH} levels)")
                stack.append((child, depth + 1))
    return value
