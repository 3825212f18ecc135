"""verifiers harness: drives one rollout by a verifiers environment's own `rollout()` (its turn loop, environment
responses, tools and stop conditions), its model calls going through the interception proxy to the rollout's model
client, so each lands in the trace's message graph with exact tokens as a loop's turn does.

The environment runs in the rollout's process (an env-server worker, or the eval process with `--no-serve`), as a
taskset's own Python does; verifiers' OpenAI chat client calls the proxy at the rollout's key. Sampling is the
rollout's (the proxy's rule: a call may lower `max_tokens` and add stop strings). How the rollout ended is read
off verifiers' state: a failed model call ends it as the proxy recorded it; an error verifiers caught, its own
timeout, a prompt over the context, the turn budget and its stop conditions become the trace's stop reason.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracegym.core.errors import InfrastructureError, ModelError, StageTimeout, TaskError, ToolError
from tracegym.core.messages import Message
from tracegym.core.trace import StopReason
from tracegym.envs.proxy import InterceptionProxy, ProxyLease

if TYPE_CHECKING:
    from tracegym.envs.rollout import Rollout

NORMAL_ENDS = {"no_tools_called": StopReason.COMPLETED, "has_final_env_response": StopReason.COMPLETED,
               "has_error": StopReason.COMPLETED,  # reached only for the model's own unusable reply (`_models_own`)
               "max_turns_reached": StopReason.MAX_TURNS, "prompt_too_long": StopReason.TRUNCATED,
               "max_total_completion_tokens_reached": StopReason.TRUNCATED}
"""verifiers' built-in stop conditions and the stop reason each is; any other is a stop condition by its name."""


_OPENAI: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
INVALID_REPLIES = "invalid_replies"
"""Rollouts verifiers ended on a reply it could not use (`EmptyModelResponseError`, ...): the model's own output, so
the rollout ends completed and is scored (and trained), counted in this metric."""


@dataclass(frozen=True)
class VerifiersHarness:
    """Run `environment.rollout(...)` for each rollout of a verifiers taskset (stage `program`, within the
    rollout's timeout); its state goes to `task.state` for the rubric."""

    environment: Any

    async def drive(self, rollout: Rollout) -> StopReason:
        task: Any = rollout.task
        async with InterceptionProxy.shared().lease(rollout) as lease:
            try:
                task.state = await rollout.timed("program", self._run(rollout, lease), rollout.timeouts.rollout)
            except Exception as exc:  # the environment's own failure (model calls record theirs)
                rollout.error_from(exc, "program")
                return lease.ended.result() if lease.ended.done() else StopReason.after(exc)
            calls, truncated = lease.calls, lease.truncated
            if lease.ended.done():  # a model call's failure ended the rollout (recorded at its stage)
                return lease.ended.result()
        _add_final_response(rollout, task.state)
        return _ending(rollout, task.state, calls, truncated, self.environment)

    async def _run(self, rollout: Rollout, lease: ProxyLease) -> Any:
        """verifiers' state after its rollout; cut short when a model call's failure ended the rollout."""
        from verifiers.legacy.clients.openai_chat_completions_client import OpenAIChatCompletionsClient

        # the key as the API key (a header), not in the URL, which HTTP logs print
        openai = _shared_openai().with_options(base_url=lease.base_url.replace(f"/r/{lease.key}/", "/"),
                                               api_key=lease.key, timeout=rollout.timeouts.model + 5.0)
        client = OpenAIChatCompletionsClient(openai)
        task: Any = rollout.task
        row = task.data.row
        sampling = dict(getattr(self.environment, "sampling_args", None) or {})
        run = asyncio.create_task(self.environment.rollout(dict(row), client, rollout.model.name, sampling))
        try:
            await asyncio.wait({run, lease.ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not run.done():
                run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        return None if run.cancelled() else run.result()


def _add_final_response(rollout: Rollout, state: Any) -> None:
    """The environment's last word (`final_env_response`, which no model call sent) on the trace, after the last
    reply, so the graph holds the whole conversation the rubric scored."""
    from verifiers.legacy.utils.message_utils import maybe_normalize_messages

    final = state.get("final_env_response")
    if not final:
        return
    for message in maybe_normalize_messages(final, field_name="final_env_response"):
        data = message.model_dump() if hasattr(message, "model_dump") else dict(message)
        rollout.trace.graph.add(Message(role=data["role"], content=data.get("content"),
                                        tool_call_id=data.get("tool_call_id")))


def _shared_openai() -> Any:
    """This event loop's OpenAI client, whose HTTP connections every rollout's copy shares (`with_options`): a new
    client per rollout builds an SSL context, ~0.2 s of the loop's time each on a loaded machine."""
    from openai import AsyncOpenAI

    loop = asyncio.get_running_loop()
    client = _OPENAI.get(loop)
    if client is None:
        client = _OPENAI[loop] = AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="unset", max_retries=0)
    return client


def _ending(rollout: Rollout, state: Any, calls: int, truncated: bool, environment: Any) -> StopReason:
    """The stop reason verifiers' state says; an error it caught, or a timeout, recorded at `program`."""
    error = state.get("error")
    if error is not None and not _models_own(error):
        failure, stage = _translated(error)
        rollout.error_from(failure, stage)
        return StopReason.ERROR
    if error is not None:  # an empty or unreadable reply: the model's own output, scored as the rubric says
        rollout.count(INVALID_REPLIES, 1)
    if state.get("timed_out"):
        seconds = getattr(environment, "timeout_seconds", None)
        rollout.error_from(StageTimeout(f"the verifiers environment's rollout ran past its timeout_seconds "
                                        f"({seconds} s)"), "program")
        return StopReason.TIMEOUT
    if calls == 0:
        rollout.error_from(TaskError("the verifiers environment never called the model"), "program")
        return StopReason.ERROR
    condition = state.get("stop_condition")
    if condition == "max_turns_reached" and getattr(environment, "max_turns", None) == 1:
        return StopReason.TRUNCATED if truncated else StopReason.COMPLETED  # a single-turn environment's end
    if truncated or state.get("is_truncated"):
        return StopReason.TRUNCATED
    if condition in NORMAL_ENDS or condition is None:
        return NORMAL_ENDS.get(condition, StopReason.COMPLETED)
    rollout.end(StopReason.STOP_CONDITION, condition)
    return StopReason.STOP_CONDITION


def _models_own(error: BaseException) -> bool:
    """Whether verifiers ended the rollout on the model's own reply (empty, or not a response it can read)."""
    import verifiers as vf

    return isinstance(error, vf.InvalidModelResponseError)


def _translated(error: BaseException) -> tuple[Exception, str]:
    """An error verifiers caught (its `vf.Error` tree) as tracegym's, with the stage it happened at."""
    import verifiers as vf

    cause = error.__cause__ or error
    said = f"the verifiers environment failed: {type(error).__name__}: {cause}"
    if isinstance(error, vf.ModelError):
        return ModelError(said), "model"
    if isinstance(error, vf.ToolError):
        return ToolError(said), "tool"
    if isinstance(error, vf.InfraError):
        return InfrastructureError(said), "program"
    return TaskError(said), "program"
