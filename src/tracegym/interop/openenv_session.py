"""OpenEnv session: one remote agent playing a taskset's tasks, one rollout at a time (what OpenEnv calls an
episode) through the one rollout loop, whose model turns are the agent's steps.

The loop asks its model client for a turn; here that client (`AgentTurns`) hands the request to the session and
waits for the agent's next `step`. So tools, environment answers, stops, `max_turns` and scoring behave exactly as
in any rollout, and its trace is an ordinary one (without token ids: the agent's model is not ours). A session and
its rollouts live in one process: the server's (`--openenv.workers 0`) or a worker's (`openenv_worker`); a rollout is
one of the taskset's (`in_process`) or, for a multi-agent taskset, the agent's seat in an episode (`in_episodes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Awaitable, Callable
from typing import Any

from tracegym.core.errors import TracegymError, UsageError
from tracegym.core.messages import Message
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.evaluate import run_episode
from tracegym.envs.rollout import LOOP_METRICS, Rollout, Timeouts
from tracegym.envs.seats import Seats
from tracegym.envs.taskset import Taskset
from tracegym.interop.openenv_protocol import (
    ResetChoice,
    TasksetAction,
    TasksetObservation,
    TasksetState,
    ToolCallAction,
    mcp_tools,
)
from tracegym.interop.openenv_task_api import SPLIT
from tracegym.models.client import ModelRequest, ModelResponse

AGENT = "openenv-agent"
"""The model name on the traces of served rollouts."""
WAIT_S = 10.0**9
"""The model stage's timeout: the agent may think as long as it likes; the server's idle timeout ends a session
that stopped talking."""

TOOL_ERROR_STARTS = ("Error: ", "{'error': ")
"""How the tool error texts of `Task.tool_error_text` and of environment classes (TRL's) begin."""


class SessionError(Exception):
    """A message the session cannot act on now (a step before reset, after the end); the session goes on."""


class AgentTurns:
    """The model client of a served rollout: each turn's request goes out to the agent, its step comes back."""

    name = AGENT

    def __init__(self) -> None:
        self.out: asyncio.Queue[list[Message] | None] = asyncio.Queue()
        """Each turn's messages as the agent is asked it (None: the rollout is over)."""
        self.reply: asyncio.Future[Message] | None = None
        self.given: list[Message] = []
        """The agent's turns so far."""
        self.tools: list[dict[str, Any]] = []
        """The tools of the last request, OpenAI-shaped."""
        self.live: Trace | None = None
        """The rollout's trace as it grows (a single-agent rollout's)."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        message = await self.turn(request.messages, [t.to_openai() for t in request.tools or []])
        return ModelResponse(message, "tool_calls" if message.tool_calls else "stop")

    async def turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        """The agent's answer to the turn these messages ask for."""
        self.reply = asyncio.get_running_loop().create_future()
        self.tools = tools
        self.out.put_nowait(messages)
        return await self.reply

    def answer(self, message: Message) -> None:
        """Give the pending turn the agent's message; SessionError when no turn waits for one."""
        if self.reply is None or self.reply.done():
            raise SessionError("no turn is waiting for the agent")
        self.given.append(message)
        self.reply.set_result(message)

    def waiting(self) -> bool:
        return self.reply is not None and not self.reply.done()

    def stop(self) -> None:
        """The rollout is over: a pending turn is answered with an error."""
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(SessionError("the episode is over"))

    async def aclose(self) -> None:
        """Nothing to release."""


Runner = Callable[[TaskData, AgentTurns, Timeouts], Awaitable[Trace]]
"""Runs one rollout of a task with the agent as its model; its trace."""


def in_process(taskset: Taskset) -> Runner:
    """Rollouts of `taskset` run in this process."""
    async def run(data: TaskData, agent: AgentTurns, timeouts: Timeouts) -> Trace:
        task = taskset.task(data)
        trace = Trace(task=data, taskset=task.taskset_id, model=AGENT, sampling=Sampling().model_dump(mode="json"))
        agent.live = trace
        await Rollout(task, agent, Sampling(), timeouts, trace).run()
        return trace
    return run


def in_episodes(taskset: Taskset, seat: str, others: Seats) -> Runner:
    """Episodes of a multi-agent `taskset` run in this process, the agent playing `seat` and `others` binding the
    other members; the agent's seat's trace."""
    async def run(data: TaskData, agent: AgentTurns, timeouts: Timeouts) -> Trace:
        episode = await run_episode(taskset, data, agent, seats=others, timeouts=timeouts, infra_retries=0)
        if seat not in episode.traces:
            raise SessionError(f"the episode ended before seat {seat!r} played: "
                               f"{episode.error.message if episode.error else 'no trace'}")
        return episode.traces[seat]
    return run


class TaskPicker:
    """Finds the task a reset asks for; shared by every session of one server."""

    def __init__(self, taskset: Taskset) -> None:
        self.taskset = taskset
        self.rows: list[TaskData] | None = list(taskset) if taskset.bounded else None
        self._turn = itertools.count()
        self.first_tools = taskset.task(self.row(0)).tool_specs()
        """The tools of the first task, for `tools/list` before any reset (the same for most tasksets)."""

    def pin(self, choice: ResetChoice) -> ResetChoice:
        """`choice`, naming the next task in turn by its index where it names none (so a replay picks it again)."""
        if choice.key is not None or choice.index is not None or choice.seed is not None:
            return choice
        turn = next(self._turn)
        return choice.model_copy(update={"index": turn % len(self.rows) if self.rows else turn})

    def pick(self, choice: ResetChoice) -> TaskData:
        """The row `choice` names; UsageError when there is none."""
        if choice.split not in (None, SPLIT):
            raise UsageError(f"taskset {self.taskset.id!r} has one split, {SPLIT!r}: no split {choice.split!r}")
        if choice.key is not None:
            try:
                return self.taskset.row(choice.key, within=None if self.rows is not None else 100_000)
            except KeyError as exc:
                raise UsageError(exc.args[0]) from None
        if choice.index is not None:
            return self.row(choice.index)
        if choice.seed is not None:
            return self.row(random.Random(choice.seed).randrange(len(self.rows)) if self.rows else choice.seed)
        return self.pick(self.pin(choice))

    def row(self, index: int) -> TaskData:
        if self.rows is None:
            return self.taskset[index]
        if index >= len(self.rows):
            raise UsageError(f"taskset {self.taskset.id!r} has {len(self.rows)} tasks; no index {index}")
        return self.rows[index]


class TasksetSession:
    """One agent's session: `reset` starts a rollout (ending any running one), `step` plays a turn of it."""

    def __init__(self, taskset: Taskset, picker: TaskPicker, timeouts: Timeouts | None = None,
                 runner: Runner | None = None) -> None:
        self.taskset, self.picker = taskset, picker
        self.timeouts = timeouts or Timeouts(model=WAIT_S, rollout=WAIT_S)
        self.runner = runner or in_process(taskset)
        self.data: TaskData | None = None
        self.trace: Trace | None = None
        """The last rollout's trace, once it ended."""
        self.failure: str | None = None
        """Why the last rollout produced no trace (it raised), once it ended."""
        self.episode_id: str | None = None
        self.choice: ResetChoice | None = None
        """The last episode's choice of task, pinned (`TaskPicker.pin`)."""
        self.episodes = self.moves = 0
        """Episodes started and turns played, so far."""
        self.agent = AgentTurns()
        self._running: asyncio.Task[None] | None = None
        self._shown = 0
        self._ended = False

    # --- the protocol ------------------------------------------------------------------------------------
    async def reset(self, choice: ResetChoice) -> TasksetObservation:
        """Start a rollout of the chosen task; its prompt (and tools) as the first observation."""
        choice = self.picker.pin(choice)
        data = self.picker.pick(choice)
        self.choice, self.episodes = choice, self.episodes + 1
        await self.close()
        self.data, self.trace, self.failure, self.agent = data, None, None, AgentTurns()
        self.episode_id, self._shown, self._ended = choice.episode_id, 0, False
        self._running = asyncio.create_task(self._play(data, self.agent))
        observation = await self._advance()
        if observation.done and self.trace is not None and self.trace.errors:  # it ended before the agent's turn
            raise SessionError(f"the task could not start: {self.trace.errors[0].message}")
        return observation.model_copy(update={"tools": self.agent.tools, "task": data.key})

    async def step(self, action: TasksetAction) -> TasksetObservation:
        """Play one agent turn; what the rollout added until the agent's next turn or its end."""
        self._check_waiting()
        self.moves += 1
        self.agent.answer(action.to_message(len(self.agent.given) + 1))
        return await self._advance()

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[TasksetObservation, Any, bool]:
        """A turn calling one tool (MCP `tools/call`): the step's observation (`done` and the reward once the turn
        ended the episode), the tool message's content (its text, or OpenAI content parts where it holds images),
        and whether the call failed (counted by the loop where the rollout's trace grows in sight; in a multi-agent
        episode, whose seat's trace arrives at its end, told by the text: the error texts of `Task` and of
        environment classes, TOOL_ERROR_STARTS; a task's own text is not recognised)."""
        before = self._tool_errors()
        observation = await self.step(TasksetAction(tool_calls=[ToolCallAction(name=name, arguments=arguments)]))
        results = [m.get("content") for m in observation.messages if m["role"] == "tool"]
        content = results[0] if results else observation.text
        if self.agent.live is not None or self.trace is not None:
            return observation, content, self._tool_errors() > before
        return observation, content, bool(results) and isinstance(content, str) and content.startswith(
            TOOL_ERROR_STARTS)

    def tools(self) -> list[dict[str, Any]]:
        """The tools of the rollout's task (of the first task before any reset), MCP-shaped."""
        if self.data is None or not self.agent.tools:
            return mcp_tools(self.picker.first_tools)
        return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                 "inputSchema": t["function"].get("parameters", {})} for t in self.agent.tools]

    def state(self) -> TasksetState:
        trace = self.trace
        return TasksetState(episode_id=self.episode_id, step_count=len(self.agent.given),
                            task=self.data.key if self.data else None, done=self._ended,
                            reward=trace.reward if trace and self._ended else None,
                            stop_reason=trace.stop_reason.value if trace and trace.stop_reason else None)

    async def close(self) -> None:
        """End the running rollout (cancelled: its cleanup runs)."""
        running, self._running = self._running, None
        self.agent.stop()
        if running is not None and not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    # --- inside ------------------------------------------------------------------------------------------
    async def _play(self, data: TaskData, agent: AgentTurns) -> None:
        try:
            self.trace = await self.runner(data, agent, self.timeouts)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the rollout itself failed (an episode that never reached the seat, ...): said
            self.failure = str(exc) if isinstance(exc, TracegymError) else f"{type(exc).__name__}: {exc}"
        finally:
            agent.stop()
            agent.out.put_nowait(None)  # the rollout is over: wake whoever waits for its next turn

    async def _advance(self) -> TasksetObservation:
        """Run the rollout to the agent's next turn (or its end) and say what it added."""
        messages = await self.agent.out.get()
        if messages is not None:
            return self._observation(messages, done=False)
        self._ended = True
        if self.trace is None:
            raise SessionError(f"the episode failed: {self.failure or 'its rollout ended without a trace'}")
        return self._observation(self.trace.messages, done=True)

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

    def _tool_errors(self) -> int:
        trace = self.trace or self.agent.live
        return int((trace.metrics.get(LOOP_METRICS[1]) or 0) if trace else 0)

    def _check_waiting(self) -> None:
        """SessionError when the rollout has no turn for the agent to play."""
        if self.data is None:
            raise SessionError("no episode: send `reset` first")
        if self._ended or not self.agent.waiting():
            trace = self.trace
            ended = trace.stop_reason.value if trace and trace.stop_reason else "ended"
            raise SessionError(f"the episode is over ({ended}); send `reset` to start another")
