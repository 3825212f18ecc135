"""TRL: any tracegym taskset as what TRL's `GRPOTrainer` takes: `environment_factory`, `reward_funcs`, `train_dataset`.

    from tracegym.interop.trl import environment_factory, reward_functions, reward_weights, train_dataset

    tasksets = [load_taskset("tool-calculator"), load_taskset("reverse-text")]
    trainer = GRPOTrainer(model, args=GRPOConfig(reward_weights=reward_weights(*tasksets), ...),
                          train_dataset=train_dataset(*tasksets, num_tasks=64),
                          environment_factory=environment_factory(*tasksets), reward_funcs=reward_functions(*tasksets))

A dataset row holds the task (its TaskData as JSON, in the `tracegym_task` column) and its prompt as chat
messages. The environment class's `reset(**row)` builds the row's Task and sets it up (returning what the task's
setup adds to the prompt, which TRL appends), and its public methods are the task's tools (with the hints and
docstrings of the task's own functions, so `get_json_schema` describes them). The reward functions score the
rollout TRL generated with the task's own rewards, read from the environment instances: one tracegym scoring
per rollout, shared by all of a taskset's reward functions, and its metrics logged through `log_metric`.
With several tasksets the factory is TRL's dict keyed by taskset id, rows carry that id in `environment`, and a
reward function returns None (TRL's "not applicable") on rows of another taskset.

The classes and reward functions pickle (TRL's `AsyncGRPOTrainer` sends them to a spawned process): each pickles as
its taskset's id and config, and is rebuilt there from `load_taskset` (one taskset per id and config in a process,
shared by the class and the reward functions). A taskset built in code that its id does not load cannot cross, and
pickling says so. A multi-agent taskset is refused, naming its seats: TRL generates one policy's turns and answers
tool calls only, so its other seats would never play.

TRL's loop answers tool calls only: a task's `env_response` (a multi-turn taskset's later turns) and its stop
conditions do not run under TRL, and its rewards score what TRL generated (the first turn, for those tasksets).
"""

from __future__ import annotations

import asyncio
import contextlib
import copyreg
import inspect
import itertools
import json
import pickle
import statistics
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, ClassVar, TypeVar

from tracegym.core.errors import UsageError
from tracegym.core.messages import ContentPart, ImagePart, Message, TextPart, ToolCall
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason, Trace
from tracegym.envs.adapter_fit import check_adapter_fit
from tracegym.envs.environment import ENVIRONMENT_COLUMN, EnvironmentTask
from tracegym.envs.evaluate import bounded_taskset, seats_of
from tracegym.envs.registry import load_taskset
from tracegym.envs.rollout import Timeouts, score, within
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset
from tracegym.envs.tools import Tool, content_parts

TASK_COLUMN = "tracegym_task"
"""The dataset column holding each row's task (its TaskData as JSON)."""
T = TypeVar("T")


def train_dataset(*tasksets: Taskset, num_tasks: int | None = None) -> Any:
    """A `datasets.Dataset` of the tasksets' rows (the first `num_tasks` of each; an infinite taskset needs it),
    interleaved one taskset after another: `prompt` messages, the task, and with several tasksets `environment`."""
    from datasets import Dataset  # TRL's dependency: imported only by those who train with TRL

    _check(tasksets)
    per_taskset = [[(ts, data) for data in bounded_taskset(ts, num_tasks)] for ts in tasksets]
    rows = [_row(ts, data, len(tasksets) > 1)
            for ts, data in itertools.chain.from_iterable(itertools.zip_longest(*per_taskset, fillvalue=(None, None)))
            if ts is not None and data is not None]
    return Dataset.from_list(rows)


def _row(taskset: Taskset, data: TaskData, routed: bool) -> dict[str, Any]:
    # the prompt's text only: every row's `prompt` must have one Arrow type, and TRL renders text
    row = {"prompt": [{"role": m.role, "content": m.text} for m in data.initial_messages()],
           TASK_COLUMN: data.model_dump_json()}
    return {**row, ENVIRONMENT_COLUMN: taskset.id} if routed else row


