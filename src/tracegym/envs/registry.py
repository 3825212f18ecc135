"""Registry: finds a taskset by id: built-ins, installed entry points, `package.module:Name`, `file.py:Name` (a
Taskset class, instance or factory, or a TRL environment class or dict of them), and servers by URL
(`openenv:ws://HOST:PORT`)."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from tracegym.core.errors import UsageError
from tracegym.envs.environment_options import environment_target
from tracegym.envs.taskset import Taskset, TasksetConfig

ENTRY_POINT_GROUP = "tracegym.tasksets"

BUILTINS: dict[str, str] = {
    "reverse-text": "tracegym.tasksets.reverse_text:ReverseText",
    "alphabet-sort": "tracegym.tasksets.alphabet_sort:AlphabetSort",
    "arithmetic": "tracegym.tasksets.arithmetic:Arithmetic",
    "wordle": "tracegym.tasksets.wordle:Wordle",
    "tool-calculator": "tracegym.tasksets.tool_calculator:ToolCalculator",
    "counter-env": "tracegym.tasksets.counter_env:counter_env",
    "python-functions": "tracegym.tasksets.python_functions:PythonFunctions",
    "kuhn-poker": "tracegym.tasksets.kuhn_poker:KuhnPoker",
    "tictactoe": "tracegym.tasksets.tictactoe:TicTacToe",
    "debate": "tracegym.tasksets.debate:Debate",
    "propose-arithmetic": "tracegym.tasksets.propose_arithmetic:ProposeArithmetic",
    "colour-codeword": "tracegym.tasksets.colour_codeword:ColourCodeword",
    "image-tictactoe": "tracegym.tasksets.image_tictactoe:image_tictactoe",
}
URL_SCHEMES: dict[str, str] = {"openenv": "tracegym.interop.openenv_taskset:at_url"}
"""Ids `SCHEME:URL` (`openenv:ws://127.0.0.1:8001`): the factory each scheme's function makes for the URL."""
MODULE_SCHEMES: dict[str, str] = {"verifiers": "tracegym.interop.verifiers_taskset:for_module"}
"""Ids `SCHEME:MODULE` (`verifiers:reverse-text`, `verifiers:envs/mine.py`): the factory each scheme's function makes
for the module."""


