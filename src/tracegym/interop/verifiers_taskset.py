"""verifiers taskset: a verifiers environment module (its `load_environment()`, as the Environments Hub publishes
them as pip packages) run unmodified as a tracegym taskset.

`tracegym eval verifiers:MODULE -n 20` (MODULE an installed module, `reverse-text` or `reverse_text` alike, or a
`path/to/env.py`): the module's `load_environment(**env_args)` builds the environment once per process (the eval
process, each env-server worker); its dataset's rows are the tasks (`split`: the eval dataset, which verifiers
falls back to the train one without it, or the train one); each rollout is the environment's own `rollout()`
(single-turn, multi-turn, tool environments alike), driven by `VerifiersHarness`, its model calls going through
the rollout's model client (exact tokens and logprobs) by way of the interception proxy; its rubric's functions
are the task's rewards (weight != 0, that weight) and metrics (weight 0), called with the arguments verifiers
gives them. Unlike verifiers, a reward function that raises scores None with an error on the trace, never 0.

Built on the `verifiers` package (the optional extra `tracegym[verifiers]`, verifiers 0.3: the last release with
the `load_environment()` stack; 0.4 ships only its v1 taskset plugins). What tracegym cannot run is refused by
name at load: a rubric with group reward functions (they score a whole group at once), a rubric class with its own
`score_rollout` (an `EnvGroup`'s), an environment that is not a `verifiers.Environment`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from tracegym.core.errors import TaskError, UsageError
from tracegym.core.messages import Message
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.registry import import_file
from tracegym.envs.scorers import Scorer, call_maybe_async
from tracegym.envs.task import Task
from tracegym.envs.taskset import Row, Taskset, TasksetConfig
from tracegym.interop.verifiers_harness import VerifiersHarness

SCHEME = "verifiers"
"""Taskset ids `verifiers:MODULE` name a verifiers environment module (see `envs.registry`)."""


class VerifiersConfig(TasksetConfig):
    """Options of a verifiers taskset."""

    module: str = ""
    """The environment: an installed module (`reverse-text` imports `reverse_text`) or a `path/to/env.py` file;
    the id `verifiers:MODULE` sets it."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the module's `load_environment(...)`."""
    split: Literal["eval", "train"] = "eval"
    """The dataset the tasks come from: the environment's eval dataset (verifiers falls back to its train dataset
    when it has none) or its train dataset (what `tracegym rl` should name)."""


class VerifiersData(TaskData):
    """One task: a row of the environment's dataset, as verifiers' `rollout()` takes it."""

    row: dict[str, Any] = Field(default_factory=dict)
    """The dataset row (prompt, answer, info, example_id, task and any other columns)."""


class VerifiersTask(Task[VerifiersData, VerifiersConfig]):
    """One rollout of the environment on one row; `state` is verifiers' state once the rollout ran, which the
    rubric's functions read."""

    max_turns = 1_000_000  # the environment bounds its own turns (`max_turns` of a MultiTurnEnv)

    def __init__(self, data: VerifiersData, *, environment: Any, **options: Any) -> None:
        super().__init__(data, **options)
        self.environment = environment
        self.harness = VerifiersHarness(environment)
        self.state: Any = None
        """verifiers' State of this rollout (set by the harness)."""

    async def cleanup(self) -> None:
        """The rubric's cleanup handlers (verifiers runs them after scoring), then the base's."""
        try:
            if self.state is not None:
                await self.environment.rubric.cleanup(self.state)
        finally:
            await super().cleanup()