def environment_factory(*tasksets: Taskset, timeouts: Timeouts | None = None) -> type | dict[str, type]:
    """The environment class of a taskset (its rows' tasks, their tools as methods), or with several tasksets
    TRL's dict of them by taskset id."""
    _check(tasksets)
    classes = {ts.id: environment_class(ts, timeouts) for ts in tasksets}
    return classes if len(tasksets) > 1 else classes[tasksets[0].id]


def reward_functions(*tasksets: Taskset) -> list[Callable[..., list[float | None]]]:
    """One TRL reward function per reward of each taskset (named after it, prefixed by the taskset id when
    there are several), in the order of `reward_weights`."""
    _check(tasksets)
    prefix = len(tasksets) > 1
    return [RewardFunction(ts, scorer.name, f"{ts.id}/{scorer.name}" if prefix else scorer.name, first=i == 0)
            for ts in tasksets for i, scorer in enumerate(_probe(ts).scorers_of_kind("reward"))]


def reward_weights(*tasksets: Taskset) -> list[float]:
    """Each reward's weight, for `GRPOConfig(reward_weights=...)`."""
    _check(tasksets)
    return [scorer.weight for ts in tasksets for scorer in _probe(ts).scorers_of_kind("reward")]


def _check(tasksets: tuple[Taskset, ...]) -> None:
    if not tasksets:
        raise UsageError("give at least one taskset")
    ids = [ts.id for ts in tasksets]
    if len(set(ids)) != len(ids):
        raise UsageError(f"tasksets in one TRL run need distinct ids (they key TRL's environments); got {ids}")
    for taskset in tasksets:
        seats = [m.id for m in seats_of(taskset)]
        if seats:
            raise UsageError(f"taskset {taskset.id!r} is multi-agent (seats {', '.join(map(repr, seats))}): TRL's "
                             "environment_factory trains one policy on its own turns and tool calls, so the other "
                             "seats would never play; train it with `tracegym rl`, which binds each seat")
        check_adapter_fit(taskset, "TRL's environment_factory")


def _probe(taskset: Taskset) -> Task[Any, Any]:
    """A Task of the taskset's first row, never set up: its tools and rewards stand for every row's."""
    return taskset.task(taskset[0])


# --- the environment class -----------------------------------------------------------------------------------


class _EnvironmentType(type):
    """The type of generated environment classes: pickled as their taskset's recipe (see `_reduce_class`)."""


class TasksetEnvironment(metaclass=_EnvironmentType):
    """What every generated environment class shares: one Task per rollout, built and set up by `reset`."""

    _taskset: ClassVar[Taskset]
    _timeouts: ClassVar[Timeouts]

    def __init__(self) -> None:
        self._task: Task[Any, Any] | None = None
        self._trace: Trace | None = None
        self._cleaned = True

    def reset(self, **row: Any) -> str | list[dict[str, Any]] | None:
        """Start the row's task; what its setup adds to the prompt (TRL appends it to the last message)."""
        self._cleanup()
        if TASK_COLUMN not in row:
            raise UsageError(f"a row without {TASK_COLUMN!r}: make the dataset with train_dataset() of "
                             "tracegym.interop.trl")
        data = self._taskset.as_data(json.loads(row[TASK_COLUMN]))
        task = self._taskset.task(data)
        self._task, self._trace, self._cleaned = task, None, False
        _run(within("setup", task.setup(), self._timeouts.setup))
        return observation(data.initial_messages(), task.prompt())

    def _call(self, name: str, arguments: dict[str, Any]) -> str | list[dict[str, Any]]:
        """Run one of the task's tools; what it raises, TRL reports to the model as the tool's error."""
        assert self._task is not None, "reset first"
        tool = self._task.tool(name)
        if tool is None:
            raise ValueError(f"tool {name!r} not found")
        content = _run(within(f"tool:{name}", tool.call(arguments), self._timeouts.tool))
        return content if isinstance(content, str) else trl_content(content)

    def _scored(self, prompt: list[dict[str, Any]], completion: list[dict[str, Any]], ids: list[int]) -> Trace:
        """The rollout TRL generated, scored by the task's rewards and metrics (once; the result is kept)."""
        assert self._task is not None, "reset first"
        if self._trace is None:
            trace = rollout_trace(self._task, prompt, completion, ids)
            _run(score(self._task, trace, self._timeouts.scoring))
            self._trace = trace
            self._cleanup()
        return self._trace

    def _cleanup(self) -> None:
        if self._task is not None and not self._cleaned:
            self._cleaned = True
            _run(within("cleanup", self._task.cleanup(), self._timeouts.setup))


