"""OpenEnv session: one remote agent playing a taskset's tasks, one rollout at a time (what OpenEnv calls an
episode) through the one rollout loop, whose model turns are the agent's steps.

The loop asks its model client for a turn; here that client (`AgentTurns`) hands the request to the session and
waits for the agent's next `step`. So tools, environment answers, stops, `max_turns` and scoring behave exactly as
in any rollout, and its trace is an ordinary one (without token ids: the agent's model is not ours).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from typing import Any

from tracegym.core.errors import UsageError
from tracegym.core.messages import Message
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.rollout import LOOP_METRICS, Rollout, Timeouts
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset
from tracegym.interop.openenv_protocol import (
    ResetChoice,
    TasksetAction,
    TasksetObservation,
    TasksetState,
    ToolCallAction,
    mcp_tools,
)
from tracegym.models.client import ModelRequest, ModelResponse

AGENT = "openenv-agent"
"""The model name on the traces of served rollouts."""
WAIT_S = 10.0**9
"""The model stage's timeout: the agent may think as long as it likes; the server's idle timeout ends a session
that stopped talking."""


class SessionError(Exception):
    """A message the session cannot act on now (a step before reset, after the end); the session goes on."""


class AgentTurns:
    """The model client of a served rollout: each turn's request goes out to the agent, its step comes back."""

    name = AGENT

    def __init__(self, out: asyncio.Queue[ModelRequest | None]) -> None:
        self.out = out
        self.reply: asyncio.Future[Message] | None = None

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.reply = asyncio.get_running_loop().create_future()
        self.out.put_nowait(request)
        message = await self.reply
        return ModelResponse(message, "tool_calls" if message.tool_calls else "stop")

    async def aclose(self) -> None:
        """Nothing to release."""


class TaskPicker:
    """Finds the task a reset asks for; shared by every session of one server."""

    def __init__(self, taskset: Taskset) -> None:
        self.taskset = taskset
        self.rows: list[TaskData] | None = list(taskset) if taskset.bounded else None
        self._turn = itertools.count()
        self.first_tools = taskset.task(self.row(0)).tool_specs()
        """The tools of the first task, for `tools/list` before any reset (the same for most tasksets)."""

    def pick(self, choice: ResetChoice) -> TaskData:
        """The row `choice` names; UsageError when there is none."""
        if choice.key is not None:
            try:
                return self.taskset.row(choice.key, within=None if self.rows is not None else 100_000)
            except KeyError as exc:
                raise UsageError(exc.args[0]) from None
        if choice.index is not None:
            return self.row(choice.index)
        if choice.seed is not None:
            return self.row(random.Random(choice.seed).randrange(len(self.rows)) if self.rows else choice.seed)
        return self.row(next(self._turn) % len(self.rows) if self.rows else next(self._turn))

    def row(self, index: int) -> TaskData:
        if self.rows is None:
            return self.taskset[index]
        if index >= len(self.rows):
            raise UsageError(f"taskset {self.taskset.id!r} has {len(self.rows)} tasks; no index {index}")
        return self.rows[index]


