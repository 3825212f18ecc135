"""TasksetConfig: the options of a taskset, validated so that a wrong one is one line naming the field."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import TypeVar

from tracegym.core.errors import UsageError


class TasksetConfig(BaseModel):
    """Options of a taskset; subclass it per taskset (every field with a default and a docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    seed: int = 0
    """Seed for generated tasks."""


ConfigT = TypeVar("ConfigT", bound=TasksetConfig, default=TasksetConfig, covariant=True)
"""A taskset's config type: `Taskset[MyConfig]` and `Task[MyData, MyConfig]` read `self.config` as a MyConfig."""
C = TypeVar("C", bound=TasksetConfig)


def config_from(cls: type[C], value: TasksetConfig | Mapping[str, Any] | None, owner: str) -> C:
    """Validate a taskset config, turning pydantic's report into one line naming the field."""
    if isinstance(value, cls):
        return value
    try:
        return cls.model_validate(dict(value or {}))
    except ValidationError as exc:
        raise UsageError(f"taskset {owner!r}: {first_error(exc, known=cls.model_fields)}") from None


def first_error(exc: ValidationError, known: Iterable[str] = ()) -> str:
    """The first problem of a validation error as `field 'x': message`; an unknown top-level field also gets
    the closest of the `known` field names and the list of them."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(row)"
    text = f"field {where!r}: {err['msg']} (got {err.get('input')!r})"
    known = sorted(known)
    if err["type"] != "extra_forbidden" or len(err["loc"]) != 1 or not known:
        return text
    close = difflib.get_close_matches(str(err["loc"][0]), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{text}{hint} Known fields: {', '.join(known)}"