def known_tasksets() -> dict[str, str]:
    """Every taskset id that resolves without a path: built-ins, then installed entry points."""
    found = dict(BUILTINS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def load_taskset(spec: str | Taskset, config: TasksetConfig | Mapping[str, Any] | None = None) -> Taskset:
    """The taskset named by `spec`, built with `config`; an unknown id is a UsageError listing known ones."""
    if isinstance(spec, Taskset):
        return spec
    target = resolve(spec)
    if isinstance(target, Taskset):
        return _ready_made(target, config, spec)
    taskset = _build(target, config, spec)
    if not isinstance(taskset, Taskset):
        raise UsageError(f"taskset {spec!r}: {getattr(target, '__name__', spec)}() gave a {type(taskset).__name__}, "
                         "not a Taskset (a taskset id names a Taskset, its class or a factory of one, or a TRL "
                         "environment class)")
    return taskset


def _ready_made(taskset: Taskset, config: TasksetConfig | Mapping[str, Any] | None, spec: str) -> Taskset:
    """A ready-made instance, given options only where they repeat its own (a command passes every option)."""
    given, own = _options(config), taskset.config.model_dump()
    differ = [f"{k!r} = {v!r} (it has {own[k]!r})" if k in own else f"{k!r} (not one of its options)"
              for k, v in given.items() if k not in own or own[k] != v]
    if differ:
        raise UsageError(f"taskset {spec!r} is a ready-made instance and takes no config that differs from its "
                         f"own: {', '.join(differ)}")
    return taskset


def _build(target: Any, config: TasksetConfig | Mapping[str, Any] | None, spec: str) -> Any:
    """Call a Taskset class or factory with the options; a factory without parameters gets none."""
    if not callable(target):
        raise UsageError(f"taskset {spec!r} names a {type(target).__name__}, not a Taskset, its class or a factory")
    if isinstance(target, type) and not issubclass(target, Taskset):
        raise UsageError(f"taskset {spec!r} is a class that is neither a Taskset nor a TRL environment class (one "
                         "with a `reset` method, as TRL's environment_factory takes)")
    if isinstance(target, type) or _takes_an_argument(target):
        if not isinstance(target, type) and not _binds(target, config):
            raise UsageError(f"taskset {spec!r}: {target.__name__}{inspect.signature(target)} cannot be called with "
                             "the taskset's options alone, so it is no taskset factory (a taskset id names a Taskset, "
                             "its class or a factory of one taking the options or nothing, or a TRL environment "
                             "class; a reward function goes to --taskset.rewards)")
        return target(config) if config is not None else target()
    given = _options(config)
    if given:
        raise UsageError(f"taskset {spec!r}: {target.__name__}() takes no options; given "
                         f"{', '.join(repr(k) for k in given)}")
    return target()


def _options(config: TasksetConfig | Mapping[str, Any] | None) -> dict[str, Any]:
    return config.model_dump() if isinstance(config, TasksetConfig) else dict(config or {})


def _binds(factory: Any, config: Any) -> bool:
    """Whether `factory` can be called as a taskset factory is (with the options, or none); True where its
    signature cannot be read."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(config) if config is not None else signature.bind()
    except TypeError:
        return False
    return True


def _takes_an_argument(factory: Any) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call say what it takes
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


def resolve(spec: str) -> Any:
    """The object `spec` names: a Taskset class, a Taskset instance, or a factory returning one."""
    known = known_tasksets()
    scheme, _, url = spec.partition(":")
    if scheme in URL_SCHEMES:
        if "://" not in url:
            raise UsageError(f"taskset {spec!r}: {scheme}: takes a URL with its scheme, e.g. "
                             f"'{scheme}:http://{url}' or '{scheme}:ws://{url}'")
        return _import(URL_SCHEMES[scheme], spec)(url)
    if scheme in MODULE_SCHEMES:
        if not url:
            raise UsageError(f"taskset {spec!r}: {scheme}: takes a module, e.g. '{scheme}:reverse-text' or "
                             f"'{scheme}:path/to/env.py'")
        return _import(MODULE_SCHEMES[scheme], spec)(url)
    if spec in known:
        return _import(known[spec], spec)
    if ":" in spec:
        return _import(spec, spec)
    close = difflib.get_close_matches(spec, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UsageError(f"unknown taskset {spec!r}.{hint} Known: {', '.join(sorted(known))}")


def _import(target: str, spec: str) -> Any:
    module_name, _, attr = target.rpartition(":")
    try:
        module = _load_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UsageError(f"taskset {spec!r}: cannot import {module_name!r} ({exc})") from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise UsageError(f"taskset {spec!r}: {module_name!r} has no {attr!r}") from None
    return environment_target(target, attr)  # a TRL environment class takes no config: built by a factory


def _load_file(path: str) -> Any:
    """Import a taskset file as a module (`import_file`); a failure is one line naming the file."""
    try:
        return import_file(Path(path), "tracegym_user")
    except FileNotFoundError:
        raise UsageError(f"taskset file {path!r} does not exist") from None
    except SyntaxError as exc:
        raise UsageError(f"taskset file {path!r}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # the user's module code failed: one line naming the file, not our traceback
        raise UsageError(f"taskset file {path!r} failed to import: {type(exc).__name__}: {exc}") from None


def import_file(path: Path, prefix: str) -> ModuleType:
    """Import a Python file as a module named after `prefix`, the file's stem and its path (imported once). Its
    folder goes first on `sys.path` (as `python file.py` does) and stays there: task code may import a module
    beside it lazily, at rollout time, here or in an env-server worker (which loads the same file the same way).
    A missing file is FileNotFoundError; what the module's code raised (SystemExit too) is raised again, the half
    imported module forgotten."""
    file = path.resolve()
    if not file.is_file():
        raise FileNotFoundError(str(path))
    name = f"{prefix}_{file.stem}_{abs(hash(str(file)))}"
    if name in sys.modules:
        return sys.modules[name]
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