class VerifiersTaskset(Taskset[VerifiersConfig]):
    """The tasks of one verifiers environment."""

    task_class = VerifiersTask

    def __init__(self, config: VerifiersConfig | Mapping[str, Any] | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        cfg = self.config
        if not cfg.module:
            raise UsageError("taskset verifiers: name the environment module, e.g. 'verifiers:reverse-text' or "
                             "'verifiers:path/to/env.py' (or set module = ...)")
        self.id = self.id or f"{SCHEME}:{cfg.module}"
        self.environment = load_environment(cfg.module, cfg.env_args)
        self._scorers = [*self._scorers, *rubric_scorers(self.environment.rubric, cfg.module)]
        self.description = self.description or f"verifiers environment {cfg.module} " \
                                               f"({type(self.environment).__name__})"

    def load(self) -> Iterable[Row]:
        env = self.environment
        dataset = env.get_eval_dataset() if self.config.split == "eval" else env.get_dataset()
        for position, row in enumerate(dataset):
            yield task_row(dict(row), position)

    def _task_options(self) -> dict[str, Any]:
        return {**super()._task_options(), "environment": self.environment}


def for_module(module: str) -> Callable[..., VerifiersTaskset]:
    """The factory the id `verifiers:MODULE` names: options from the command, `module` set to MODULE."""

    def build(config: VerifiersConfig | Mapping[str, Any] | None = None) -> VerifiersTaskset:
        options = config.model_dump() if isinstance(config, TasksetConfig) else dict(config or {})
        if options.get("module") not in (None, "", module):
            raise UsageError(f"taskset 'verifiers:{module}': module = {options['module']!r} names another module")
        return VerifiersTaskset({**options, "module": module})

    return build


# --- loading the module ------------------------------------------------------------------------------------
def load_environment(module: str, env_args: Mapping[str, Any]) -> Any:
    """The environment `module`'s `load_environment(**env_args)` builds; a UsageError naming the module (and its
    file) when verifiers is missing, the module fails to import, has no `load_environment`, the call fails, or it
    returns no verifiers Environment."""
    environment_class = _verifiers_environment_class()
    loaded = _import(module)
    where = _where(module, loaded)
    make = getattr(loaded, "load_environment", None)
    if not callable(make):
        raise UsageError(f"verifiers environment {where} has no load_environment() function")
    try:
        environment = make(**env_args)
    except Exception as exc:  # the environment's own code failed: one line naming it, not our traceback
        raise UsageError(f"verifiers environment {where}: load_environment("
                         f"{', '.join(f'{k}={v!r}' for k, v in env_args.items())}) failed: "
                         f"{type(exc).__name__}: {_first_line(exc)}") from None
    if not isinstance(environment, environment_class):
        raise UsageError(f"verifiers environment {where}: load_environment() returned "
                         f"{type(environment).__name__} {_short(environment)}, not a verifiers Environment")
    return environment


def _verifiers_environment_class() -> type:
    try:
        import verifiers as vf
    except ImportError as exc:
        raise UsageError(f"verifiers tasksets need the verifiers package: pip install 'tracegym[verifiers]' "
                         f"({exc})") from None
    environment: type = vf.Environment
    return environment


def _import(module: str) -> Any:
    """The module: a `.py` file (its folder first on sys.path, as `python file.py` has it), else an installed
    module, its name's dashes read as underscores (a Hub id `owner/name@version` as `name`, as verifiers reads it)."""
    if module.endswith(".py"):
        return _import_file(Path(module))
    name = module.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise UsageError(f"verifiers environment {module!r}: no module named {name!r} is installed (install "
                             f"the environment's package, or name its file: verifiers:path/to/env.py)") from None
        raise _failed_import(repr(name), exc) from None
    except Exception as exc:  # the module's own code failed
        raise _failed_import(repr(name), exc) from None


def _import_file(path: Path) -> Any:
    try:
        return import_file(path, "tracegym_verifiers")
    except FileNotFoundError:
        raise UsageError(f"verifiers environment file {str(path)!r} does not exist") from None
    except BaseException as exc:  # SystemExit too: a module that exits on import is refused, not obeyed
        raise _failed_import(f"file {str(path)!r}", exc) from None


def _failed_import(what: str, exc: BaseException) -> UsageError:
    if isinstance(exc, SyntaxError):
        return UsageError(f"verifiers environment {what} failed to import: syntax error at line {exc.lineno}: "
                          f"{exc.msg}")
    return UsageError(f"verifiers environment {what} failed to import: {type(exc).__name__}: {_first_line(exc)}")


def _where(module: str, loaded: Any) -> str:
    file = getattr(loaded, "__file__", None)
    return repr(module) if file is None or module.endswith(".py") else f"{module!r} ({file})"


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


# --- rows --------------------------------------------------------------------------------------------------
def task_row(row: dict[str, Any], position: int) -> VerifiersData:
    """A dataset row as a task: its prompt as tracegym messages (what the trace shows), its key the row's
    `example_id` (else its position), the whole row JSON-safe for the environment's rollout."""
    row = json.loads(json.dumps(row, default=str))
    row.setdefault("example_id", position)
    prompt = row.get("prompt")
    if not isinstance(prompt, list | str):
        raise UsageError(f"verifiers dataset row {position}: its 'prompt' is a {type(prompt).__name__}, not "
                         "messages or text")
    messages = prompt if isinstance(prompt, str) else [_message(m) for m in prompt]
    answer = row.get("answer")
    return VerifiersData(prompt=messages, answer=answer, id=str(row["example_id"]), row=row)


def _message(data: Any) -> Message:
    if not isinstance(data, dict):
        raise UsageError(f"verifiers dataset row: a prompt message is a {type(data).__name__}, not an object")
    return Message.from_openai({k: v for k, v in data.items() if v is not None})


# --- the rubric --------------------------------------------------------------------------------------------
def rubric_scorers(rubric: Any, module: str) -> list[Scorer]:
    """One tracegym scorer per function of the rubric (a RubricGroup's rubrics in order): a reward with its
    weight, or a metric for weight 0; a name two rubrics share gets `_2`, `_3`... Refuses what it cannot run."""
    scorers: list[Scorer] = []
    names: set[str] = set()
    for owner, func, weight in _functions(rubric, module):
        name = base = getattr(func, "__name__", type(func).__name__)
        suffix = 2
        while name in names:
            name, suffix = f"{base}_{suffix}", suffix + 1
        names.add(name)
        scoring = _scoring(owner, func)
        scorers.append(Scorer(scoring, "metric", name) if weight == 0 else
                       Scorer(scoring, "reward", name, weight=float(weight)))
    return scorers


def _functions(rubric: Any, module: str) -> Iterable[tuple[Any, Callable[..., Any], float]]:
    import verifiers as vf

    members = getattr(rubric, "rubrics", None)
    if isinstance(rubric, vf.RubricGroup) and members is not None:
        for member in members:
            yield from _functions(member, module)
        return
    if type(rubric).score_rollout is not vf.Rubric.score_rollout:
        raise UsageError(f"verifiers environment {module!r}: its rubric {type(rubric).__name__} scores rollouts "
                         "its own way (its own score_rollout); tracegym runs a Rubric's reward functions one by "
                         "one and cannot run it")
    for func, weight in zip(rubric.funcs, rubric.weights, strict=True):
        if rubric._is_group_func(func):
            raise UsageError(f"verifiers environment {module!r}: reward function "
                             f"{getattr(func, '__name__', func)!r} scores a whole group (states, completions, ...); "
                             "tracegym runs verifiers' per-rollout reward functions only")
        yield rubric, func, weight


def _scoring(rubric: Any, func: Callable[..., Any]) -> Callable[[Task[Any, Any], Trace], Any]:
    """A tracegym scorer calling `func` as verifiers' Rubric does (the arguments it names of prompt, completion,
    answer, state, info, task, the parser...), except that what it raises is raised (an error on the trace)."""
    parameters = inspect.signature(func).parameters
    takes_all = any(p.kind == p.VAR_KEYWORD for p in parameters.values())

    async def score(task: Task[Any, Any], trace: Trace) -> Any:
        state = getattr(task, "state", None)
        if state is None:
            raise TaskError("the verifiers rollout left no state to score")
        objects = rubric.score_objects(state)
        given = objects if takes_all else {k: v for k, v in objects.items() if k in parameters}
        return await call_maybe_async(func, **given)

    score.__name__ = getattr(func, "__name__", "reward")
    return score