def environment_class(taskset: Taskset, timeouts: Timeouts | None = None) -> type:
    """A TasksetEnvironment subclass for `taskset`, with one method per tool of its tasks (picklable: rebuilt from
    the taskset's id and config where it is unpickled)."""
    methods = {tool.name: _method(tool) for tool in _tools(_probe(taskset))}
    clashes = sorted(set(methods) & {"reset", "get_reward"})
    if clashes:
        raise UsageError(f"taskset {taskset.id!r}: a tool named {clashes[0]!r} would be one of TRL's reserved methods")
    name = "".join(part.capitalize() for part in taskset.id.replace("_", "-").split("-") if part.isidentifier())
    attributes = {"_taskset": taskset, "_timeouts": timeouts or Timeouts(), "__doc__": taskset.description, **methods}
    return type(f"{name or 'Taskset'}Environment", (TasksetEnvironment,), attributes)


def _tools(task: Task[Any, Any]) -> list[Tool]:
    """The Tools behind the task's specs (an environment task's are its class's, known before setup)."""
    own = {t.name: t for t in task.kind.tools.values()} if isinstance(task, EnvironmentTask) and task.kind else {}
    return [task.tool(spec.name) or own[spec.name] for spec in task.tool_specs()]


def _method(tool: Tool) -> Callable[..., Any]:
    """A method calling the tool, with the tool function's parameters, hints and docstring, so that transformers'
    `get_json_schema` (what TRL offers the model) describes the function itself."""
    signature = inspect.signature(tool.fn)
    params = list(signature.parameters.values())
    if params and params[0].name in ("self", "cls") and params[0].annotation is inspect.Parameter.empty:
        params = params[1:]  # a method's receiver, as get_json_schema skips it

    def method(self: TasksetEnvironment, **arguments: Any) -> Any:
        return self._call(tool.name, arguments)

    method.__name__ = method.__qualname__ = tool.name
    method.__doc__ = tool.fn.__doc__
    method.__annotations__ = dict(getattr(tool.fn, "__annotations__", {}))
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    # attributes a function's type does not declare; `__wrapped__`: string hints resolve in the tool's own module
    vars(method).update(__wrapped__=tool.fn, __signature__=signature.replace(parameters=[self_param, *params]))
    return method


def observation(before: list[Message], after: list[Message]) -> str | list[dict[str, Any]] | None:
    """What setup added to the prompt, as TRL's `reset` returns it: None, text appended to the last message, or
    content blocks; a UsageError for a prompt TRL cannot express that way."""
    if after == before:
        return None
    if len(after) == len(before) and after[:-1] == before[:-1]:
        old, new = before[-1].content, after[-1].content
        if isinstance(old, str) and isinstance(new, str) and new.startswith(old):
            return new[len(old):]
        if isinstance(old, str) and isinstance(new, list) and new[:1] == [TextPart(text=old)]:
            return trl_content(new[1:])
    raise UsageError("this task's setup changes its prompt beyond appending to the last message, which TRL's "
                     "reset cannot express")


def _reduce_class(cls: _EnvironmentType) -> Any:
    if cls.__dict__.get("_taskset") is None:  # TasksetEnvironment itself: by reference, as any class
        return cls.__qualname__
    taskset = cls.__dict__["_taskset"]
    return _rebuilt_class, (*recipe(taskset), cls.__dict__["_timeouts"].model_dump())


copyreg.pickle(_EnvironmentType, _reduce_class)


def _rebuilt_class(taskset_id: str, config: dict[str, Any], timeouts: dict[str, Any]) -> type:
    """The class of that recipe, made once per process (every unpickling of it gives the same class)."""
    key = (taskset_id, json.dumps(config, sort_keys=True), json.dumps(timeouts, sort_keys=True))
    taskset = rebuilt(taskset_id, config)
    with _rebuilt_lock:
        if key not in _rebuilt_classes:
            _rebuilt_classes[key] = environment_class(taskset, Timeouts(**timeouts))
        return _rebuilt_classes[key]