class TasksetSession:
    """One agent's session: `reset` starts a rollout (ending any running one), `step` plays a turn of it."""

    def __init__(self, taskset: Taskset, picker: TaskPicker, timeouts: Timeouts | None = None) -> None:
        self.taskset, self.picker = taskset, picker
        self.timeouts = timeouts or Timeouts(model=WAIT_S, rollout=WAIT_S)
        self.task: Task[Any, Any] | None = None
        self.trace: Trace | None = None
        """The running (or last) rollout's trace."""
        self.episode_id: str | None = None
        self._turns: asyncio.Queue[ModelRequest | None] = asyncio.Queue()
        self._agent = AgentTurns(self._turns)
        self._running: asyncio.Task[None] | None = None
        self._shown = 0
        self._steps = 0
        self._ended = False

    # --- the protocol ------------------------------------------------------------------------------------
    async def reset(self, choice: ResetChoice) -> TasksetObservation:
        """Start a rollout of the chosen task; its prompt (and tools) as the first observation."""
        data = self.picker.pick(choice)
        await self.close()
        self.task = task = self.taskset.task(data)
        self.episode_id, self._shown, self._ended, self._steps = choice.episode_id, 0, False, 0
        self.trace = Trace(task=task.data, taskset=task.taskset_id, model=AGENT,
                           sampling=Sampling().model_dump(mode="json"))
        self._running = asyncio.create_task(self._play(Rollout(task, self._agent, Sampling(), self.timeouts,
                                                               self.trace)))
        observation = await self._advance()
        if observation.done and self.trace.errors:  # it ended before the agent's first turn: say why
            raise SessionError(f"the task could not start: {self.trace.errors[0].message}")
        return observation.model_copy(update={"tools": [s.to_openai() for s in task.tool_specs()], "task": data.key})

    async def step(self, action: TasksetAction) -> TasksetObservation:
        """Play one agent turn; what the rollout added until the agent's next turn or its end."""
        reply = self._waiting()
        self._steps += 1
        reply.set_result(action.to_message(self._steps))
        return await self._advance()

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """A turn calling one tool (MCP `tools/call`): its result text and whether it failed."""
        before = self._tool_errors()
        observation = await self.step(TasksetAction(tool_calls=[ToolCallAction(name=name, arguments=arguments)]))
        results = [m["content"] for m in observation.messages if m["role"] == "tool"]
        return (results[0] if results else observation.text), self._tool_errors() > before

    def tools(self) -> list[dict[str, Any]]:
        """The tools of the rollout's task (of the first task before any reset), MCP-shaped."""
        return mcp_tools(self.task.tool_specs() if self.task is not None else self.picker.first_tools)

    def state(self) -> TasksetState:
        trace = self.trace
        return TasksetState(episode_id=self.episode_id, step_count=trace.num_turns if trace else 0,
                            task=trace.task_key if trace else None, done=self._ended,
                            reward=trace.reward if trace and self._ended else None,
                            stop_reason=trace.stop_reason.value if trace and trace.stop_reason else None)

    async def close(self) -> None:
        """End the running rollout (cancelled: its cleanup runs)."""
        running, self._running = self._running, None
        if running is not None and not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        self._turns = asyncio.Queue()
        self._agent.out = self._turns

    # --- inside ------------------------------------------------------------------------------------------
    async def _play(self, rollout: Rollout) -> None:
        try:
            await rollout.run()
        finally:
            self._turns.put_nowait(None)  # the rollout is over: wake whoever waits for its next turn

    async def _advance(self) -> TasksetObservation:
        """Run the rollout to the agent's next turn (or its end) and say what it added."""
        request = await self._turns.get()
        assert self.trace is not None
        if request is None:
            self._ended = True
            return self._observation(self.trace.messages, done=True)
        return self._observation(request.messages, done=False)

    def _observation(self, messages: list[Message], done: bool) -> TasksetObservation:
        new = [m for m in messages[self._shown:] if m.role != "assistant"]
        self._shown = len(messages)
        observation = TasksetObservation(messages=[m.to_openai() for m in new],
                                         text="\n\n".join(m.text for m in new if m.text), done=done)
        if not done:
            return observation
        trace = self.trace
        assert trace is not None
        return observation.model_copy(update={
            "reward": trace.reward, "rewards": {k: r.score for k, r in trace.rewards.items()},
            "metrics": dict(trace.metrics), "stop_reason": trace.stop_reason.value if trace.stop_reason else None,
            "metadata": {"errors": [e.model_dump(mode="json") for e in trace.errors]} if trace.errors else {}})

    def _waiting(self) -> asyncio.Future[Message]:
        """The loop's pending request for the agent's turn; SessionError when there is none to play."""
        if self.trace is None:
            raise SessionError("no episode: send `reset` first")
        reply = self._agent.reply
        if self._ended or reply is None or reply.done():
            ended = self.trace.stop_reason.value if self.trace.stop_reason else "ended"
            raise SessionError(f"the episode is over ({ended}); send `reset` to start another")
        return reply

    def _tool_errors(self) -> int:
        return int((self.trace.metrics.get(LOOP_METRICS[1]) or 0) if self.trace else 0)
