"""TRL reward: a reward function written for TRL's `GRPOTrainer`, scored as a tracegym reward on one rollout.

TRL calls a reward function on a batch, every argument by keyword: `prompts`, `completions` (lists of chat
messages), `completion_ids`, `trainer_state`, `log_extra`, `log_metric`, `environments` (one instance per
completion) and every dataset column but `prompt` (each a list, one value per completion); it returns one
reward per completion, `None` where it does not apply. Here the batch is one rollout: `None` is NotApplicable
(the reward is left out of the total, as TRL leaves it out of its sum), `trainer_state` is None (no trainer runs
an eval), `log_metric(name, value)` and `log_extra(column, values)` record numbers as the trace's metrics.
"""

from __future__ import annotations

import functools
import inspect
import json
import numbers
from collections.abc import Callable
from typing import Any

from tracegym.core.errors import TaskError
from tracegym.core.messages import ImagePart, Message
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import _MARK, NotApplicable, Scorer, call_maybe_async

TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "environments", "trainer_state", "log_extra",
                 "log_metric")
"""The keyword arguments TRL gives every reward function besides the dataset's columns."""
COLUMNS_FIELD = "trl_columns"
"""The TaskData field listing a row's own keys (TRL passes those, and only those, to `reset` and rewards)."""


def is_trl_reward(fn: Callable[..., Any]) -> bool:
    """True for a reward written for TRL: it takes one of TRL's keyword arguments, or `**kwargs`."""
    params = inspect.signature(fn).parameters.values()
    return any(p.name in TRL_ARGUMENTS or p.kind == p.VAR_KEYWORD for p in params)


def trl_reward(fn: Callable[..., Any]) -> Callable[[Any, Trace], Any]:
    """Adapt a TRL reward function to tracegym's `(task, trace)` shape, its name, weight and order kept."""
    takes = _accepted(fn)

    @functools.wraps(fn)
    async def score(task: Any, trace: Trace) -> float:
        arguments = {
            "prompts": [[trl_message(m) for m in trace.prompt]],
            "completions": [[trl_message(m) for m in trace.completion]],
            "completion_ids": [completion_ids(trace)],
            "environments": [getattr(task, "env", None)],
            "trainer_state": None,
            "log_extra": functools.partial(_log_extra, trace),
            "log_metric": functools.partial(_log_metric, trace),
            **{k: [v] for k, v in dataset_row(task.data).items() if k != "prompt"},
        }
        values = await call_maybe_async(fn, **{k: v for k, v in arguments.items() if takes is None or k in takes})
        if not isinstance(values, list | tuple) or len(values) != 1:
            raise TaskError(f"TRL reward {fn.__name__!r} returned {values!r}; it must return a list with one reward "
                            "per completion (here one)")
        if values[0] is None:
            raise NotApplicable
        return values[0]

    marked: Scorer | None = getattr(fn, _MARK, None)
    if marked is not None:
        setattr(score, _MARK, Scorer(score, marked.kind, marked.name, marked.weight, marked.order))
    return score


def _accepted(fn: Callable[..., Any]) -> set[str] | None:
    """The keyword arguments `fn` takes; None when it takes any (`**kwargs`, as TRL's docs advise)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _log_metric(trace: Trace, name: str, value: float) -> None:
    trace.metrics[name] = float(value)


def _log_extra(trace: Trace, column: str, values: list[Any]) -> None:
    """A logged column is one value per completion; a number is kept as a metric (a trace's metrics are numbers,
    so text columns, meant for TRL's completions table, have no place on it)."""
    value = values[0] if values else None
    if isinstance(value, numbers.Real):
        trace.metrics[column] = float(value)


def dataset_row(data: TaskData) -> dict[str, Any]:
    """The row as TRL hands it to `reset` and to reward functions: only the keys the row had (when it says which,
    in `trl_columns`), prompt messages as chat dicts."""
    fields = data.fields()
    own = fields.pop(COLUMNS_FIELD, None)
    row = {k: fields[k] for k in own if k in fields} if own is not None else fields
    if "prompt" in row and isinstance(data.prompt, list):
        row["prompt"] = [trl_message(m) for m in data.prompt]
    return row


def trl_message(message: Message) -> dict[str, Any]:
    """A message as TRL's conversational data has it: tool calls with their arguments parsed, images as
    `{"type": "image", "image": url}` blocks, no empty optional keys."""
    out: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, list):
        out["content"] = [{"type": "image", "image": p.image_url.get("url", "")} if isinstance(p, ImagePart)
                          else {"type": "text", "text": p.text} for p in message.content]
    else:
        out["content"] = message.content if message.content is not None else ""
    if message.tool_calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                             for c in message.tool_calls]
    if message.role == "tool" and message.name is not None:
        out["name"] = message.name
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text or "{}")
    except json.JSONDecodeError:  # TRL parses arguments; ones that never parsed are kept as the model wrote them
        return text


def completion_ids(trace: Trace) -> list[int]:
    """The tokens after the prompt on the trace's branch (sampled and tool-result tokens, as TRL's
    `completion_ids`); empty when the model client returned no tokens."""
    out: list[int] = []
    tokenized = [node for node in trace.graph.path() if node.token_ids]
    for position, node in enumerate(tokenized):
        ids, mask = node.token_ids or [], node.mask or []
        # the first tokenized node opens with the whole prompt (mask 0) before its sampled tokens
        start = (mask.index(1) if 1 in mask else len(ids)) if position == 0 else 0
        out.extend(ids[start:])
    return out
