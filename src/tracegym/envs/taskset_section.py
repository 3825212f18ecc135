"""Taskset section: a command's `taskset` table typed by the chosen taskset's own Config, so that
`--taskset.max-words 5` is parsed and validated (and a misspelling suggested) like any other flag, by every command
that takes a taskset (`eval`, `serve`)."""

from __future__ import annotations

import inspect
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo

from tracegym.envs.registry import resolve
from tracegym.envs.taskset import Taskset, TasksetConfig

C = TypeVar("C", bound=BaseModel)


def typed_by_taskset(config: type[C], taskset_id: str | None) -> type[C]:
    """`config` (a command's config class with a `taskset` field) with that field typed by the taskset's own
    Config (`taskset_section`); `config` itself when the id or the taskset's options are unknown."""
    section = taskset_section(taskset_id) if taskset_id is not None else None
    if section is None:
        return config
    return create_model(config.__name__, __base__=config, taskset=(section, ...))


def taskset_section(taskset_id: str) -> type[BaseModel] | None:
    """The `taskset` section of `taskset_id`: its Config's fields (a ready-made instance's values as their
    defaults) and `id`; None when the taskset does not say what its options are (a factory then validates them
    when it builds the taskset)."""
    target = resolve(taskset_id)
    options = taskset_config(target)
    if options is None:
        return None
    own = target.config.model_dump() if isinstance(target, Taskset) else {}  # a ready-made one's defaults
    # each field's annotation with the instance's value as its default (Any: a ** argument is checked against every
    # keyword parameter of create_model's, `__config__` and the rest included)
    defaults: dict[str, Any] = {
        k: (options.model_fields[k].annotation, FieldInfo.merge_field_infos(options.model_fields[k], default=v))
        for k, v in own.items()}
    return create_model(
        f"{options.__name__}Section", __base__=options, __doc__=f"Options of the taskset {taskset_id!r}.",
        id=(str, Field(default=taskset_id, description="Taskset id.")), **defaults,
    )


def taskset_config(target: Any) -> type[TasksetConfig] | None:
    """The Config class of a Taskset class or instance, or the one a factory's first parameter is annotated
    with (`def counter_env(config: CounterEnvConfig | None = None)`); None when there is none."""
    if isinstance(target, type) and issubclass(target, Taskset):
        return target.Config
    if isinstance(target, Taskset):
        return type(target).Config
    try:
        hints = typing.get_type_hints(target)
        first = next(iter(inspect.signature(target).parameters), None)
    except Exception:  # evaluating user annotations may raise anything; without them the factory checks its options
        return None
    annotation = hints.get(first) if first else None
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, TasksetConfig):
            return candidate
    return None
