"""OpenEnv taskset: an environment served by any OpenEnv server, run as a tracegym taskset.

`tracegym eval openenv:ws://127.0.0.1:8001 -n 20` (or `OpenEnvTaskset({"url": ...})`): task i resets the
environment with seed `seed + i` on its own WebSocket session (one per rollout); with `split`, the tasks are those
of that split of the server's Task API (`openenv_tasks`), each reset with the split and its index. The model is
offered the server's MCP tools (`tools/list`) or, for an environment without them, one tool whose parameters are the
server's action schema (`/schema`), both known before setup (`openenv_catalog` asks once per taskset, so TRL's
adapter sees them); each call is a step, and its observation is the tool's result. With
`text_action`, a plain reply is the action instead (a chat environment). The reward is read from each step's
result (summed over the episode by default) and `done` ends the rollout. Schema-invalid actions come back to the
model as tool errors; a server at capacity or a dropped connection is an infrastructure error (opening a session
is retried with backoff; a rollout that lost its session mid-episode is rerun by the runner).

To read rewards or observations another way, subclass `OpenEnvTask` (override `reward_of`, `done_of` or
`observation_text`) and set it as the `task_class` of an `OpenEnvTaskset` subclass.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import Field, TypeAdapter

from tracegym.core.errors import ErrorKind, InfrastructureError, TaskError, ToolError, TracegymError, UsageError
from tracegym.core.messages import ContentPart, ImagePart, Message, TextPart, user
from tracegym.core.task_data import TaskData
from tracegym.core.tool_spec import ToolSpec
from tracegym.core.trace import Trace
from tracegym.envs.scorers import metric, reward, stop
from tracegym.envs.task import EnvResponse, Task
from tracegym.envs.taskset import Taskset, TasksetConfig
from tracegym.envs.tools import Tool
from tracegym.interop.openenv_catalog import Catalog, Offer, remote_function
from tracegym.interop.openenv_connection import OpenEnvConnection, OpenEnvError
from tracegym.interop.openenv_tasks import read_split

SCHEME = "openenv"
"""Taskset ids `openenv:ws://HOST:PORT` name an OpenEnv server (see `envs.registry`)."""
_ANY_ARGUMENTS: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])
"""Remote tools take what their schema says; the server validates the arguments and its errors reach the model."""


class OpenEnvConfig(TasksetConfig):
    """Options of an OpenEnv taskset."""

    url: str = ""
    """The OpenEnv server: `ws://HOST:PORT` (`http://` works too); the id `openenv:URL` sets it."""
    num_tasks: int = Field(default=100, ge=1)
    """Tasks: task i resets the environment with seed `seed + i`."""
    split: str | None = None
    """A split of the server's Task API (a dataset-backed environment that lists its tasks): task i is the split's
    task i, reset with `split` and `index = i` (its spec is the task's `spec`); `num_tasks`, when set, takes the
    first that many, else all of them. Unset: task i resets with seed `seed + i`."""
    reset_args: dict[str, Any] = Field(default_factory=dict)
    """Further keyword arguments of every reset (environment-specific: a difficulty, a split)."""
    instructions: str = "Act in the environment with the tools you are given until the episode is done."
    """The prompt; the reset's observation follows it."""
    system_prompt: str | None = None
    """A system prompt before it."""
    tools: Literal["auto", "mcp", "action"] = "auto"
    """What the model is offered: the server's MCP tools (`mcp`), one tool taking an action of the server's action
    schema (`action`), or its MCP tools when it lists any, else the action tool unless `text_action` is set (`auto`)."""
    action_tool: str = "act"
    """Name of the tool that takes one action."""
    text_action: str | None = None
    """An action field (e.g. `message`) to fill with a reply that calls no tool: the reply is then an action and the
    observation comes back as a user message (a chat environment); unset: such a reply ends the rollout."""
    observation_field: str | None = None
    """The observation field the model reads; unset: the whole observation as JSON (metadata left out). A field
    holding chat messages (OpenAI-shaped dicts with a `role`, as tracegym's own OpenEnv server sends in `messages`)
    reaches the model as those messages, roles kept (a system prompt stays a system message), after the
    instructions when they are not empty."""
    reward_path: str = "reward"
    """Where a step's reward is in its result, dotted (`observation.score`)."""
    done_path: str = "done"
    """Where a step's `done` is in its result, dotted."""
    reward_over_steps: Literal["sum", "last"] = "sum"
    """The episode's reward: the sum of its steps' rewards, or the last one given."""
    max_turns: int = Field(default=10, ge=1)
    """Model turns before the rollout ends."""
    retries: int = Field(default=3, ge=0)
    """Retries of opening a session (connection refused or dropped; a server still at capacity after
    `capacity_wait`)."""
    capacity_wait: float = Field(default=45.0, ge=0)
    """Seconds a rollout waits for a free session while the server is at capacity (CAPACITY_REACHED), asking again
    at most a second apart; it counts against the setup timeout (`--timeouts.setup`, 60 s): raise both for
    long episodes on a small server."""
    backoff: float = Field(default=0.5, ge=0)
    """Seconds before the first retry; doubled for each next one (with jitter)."""
    token_env: str | None = None
    """An environment variable holding a token sent as `Authorization: Bearer TOKEN` (a private Hugging Face Space;
    our own server's TRACEGYM_ENV_SECRET); the token itself never goes into configs or traces."""
    connect_timeout: float = Field(default=10.0, gt=0)
    """Seconds to open the WebSocket."""
    message_timeout: float = Field(default=60.0, gt=0)
    """Seconds the server may take to answer one message."""


class OpenEnvData(TaskData):
    """One task: the arguments of its reset."""

    reset: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the reset (the seed among them)."""
    spec: Any = None
    """The task's spec from the server's Task API (with `split`), as the server gave it."""


class OpenEnvTask(Task[OpenEnvData, OpenEnvConfig]):
    """One rollout on its own session: the reset's observation in the prompt, the server's tools as tools."""

    parallel_tools = False  # one session's steps happen in order

    def __init__(self, data: OpenEnvData, *, server: Catalog, **options: Any) -> None:
        super().__init__(data, **options)
        self.server = server
        self._offered = False
        """The server's Offer was read into this task's tools."""
        self._holding = False
        """This rollout holds its session (counted in `server.held`)."""
        self.connection: OpenEnvConnection | None = None
        self.rewards: list[float] = []
        """Every reward a step gave, in order."""
        self.steps = 0
        self.done = False
        self.lost: InfrastructureError | None = None
        """Set when the session broke mid-episode: the next stop check ends the rollout with it."""
        self._first = ""
        self._opening: list[Message] | None = None
        """The reset's chat messages, when the observation field holds messages (see `observation_messages`)."""

    # --- reading results (override to read them another way) --------------------------------------------
    def reward_of(self, result: dict[str, Any]) -> float | None:
        """A step's reward; None when it gave none."""
        value = dig(result, self.config.reward_path)
        return float(value) if isinstance(value, int | float) else None

    def done_of(self, result: dict[str, Any]) -> bool:
        """Whether a step ended the episode."""
        return bool(dig(result, self.config.done_path))

    def observation_text(self, result: dict[str, Any]) -> str:
        """What the model reads of a result's observation."""
        observation = result.get("observation")
        if self.config.observation_field is not None and isinstance(observation, dict):
            observation = dig(observation, self.config.observation_field)
        if isinstance(observation, dict):
            observation = {k: v for k, v in observation.items() if k not in ("metadata", "done", "reward")}
        return observation if isinstance(observation, str) else json.dumps(observation)

    def observation_messages(self, result: dict[str, Any]) -> list[Message] | None:
        """The result's observation field as messages, when it holds chat messages; None otherwise."""
        observation = result.get("observation")
        if self.config.observation_field is None or not isinstance(observation, dict):
            return None
        field = dig(observation, self.config.observation_field)
        if not isinstance(field, list) or not all(isinstance(m, dict) and "role" in m for m in field):
            return None
        return [Message.from_openai(m) for m in field]

    # --- the rollout's hooks -----------------------------------------------------------------------------
    async def setup(self) -> None:
        cfg = self.config
        await asyncio.to_thread(self._offer)  # asked once per taskset (before the first task, by `load`)
        self.connection = connection(cfg, self.server)
        try:
            first = await self.connection.open(**self.data.reset)
        except TracegymError as exc:
            raise self.server.full_of_our_own(exc) from None
        self.server.held += 1
        self._holding = True
        self._first = self.observation_text(first)
        self._opening = self.observation_messages(first)
        self._record(first, counts=False)

    def prompt(self) -> list[Message]:
        messages = super().prompt()
        if self._opening is not None:
            return [*(messages if self.config.instructions else messages[:-1]), *self._opening]
        return [*messages[:-1], user(f"{messages[-1].text}\n\n{self._first}".strip())]

    async def env_response(self, trace: Trace) -> EnvResponse:
        if self.config.text_action is None or self.done:
            return None
        result = await self._step({self.config.text_action: trace.last_reply})
        messages = self.observation_messages(result)
        if messages is not None:
            return messages or None  # none: the action ended the episode and the environment added nothing
        text = self.observation_text(result)
        return None if self.done and not text else user(text)  # an empty last word is no message

    async def cleanup(self) -> None:
        if self.connection is not None:
            await self.connection.close()
        if self._holding:
            self._holding = False
            self.server.held -= 1

    @stop
    def said_done(self, trace: Trace) -> bool:
        """The environment said `done`; a session lost mid-episode ends the rollout as an infrastructure error."""
        if self.lost is not None:
            raise self.lost
        return self.done

    @reward
    def env_reward(self, trace: Trace) -> float:
        """The environment's reward: the sum of the steps' rewards (or the last one), 0.0 when it gave none."""
        self._played()
        if not self.rewards:
            return 0.0
        return self.rewards[-1] if self.config.reward_over_steps == "last" else sum(self.rewards)

    @metric
    def env_steps(self, trace: Trace) -> float:
        """Steps taken in the environment."""
        self._played()
        return float(self.steps)

    @metric
    def env_done(self, trace: Trace) -> float:
        """1 when the environment ended the episode."""
        self._played()
        return float(self.done)

    def _played(self) -> None:
        """Scores come from the steps played on the server: a task that never opened it (a stored trace being
        rescored) has none to give, and says so rather than score 0."""
        if self.connection is None:
            raise TaskError("the reward was given by the OpenEnv server during the rollout; a stored trace cannot "
                            "be rescored without playing it again")

    # --- stepping ----------------------------------------------------------------------------------------
    async def _step(self, action: dict[str, Any]) -> dict[str, Any]:
        assert self.connection is not None
        result = await self.connection.step(action)
        self._record(result)
        return result

    def _record(self, result: dict[str, Any], counts: bool = True) -> None:
        given = self.reward_of(result)
        if given is not None and counts:
            self.rewards.append(given)
        if counts:
            self.steps += 1
        self.done = self.done_of(result)

    # --- the tools, known before setup ----------------------------------------------------------------------
    def tool(self, name: str) -> Tool | None:
        self._offer()
        return super().tool(name)

    def tool_specs(self) -> list[ToolSpec]:
        self._offer()
        return super().tool_specs()

    def _offer(self) -> None:
        """Offer the server's tools (its Offer is asked once per taskset): its MCP tools, else (or with
        `tools = "action"`) the one action tool; none for a chat environment (`text_action`)."""
        if not self._offered:
            offer = self.server.offer()
            self._offered = True
            self._offer_tools(offer, offer.mcp_tools or [])

    def _offer_tools(self, offer: Offer, listed: list[dict[str, Any]]) -> None:
        cfg = self.config
        listed = [] if cfg.tools == "action" else listed
        if listed or cfg.tools == "mcp":
            if not listed:
                raise TaskError(f"OpenEnv server {cfg.url} lists no MCP tools (tools = 'mcp')")
            call = self._call_tool_by_step if offer.through_step else self._call_tool_by_mcp
            for t in listed:
                self._add_tool(t["name"], t.get("description") or "", t.get("inputSchema") or t.get("input_schema")
                               or {"type": "object", "properties": {}}, _bound(call, t["name"]))
        elif cfg.text_action is None or cfg.tools != "auto":  # else the reply itself is the action
            schema = offer.action_schema
            self._add_tool(cfg.action_tool, schema.get("description") or "Take one action in the environment; "
                           "returns its observation.", without_metadata(schema), self._act)

    def _add_tool(self, name: str, description: str, parameters: dict[str, Any], call: Any) -> None:
        fn = remote_function(name, description, parameters, call)
        self._tools[name] = Tool(fn, ToolSpec(name=name, description=description, parameters=parameters),
                                 _ANY_ARGUMENTS)

    async def _act(self, **action: Any) -> str:
        return await self._guarded(lambda: self._step(action), self.observation_text)

    async def _call_tool_by_step(self, name: str, **arguments: Any) -> str | list[ContentPart]:
        action = {"type": "call_tool", "tool_name": name, "arguments": arguments}
        return await self._guarded(lambda: self._step(action), lambda r: tool_result_content(r.get("observation")))

    async def _call_tool_by_mcp(self, name: str, **arguments: Any) -> str | list[ContentPart]:
        assert self.connection is not None
        connection = self.connection

        async def call() -> Any:
            """A step like any other: counted, and its `done` and `reward` read where the server gives them
            beside the result (as OpenEnv's servers answer an MCP-style step, and ours every `tools/call`)."""
            result = await connection.mcp("tools/call", {"name": name, "arguments": arguments})
            self._record(result if isinstance(result, dict) else {})
            return result
        return await self._guarded(call, tool_result_content)

    async def _guarded(self, call: Any, text: Any) -> Any:
        """One step as a tool's answer: a refused action is a ToolError the model reads; a lost session ends the
        rollout at the next stop check (so it is recorded once, as infrastructure, not as the model's tool error)."""
        if self.lost is not None:
            return "Error: the environment's session was lost"
        try:
            return text(await call())
        except InfrastructureError as exc:
            self.lost = exc
            return "Error: the environment's session was lost"
        except OpenEnvError as exc:
            if exc.kind == ErrorKind.INFRASTRUCTURE:
                self.lost = InfrastructureError(str(exc))
                return "Error: the environment's session was lost"
            raise ToolError(exc.details()) from None


def _bound(call: Any, name: str) -> Any:
    async def tool(**arguments: Any) -> str | list[ContentPart]:
        return await call(name, **arguments)
    return tool


def tool_result_content(result: Any) -> str | list[ContentPart]:
    """An MCP tool result as the tool message's content: its text content parts joined (else its data as JSON), or,
    when it holds image blocks (`{"type": "image", "data": BASE64, "mimeType": ...}`), its text and images as
    parts, each image a data URI; one flagged as an error is a ToolError."""
    if isinstance(result, dict) and "tool_name" in result:  # a CallToolObservation
        if result.get("error"):
            raise ToolError(str(result["error"].get("message", result["error"])))
        result = result.get("result")
    if isinstance(result, dict):
        blocks = [p for p in result.get("content") or () if isinstance(p, dict)]
        text = "".join(p.get("text", "") for p in blocks) if blocks else json.dumps(result.get("data", result))
        if result.get("isError") or result.get("is_error"):
            raise ToolError(text)
        if any(p.get("type") == "image" for p in blocks):
            return [_mcp_part(p) for p in blocks]
        return text
    return result if isinstance(result, str) else json.dumps(result)


def _mcp_part(block: dict[str, Any]) -> ContentPart:
    """An MCP content block as a part: an image block as its data URI, any other as its text."""
    if block.get("type") == "image":
        mime = block.get("mimeType") or "image/png"
        return ImagePart(image_url={"url": f"data:{mime};base64,{block.get('data', '')}"})
    return TextPart(text=str(block.get("text", "")))


def headers(config: OpenEnvConfig) -> dict[str, str] | None:
    """The request headers `token_env` asks for; a UsageError naming it when it is unset."""
    if config.token_env is None:
        return None
    token = os.environ.get(config.token_env)
    if not token:
        raise UsageError(f"taskset option token_env = {config.token_env!r}: that environment variable is not set")
    return {"Authorization": f"Bearer {token}"}


def dig(value: Any, path: str) -> Any:
    """`value` at a dotted path of dict keys; None where a key is missing."""
    for key in path.split(".") if path else ():
        value = value.get(key) if isinstance(value, dict) else None
    return value


def without_metadata(schema: dict[str, Any]) -> dict[str, Any]:
    """An action schema as tool parameters: openenv's `metadata` field and the titles left out."""
    properties = {k: {f: v for f, v in p.items() if f != "title"} for k, p in schema.get("properties", {}).items()
                  if k != "metadata"}
    kept = {k: v for k, v in schema.items() if k not in ("title", "description", "properties", "required")}
    return {**kept, "type": "object", "properties": properties,
            "required": [r for r in schema.get("required", []) if r in properties]}


def connection(config: OpenEnvConfig, catalog: Catalog | None = None) -> OpenEnvConnection:
    """A session with the configured server (not open yet); a CAPACITY_REACHED frame tells `catalog` the capacity."""
    return OpenEnvConnection(config.url, retries=config.retries, backoff=config.backoff, headers=headers(config),
                             connect_timeout=config.connect_timeout, message_timeout=config.message_timeout,
                             capacity_wait=config.capacity_wait,
                             on_capacity=catalog.learned_capacity if catalog is not None else None)


class OpenEnvTaskset(Taskset[OpenEnvConfig]):
    """Rollouts on an OpenEnv server's environment; `OpenEnvTaskset({"url": "ws://127.0.0.1:8001"})`."""

    id = "openenv"
    description = "An environment on an OpenEnv server, one WebSocket session per rollout."
    task_class = OpenEnvTask

    def __init__(self, config: OpenEnvConfig | Mapping[str, Any] | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        if not self.config.url:
            raise UsageError("taskset 'openenv': field 'url' is required (ws://HOST:PORT), or use the id openenv:URL")
        if "id" not in options:
            self.id = f"{SCHEME}:{self.config.url}"
        self._server = Catalog(self.config.url, functools.partial(headers, self.config),
                               functools.partial(connection, self.config))

    def capacity(self) -> int | None:
        """The sessions the server holds at once, where it says so (`max_sessions` in its /health) or said so when
        full; None when unknown (openenv's own server says it only when full). Rollouts beyond it wait for a free
        session."""
        self.offer()
        return self._server.capacity

    def load(self) -> Iterator[OpenEnvData]:
        cfg = self.config
        self.offer()  # before the first task: a dead server is one line, not a failed rollout each
        if cfg.split is not None:
            limit = cfg.num_tasks if "num_tasks" in cfg.model_fields_set else None
            for index, spec in enumerate(read_split(cfg.url, cfg.split, limit, headers(cfg), cfg.connect_timeout)):
                yield OpenEnvData(id=f"{cfg.split}-{index}", prompt=cfg.instructions, system_prompt=cfg.system_prompt,
                                  reset={**cfg.reset_args, "split": cfg.split, "index": index}, spec=spec)
            return
        for index in range(cfg.num_tasks):
            yield OpenEnvData(id=str(index), prompt=cfg.instructions, system_prompt=cfg.system_prompt,
                              reset={**cfg.reset_args, "seed": cfg.seed + index})

    def offer(self) -> Offer:
        """What the server offers (asked once): its tools are the tasks' before setup; a UsageError naming the
        server when it does not answer or its tools cannot be known."""
        try:
            offer = self._server.offer()
        except TracegymError as exc:
            said = str(exc) if str(exc).endswith("?") else f"{exc}: its tools must be known before the first rollout"
            raise UsageError(said) from None
        if self.config.tools == "mcp" and not offer.mcp_tools:
            raise UsageError(f"OpenEnv server {self.config.url} lists no MCP tools (tools = 'mcp')")
        return offer

    def _task_options(self) -> dict[str, Any]:
        return {**super()._task_options(), "server": self._server, "max_turns": self.config.max_turns}


def at_url(url: str) -> Any:
    """The taskset factory the id `openenv:URL` names: options as for OpenEnvTaskset; a `url` option, when given,
    must be the id's (a command passes the saved options back)."""
    def openenv_at(config: OpenEnvConfig | Mapping[str, Any] | None = None) -> OpenEnvTaskset:
        options = config.model_dump() if isinstance(config, OpenEnvConfig) else dict(config or {})
        if options.get("url") not in (None, "", url):
            raise UsageError(f"taskset 'openenv:{url}': option url = {options['url']!r} differs from the id's")
        return OpenEnvTaskset({**options, "url": url})
    return openenv_at