_rebuilt: dict[tuple[str, str], Taskset] = {}
_rebuilt_classes: dict[tuple[str, str, str], type] = {}
_rebuilt_lock = threading.Lock()


def recipe(taskset: Taskset) -> tuple[str, dict[str, Any]]:
    """What a taskset pickles as: its id and config, checked to load back (a PicklingError naming it otherwise)."""
    config = taskset.config.model_dump(mode="json")
    try:
        loaded = rebuilt(taskset.id, config)
    except UsageError as exc:
        raise pickle.PicklingError(f"taskset {taskset.id!r} cannot be rebuilt from its id in another process (TRL's "
                                   f"AsyncGRPOTrainer spawns one): {exc}; give it an id load_taskset finds (a "
                                   "registered id or `path/file.py:name`)") from None
    if type(loaded) is not type(taskset):
        raise pickle.PicklingError(f"taskset {taskset.id!r}: its id loads a {type(loaded).__name__}, not this "
                                   f"{type(taskset).__name__}, so it cannot be rebuilt in another process")
    return taskset.id, config


def rebuilt(taskset_id: str, config: dict[str, Any]) -> Taskset:
    """The taskset of that id and config, loaded once per process (unpickled classes and reward functions share
    it)."""
    key = (taskset_id, json.dumps(config, sort_keys=True))
    with _rebuilt_lock:
        if key not in _rebuilt:
            _rebuilt[key] = load_taskset(taskset_id, config)
        return _rebuilt[key]


# --- scoring what TRL generated ------------------------------------------------------------------------------


def rollout_trace(task: Task[Any, Any], prompt: list[dict[str, Any]], completion: list[dict[str, Any]],
                  ids: list[int]) -> Trace:
    """A trace of the rollout as TRL ran it: its prompt, then its completion messages, the completion's token ids
    on the first model turn (TRL gives them for the whole completion). As the rollout loop records them, each tool
    call has an id of its own in the trace (`call_<n>`, counted over the rollout) and each tool answer names its
    call's id (TRL's tool messages, in call order, name the tool only). The loop's own metrics (`tool_calls`,
    `tool_errors`) are not counted: TRL's own tool loop ran the rollout."""
    trace = Trace(task=task.data, taskset=task.taskset_id, stop_reason=StopReason.COMPLETED)
    for message in prompt:
        trace.graph.add(from_trl(message))
    trace.prompt_length = len(prompt)
    tokens: dict[str, Any] = {"token_ids": list(ids), "mask": [1] * len(ids)} if ids else {}
    made, unanswered = 0, list[ToolCall]()
    for message in completion:
        sampled = message.get("role") == "assistant"
        added = from_trl(message)
        if sampled:
            calls = [c.model_copy(update={"id": f"call_{made + i}"}) for i, c in enumerate(added.tool_calls)]
            if calls:
                added = added.model_copy(update={"tool_calls": calls})
            made, unanswered = made + len(calls), list(calls)
        elif added.role == "tool" and unanswered:
            added = added.model_copy(update={"tool_call_id": unanswered.pop(0).id})
        trace.graph.add(added, sampled=sampled, **(tokens if sampled else {}))
        tokens = tokens if not sampled else {}
    return trace


def from_trl(message: dict[str, Any]) -> Message:
    """A message of TRL's conversational data (tool-call arguments parsed, image blocks) as a Message."""
    content = message.get("content")
    calls = [ToolCall(id=f"call_{i}", name=c["function"]["name"], arguments=_arguments_text(c["function"]))
             for i, c in enumerate(message.get("tool_calls") or [])]
    return Message(role=message["role"], content=content_parts(content) if isinstance(content, list) else content,
                   tool_calls=calls, name=message.get("name"))


def _arguments_text(function: dict[str, Any]) -> str:
    arguments = function.get("arguments", {})
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def trl_content(parts: list[ContentPart]) -> list[dict[str, Any]]:
    """Content parts as TRL's content blocks (an image as its URL)."""
    return [{"type": "image", "image": p.image_url.get("url", "")} if isinstance(p, ImagePart)
            else {"type": "text", "text": p.text} for p in parts]


