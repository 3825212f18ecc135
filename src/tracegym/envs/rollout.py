"""Rollout: the one loop that runs a Task against a model and records everything on a Trace.

A turn: call the model -> append its reply -> run its tool calls (each with its own timeout; failures become
tool messages; a result longer than the task's `tool_result_limit` is cut or refused, `Task.tool_result_over`)
or ask the task for an environment response -> check stops. The rollout ends when the model answers with no
tool call and the task has no response, a stop fires, `max_turns` is reached, the context or completion budget
runs out (truncated), a stage times out, or an error is raised. Scoring runs after every
normal end. Nothing here raises for a task's or model's failure: errors are classified and put on the trace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import (
    ContextLengthError,
    ErrorKind,
    ImageRefused,
    StageTimeout,
    TraceError,
    classify,
)
from tracegym.core.messages import ContentPart, Message, TextPart, ToolCall, tool, user
from tracegym.core.sampling import Sampling
from tracegym.core.timing import Span
from tracegym.core.trace import REPLIES_CUT, RewardScore, StopReason, Trace
from tracegym.envs.scorers import NotApplicable
from tracegym.envs.task import EnvResponse, Task
from tracegym.envs.thread_lane import contained
from tracegym.models.client import ModelClient, ModelRequest, ModelResponse
from tracegym.models.image_support import policy_of, refused_image
from tracegym.runtimes.watchdog import watch_named

T = TypeVar("T")
CALLS_ABANDONED = "calls_abandoned"
"""Model calls of an agent program that closed its connection mid-stream (`envs.proxy`): cancelled, not recorded."""
TOOL_RESULTS_CUT = "tool_results_cut"
"""Tool results cut to the task's `tool_result_limit` (`Rollout.limited`)."""
LOOP_METRICS = ("tool_calls", "tool_errors", CALLS_ABANDONED, TOOL_RESULTS_CUT, REPLIES_CUT)
"""Metrics the loop (or the proxy for a program) counts itself, not computed by a task's scorers."""


