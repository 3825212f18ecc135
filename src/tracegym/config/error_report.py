"""Error report: a config validation error as one line naming each flag or key at fault."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError


def one_line(report: str) -> str:
    """pydantic-config's multi-line report as `--flag: problem` items on one line."""
    lines = [ln.strip() for ln in report.splitlines() if ln.strip()]
    lines = [ln.removeprefix("Failed to validate config:").strip() for ln in lines]
    lines = [ln for ln in lines if ln and "validation error" not in ln]
    items: list[str] = []
    for line in lines:
        if line.startswith("--") and " " not in line:
            items.append(line)
        elif items and items[-1].startswith("--") and ":" not in items[-1]:
            items[-1] = f"{items[-1]}: {line}"
        else:
            items.append(line)
    return "; ".join(items) or report


def known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted snake_case key path of `model`: its leaf fields and, for nested models, their sections."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        path = prefix + name
        keys.append(path)
        nested = [t for t in (field.annotation, *get_args(field.annotation)) if _is_model(t)]
        if nested:
            keys += known_keys(nested[0], path + ".")
    return keys


def validation_line(exc: ValidationError, known: Sequence[str], *, as_flags: bool) -> str:
    """A validation error as one line of `key: problem` items (`--key` when `as_flags`); an unknown key also
    gets the closest known one, matched on its whole dotted path (so `--samplin.temperature` finds
    `--sampling.temperature`)."""
    items = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            paths = _leaf_paths(path, value)
            close = difflib.get_close_matches(paths[0], list(known), n=1, cutoff=0.6)
            hint = f"; did you mean {_key(close[0], as_flags)}?" if close else ""
            items.append(f"{_key(paths[0], as_flags)}: unknown {'option' if as_flags else 'key'}{hint}")
            continue
        got = "" if isinstance(value, dict | list) else f" (got {value!r})"
        items.append(f"{_key(path, as_flags)}: {err['msg']}{got}")
    return "; ".join(items)


def _leaf_paths(path: str, value: Any) -> list[str]:
    """The dotted paths of the leaves under `value` (an unknown section given as a table), or `path` itself."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaf_paths(f"{path}.{k}", v)]
    return [path]


def _key(path: str, as_flags: bool) -> str:
    return "--" + path.replace("_", "-") if as_flags else repr(path)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