class RewardFunction:
    """TRL's reward function for one reward of one taskset (named `__name__`, as TRL names its columns); the first
    of a taskset also logs its metrics. Pickles as its taskset's recipe; it scores the environments of its
    taskset's id (None, TRL's "not applicable", for others)."""

    def __init__(self, taskset: Taskset, reward: str, name: str, first: bool) -> None:
        self.taskset, self.reward, self.first = taskset, reward, first
        self.__name__ = self.__qualname__ = name
        self._class: type | None = None

    def __call__(self, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
                 environments: list[Any] | None = None, log_metric: Callable[[str, float], None] | None = None,
                 **columns: Any) -> list[float | None]:
        taskset_id = self.taskset.id
        if environments is None:  # TRL's AsyncGRPOTrainer gives none: replay each rollout on a fresh instance
            environments = self._replayed(completions, columns)
        traces = [env._scored(p, c, ids) if _taskset_id(env) == taskset_id else None
                  for env, p, c, ids in zip(environments, prompts, completions, completion_ids, strict=True)]
        if self.first and log_metric is not None:
            _log_metrics([t for t in traces if t is not None], log_metric, f"{taskset_id}/")
        return [None if t is None or self.reward not in t.rewards else t.rewards[self.reward].score for t in traces]

    def _replayed(self, completions: list[Any], columns: dict[str, list[Any]]) -> list[Any]:
        """For each rollout of this taskset's rows (by the `tracegym_task` and `environment` columns), an instance
        reset on its row with the completion's tool calls made again in order (what the model read of them is in the
        completion already), so its task holds the state the rollout left; None for other rows."""
        if TASK_COLUMN not in columns:
            raise UsageError(f"the reward function {self.__name__!r} got neither environments nor the "
                             f"{TASK_COLUMN!r} column: make the dataset with train_dataset() of tracegym.interop.trl")
        routes = columns.get(ENVIRONMENT_COLUMN) or [self.taskset.id] * len(completions)
        if self._class is None:
            self._class = environment_class(self.taskset)
        return [_replay(self._class(), task, completion) if route == self.taskset.id else None
                for task, route, completion in zip(columns[TASK_COLUMN], routes, completions, strict=True)]

    def __reduce__(self) -> Any:
        return _rebuilt_reward_function, (*recipe(self.taskset), self.reward, self.__name__, self.first)


def _rebuilt_reward_function(taskset_id: str, config: dict[str, Any], reward: str, name: str,
                             first: bool) -> RewardFunction:
    return RewardFunction(rebuilt(taskset_id, config), reward, name, first)


def _replay(environment: Any, task: str, completion: list[dict[str, Any]]) -> Any:
    environment.reset(**{TASK_COLUMN: task})
    for message in completion:
        for call in message.get("tool_calls") or []:
            arguments = call["function"].get("arguments") or {}
            with contextlib.suppress(Exception):  # a call that failed then fails again: the model read its error
                environment._call(call["function"]["name"],
                                  json.loads(arguments) if isinstance(arguments, str) else arguments)
    return environment


def _taskset_id(environment: Any) -> str | None:
    taskset = getattr(type(environment), "_taskset", None)
    return taskset.id if isinstance(taskset, Taskset) else None


def _log_metrics(traces: list[Trace], log_metric: Callable[[str, float], None], prefix: str) -> None:
    """Each metric's mean over the batch's rollouts that have it (none: not logged, so never a NaN)."""
    names = dict.fromkeys(name for trace in traces for name in trace.metrics)
    for name in names:
        values = [v for trace in traces if (v := trace.metrics.get(name)) is not None]
        if values:
            log_metric(prefix + name, statistics.fmean(values))


# --- one event loop for the tasks' async code ---------------------------------------------------------------

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the module's event loop (one daemon thread, started on first use) from TRL's sync
    calls: a task's setup, tools, scorers and cleanup all run on that one loop, whatever thread calls."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="tracegym-trl", daemon=True).start()
    future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, _loop)
    return future.result()