class Timeouts(BaseModel):
    """Seconds each stage may take; hitting one ends the rollout (a tool's only fails that call). Only a
    deadline that passes is a timeout: a TimeoutError the stage's own code raises is that code's error."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    setup: float = Field(default=60.0, gt=0)
    """Task setup (e.g. starting a sandbox)."""
    model: float = Field(default=300.0, gt=0)
    """One model call, every HTTP attempt and retry backoff included: at this deadline the call is cancelled
    and the rollout ends as a timeout. Each attempt also has its own limit (`Endpoint.timeout`, at most this
    one by default), which only matters below it: a hung attempt is then retried within the stage."""
    tool: float = Field(default=60.0, gt=0)
    """One tool call. A sync tool still running then is abandoned, not killed (Python cannot kill a thread):
    the rollout moves on and its daemon thread runs on without holding a slot (see `envs.thread_lane`)."""
    env_response: float = Field(default=60.0, gt=0)
    """One environment response."""
    scoring: float = Field(default=60.0, gt=0)
    """Each reward, metric or stop function (a stop after every turn)."""
    rollout: float = Field(default=1800.0, gt=0)
    """The whole rollout, scoring included."""


class Ended(Exception):
    """The loop ended for `reason` (raised by a turn step; a harness's model calls end the same way)."""

    def __init__(self, reason: StopReason, by: str | None = None) -> None:
        self.reason, self.by = reason, by


class Rollout:
    """The state of one running rollout; `run()` drives it to a finished trace. Its turn steps (`model_turn`,
    `run_tools`, `check_stops`) are the one turn machinery: an episode (`envs.episode`) drives one Rollout per
    member through them, so a member's turn is a rollout's turn. `t0`: the clock its spans count from (an
    episode's members share the episode's)."""

    def __init__(self, task: Task, model: ModelClient, sampling: Sampling, timeouts: Timeouts,
                 trace: Trace, t0: float | None = None) -> None:
        self.task, self.model, self.sampling, self.timeouts, self.trace = task, model, sampling, timeouts, trace
        self._t0 = time.monotonic() if t0 is None else t0
        self.turn = 0
        self._images_checked: set[str] = set()

    async def run(self) -> Trace:
        """Run the loop, then scoring and cleanup, all inside the rollout timeout."""
        trace = self.trace
        try:
            await asyncio.wait_for(self._loop_and_score(), self.timeouts.rollout)
        except TimeoutError:
            self._error(ErrorKind.TIMEOUT, "rollout", f"rollout exceeded {self.timeouts.rollout}s")
            self.end(StopReason.TIMEOUT)
            self.mark_unscored()
        except asyncio.CancelledError:
            self.end(StopReason.CANCELLED)
            raise
        finally:
            await self._cleanup()
            trace.spans.append(Span(name="total", start=0.0, end=self.now()))
        return trace

    async def _loop_and_score(self) -> None:
        try:
            await contained(self._loop())  # setup, prompt and env_response run in this task: one wrap covers them
        except Ended as ended:
            self.end(ended.reason, ended.by)
        except Exception as exc:  # every failure becomes data on the trace
            self.error_from(exc, self.stage)
            self.end(StopReason.after(exc))
        if not self.trace.ended_normally:
            self.mark_unscored()
        else:
            await self._score()

    # --- the loop ----------------------------------------------------------------------------------------
    stage = "setup"
    """The stage running now (an error raised out of a step is recorded at it)."""

    async def _loop(self) -> None:
        graph = self.trace.graph
        await self.timed("setup", self.task.setup(), self.timeouts.setup)
        if self.task.harness is not None:  # an agent program drives this rollout instead of the turns below
            raise Ended(await self.task.harness.drive(self))
        for message in self.task.prompt():
            graph.add(message)
        self.trace.prompt_length = len(graph.nodes)
        for turn in range(self.task.max_turns):
            self.turn = turn
            reply = await self.model_turn()
            if reply.tool_calls:
                await self.run_tools(reply.tool_calls)
            else:
                response = await self.timed("env_response", self.task.env_response(self.trace),
                                             self.timeouts.env_response)
                if not _append_response(self.trace, response):
                    raise Ended(StopReason.COMPLETED)
            await self.check_stops()
        raise Ended(StopReason.MAX_TURNS)

    async def model_turn(self, malformed: Callable[[Message], bool] | None = None, *,
                         length_ends: bool = True) -> Message:
        """Call the model on the current branch and append its reply (`call_model`); `Ended(TRUNCATED)` when the
        completion budget ran out too (unless `length_ends` is False: an episode member's reply cut short is still
        its move). `malformed(reply)` true marks the reply's node `parse_error`: kept, never trained on."""
        request = ModelRequest(
            messages=self.trace.graph.messages(),
            tools=self.task.tool_specs(),
            sampling=self.sampling,
            prefix=self.trace.graph.token_prefix(),
            session=self.trace.episode_id or self.trace.id,  # an episode's members share one server
        )
        response = await self.call_model(request, malformed)
        if response.finish_reason == "length":
            if length_ends:
                raise Ended(StopReason.TRUNCATED)
            self.count(REPLIES_CUT, 1)  # a member's move all the same: the trace says it was cut (`Trace.cut`)
        return response.message

    async def call_model(self, request: ModelRequest,
                         malformed: Callable[[Message], bool] | None = None) -> ModelResponse:
        """One model call within the model timeout, its reply appended to the graph's head with its tokens and
        its usage counted; `Ended(TRUNCATED)` (the error recorded) when the prompt overflowed the context. The
        loop's turns and the interception proxy's calls (`envs.proxy`) both go through here."""
        self.trace.tools = list(request.tools)
        self.refuse_images(request)
        try:
            response = await self.timed("model", self.model.complete(request), self.timeouts.model)
        except ContextLengthError as exc:
            self.error_from(exc, "model")
            raise Ended(StopReason.TRUNCATED) from None
        self.trace.graph.add_model_turn(
            response.message,
            response.prompt_token_ids,
            response.completion_token_ids,
            response.completion_logprobs,
            temperature=request.sampling.temperature,
            policy_version=response.policy_version,
            parse_error=malformed is not None and malformed(response.message),
            prompt_images=response.prompt_images,
            routed_experts=response.routed_experts,
        )
        self.trace.usage.prompt_tokens += response.prompt_tokens
        self.trace.usage.completion_tokens += response.completion_tokens
        return response

    def refuse_images(self, request: ModelRequest) -> None:
        """ImageRefused (at stage `model`) naming the taskset, the task, the message and the image when the request
        carries an image the model cannot be given (`models.image_support`); an image found good is not read again
        on a later turn."""
        refused = refused_image(request.messages, policy_of(self.model), self._images_checked)
        if refused is not None:
            self.stage = "model"
            raise ImageRefused(f"taskset {self.trace.taskset!r}, task {self.trace.task_key!r}, {refused}")

    async def run_tools(self, calls: list[ToolCall]) -> None:
        """Run one turn's tool calls (concurrently when the task allows) and append their answers."""
        self.count(LOOP_METRICS[0], len(calls))
        if self.task.parallel_tools:
            results = await asyncio.gather(*(self.run_tool(c) for c in calls))
        else:
            results = [await self.run_tool(c) for c in calls]
        for call, content in zip(calls, results, strict=True):
            self.trace.graph.add(tool(content, tool_call_id=call.id, name=call.name))

    async def run_tool(self, call: ToolCall) -> str | list[ContentPart]:
        """One tool call; any failure is returned as the text the model sees, and recorded (rescore replays
        stored calls through this too, so its answers compare with the stored ones)."""
        stage = f"tool:{call.name}"
        impl = self.task.tool(call.name)
        try:
            if impl is None:
                known = ", ".join(s.name for s in self.task.tool_specs()) or "none"
                raise ValueError(f"unknown tool {call.name!r} (tools: {known})")
            arguments = call.parsed_arguments()
            return self.limited(call.name, await self.timed(stage, impl.call(arguments), self.timeouts.tool))
        except StageTimeout as exc:
            self._tool_failed(ErrorKind.TIMEOUT, stage, str(exc))
            return self.task.tool_error_text(exc)
        except Exception as exc:  # whatever a tool raises is its answer: the model is told, the rollout goes on
            self._tool_failed(ErrorKind.TOOL, stage, f"{type(exc).__name__}: {exc}")
            return self.task.tool_error_text(exc)

    def limited(self, name: str, result: str | list[ContentPart]) -> str | list[ContentPart]:
        """A tool result within the task's `tool_result_limit` characters of text: whole, cut there with a note
        (counted as `tool_results_cut`), or refused (ValueError: the call fails as a tool error), as the task's
        `tool_result_over` says."""
        limit = self.task.tool_result_limit
        text = result if isinstance(result, str) else "".join(p.text for p in result if isinstance(p, TextPart))
        if limit is None or len(text) <= limit:
            return result
        if self.task.tool_result_over == "refuse":
            raise ValueError(f"the result of tool {name!r} has {len(text):,} characters, more than this task's "
                             f"tool_result_limit of {limit:,}: refused")
        self.count(TOOL_RESULTS_CUT, 1)
        cut = text[:limit] + f"\n[... {len(text) - limit:,} more characters cut: the tool result limit is {limit:,}]"
        return cut if isinstance(result, str) else [TextPart(text=cut), *(p for p in result if
                                                                          not isinstance(p, TextPart))]

    def _tool_failed(self, kind: ErrorKind, stage: str, message: str) -> None:
        self.count(LOOP_METRICS[1], 1)
        self._error(kind, stage, message)

    async def check_stops(self) -> None:
        """Each stop, in order, under the scoring timeout. One that raises or times out ends the rollout with
        the error at stage `stop:<name>` and leaves it unscored, like any failure of task code mid-rollout:
        where a healthy stop would have ended it is unknown, so no reward would be honest (re-score later)."""
        for scorer in self.task.scorers_of_kind("stop"):
            fired = await self.timed(f"stop:{scorer.name}", self.task.call_scorer(scorer, self.trace),
                                      self.timeouts.scoring)
            if fired:
                raise Ended(StopReason.STOP_CONDITION, scorer.name)

    # --- scoring -----------------------------------------------------------------------------------------
    async def _score(self) -> None:
        start = self.now()
        await score(self.task, self.trace, self.timeouts.scoring, turn=self.turn)
        self.trace.spans.append(Span(name="scoring", start=start, end=self.now()))

    def mark_unscored(self) -> None:
        """Record every reward and metric of the task as unscored (None) on the trace."""
        for scorer in self.task.scorers:
            if scorer.kind != "stop":
                record_score(self.trace, scorer.kind, scorer.name, scorer.weight, None)

    # --- helpers -----------------------------------------------------------------------------------------
    async def timed(self, stage: str, aw: Awaitable[T], timeout: float) -> T:
        """Await one stage within its timeout (see `within`) and record its span; an error it raises into the
        loop is recorded at it."""
        self.stage = stage
        start = self.now()
        try:
            return await within(stage, aw, timeout)
        finally:
            turn = self.turn if stage != "setup" else None
            self.trace.spans.append(Span(name=stage, start=start, end=self.now(), turn=turn))

    async def _cleanup(self) -> None:
        self.trace.metrics.update(self.task.sandbox_records())  # read before the cleanup closes the sandbox
        try:
            await asyncio.wait_for(contained(self.task.cleanup()), self.timeouts.setup)
        except Exception as exc:  # cleanup runs in a finally: its failure is recorded, never raised
            self.error_from(exc, "cleanup")

    def error_from(self, exc: BaseException, stage: str) -> None:
        """Record `exc` on the trace at `stage`, classified (`classify`)."""
        self.trace.errors.append(classify(exc, stage, self.turn))

    def _error(self, kind: ErrorKind, stage: str, message: str) -> None:
        self.trace.errors.append(TraceError(kind=kind, stage=stage, message=message, turn=self.turn))

    def end(self, reason: StopReason, by: str | None = None) -> None:
        """Record why the rollout ended (the first reason given stays)."""
        if self.trace.stop_reason is None:
            self.trace.stop_reason, self.trace.stopped_by = reason, by

    def count(self, name: str, n: int) -> None:
        """Add `n` to the trace's metric `name`."""
        self.trace.metrics[name] = (self.trace.metrics.get(name) or 0) + n

    def now(self) -> float:
        """Seconds since this rollout's clock started (its spans are on it)."""
        return time.monotonic() - self._t0


async def within(stage: str, aw: Awaitable[T], timeout: float) -> T:
    """Await one stage's `aw` for at most `timeout` seconds: StageTimeout when that deadline passes. Anything
    the stage raises itself propagates, a TimeoutError too (a socket's, say), with how long the stage took: it
    is the stage's own failure, not a timeout of ours."""
    start = time.monotonic()
    try:
        with watch_named(stage):
            async with asyncio.timeout(timeout) as deadline:
                return await aw
    except TimeoutError as exc:
        if deadline.expired():
            raise StageTimeout(f"{stage} timed out: the stage ran past {timeout:g} s") from None
        said = f"{exc} " if str(exc) else ""
        raise TimeoutError(f"{said}(raised by the stage itself after {time.monotonic() - start:.2f} s, "
                           f"within its {timeout:g} s limit)") from exc


async def score(task: Task, trace: Trace, timeout: float, turn: int | None = None) -> None:
    """Run every reward and metric of `task` on `trace` (in order); one that raises, runs past `timeout` or
    returns something other than a number is recorded as an error and scored None; one that raises
    NotApplicable is not recorded. A group scorer is recorded None here: its group scores it once the group's
    rollouts are all done (`envs.group_scoring`). Used at the end of a rollout and to re-score stored traces."""
    for scorer in task.scorers:
        if scorer.kind == "stop":
            continue
        if scorer.group:
            record_score(trace, scorer.kind, scorer.name, scorer.weight, None)
            continue
        stage = f"scoring:{scorer.name}"
        result: float | None = None
        try:
            result = scorer.number(await within(stage, task.call_scorer(scorer, trace), timeout))
        except NotApplicable:
            continue
        except Exception as exc:  # task code's failure (or timeout) is this scorer's error; the others still score
            trace.errors.append(classify(exc, stage, turn))
        record_score(trace, scorer.kind, scorer.name, scorer.weight, result)


def record_score(trace: Trace, kind: str, name: str, weight: float, value: float | None) -> None:
    """Record one reward's (or metric's) score on the trace; None: it failed or has not run."""
    if kind == "reward":
        trace.rewards[name] = RewardScore(score=value, weight=weight)
    else:
        trace.metrics[name] = value


def _append_response(trace: Trace, response: EnvResponse) -> bool:
    """Append the task's response to the graph; False when there was none (the rollout is done)."""
    if response is None:
        return False
    messages = [user(response)] if isinstance(response, str) else (
        [response] if isinstance(response, Message) else list(response))
    for message in messages:
        trace.graph.add(message)
    return bool(messages)


async def rollout(
    task: Task,
    model: ModelClient,
    sampling: Sampling | None = None,
    *,
    rollout_index: int = 0,
    timeouts: Timeouts | None = None,
    **trace_fields: Any,
) -> Trace:
    """Run one rollout of `task` against `model` and return its trace (never raises for task/model failures).
    With a sampling seed, rollout i uses seed + i: a group's rollouts differ, and each is reproducible."""
    sampling = sampling or Sampling()
    if sampling.seed is not None and rollout_index:
        sampling = sampling.model_copy(update={"seed": sampling.seed + rollout_index})
    trace = Trace(
        task=task.data,
        taskset=task.taskset_id,
        rollout_index=rollout_index,
        model=model.name,
        sampling=sampling.model_dump(mode="json"),
        **trace_fields,
    )
    return await Rollout(task, model, sampling, timeouts or Timeouts(), trace).run()

