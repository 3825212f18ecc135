"""Error report: a config validation error as one line naming each flag or key at fault."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Origin:
    """Where a key was given: a command-line flag (no `file`), or a config file, under the dotted name `written`
    there (its name before any rename)."""

    file: str | None = None
    written: str | None = None

    def name(self, path: str) -> str:
        """The key as its user wrote it: `--a.b-c`, or `file: [a] b_c`."""
        return flag(self.written or path) if self.file is None else f"{self.file}: {toml_key(self.written or path)}"

    def suggestion(self, path: str) -> str:
        """A known key in the same style, without the file."""
        return flag(path) if self.file is None else toml_key(path)


def validation_line(exc: ValidationError, known: Sequence[str], origin: Callable[[str], Origin]) -> str:
    """A validation error as one line of `key: problem` items, each key named as `origin` says it was given; an
    unknown key also gets the closest known one (for a flag matched on its whole dotted path, so
    `--samplin.temperature` finds `--sampling.temperature`; for a file on the key as written there)."""
    items = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        value = err.get("input")
        where = origin(path)
        if err["type"] == "extra_forbidden":
            shown = _leaf_paths(path, value)[0] if where.file is None else path
            close = difflib.get_close_matches(shown, list(known), n=1, cutoff=0.6)
            hint = f"; did you mean {where.suggestion(close[0])}?" if close else ""
            items.append(f"{where.name(shown)}: unknown {'option' if where.file is None else 'key'}{hint}")
            continue
        got = "" if isinstance(value, dict | list) else f" (got {value!r})"
        items.append(f"{where.name(path)}: {err['msg']}{got}")
    return "; ".join(items)


def flag(path: str) -> str:
    """A dotted key as its command-line flag: `--a.b-c`; a list item's index at the end is left out (the flag
    names the list; the value shown says which item)."""
    parts = path.split(".")
    while len(parts) > 1 and parts[-1].isdigit():
        parts.pop()
    return "--" + ".".join(parts).replace("_", "-")


def toml_key(path: str) -> str:
    """A dotted key as a TOML reader finds it: `[a.b] c` (`c` at the top level; list items as `[a[0]] c`)."""
    parts = path.split(".")
    section = ""
    for part in parts[:-1]:
        section += f"[{part}]" if part.isdigit() else f".{part}" if section else part
    return f"[{section}] {parts[-1]}" if section else parts[-1]


def _leaf_paths(path: str, value: Any) -> list[str]:
    """The dotted paths of the leaves under `value` (an unknown section given as a table), or `path` itself."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaf_paths(f"{path}.{k}", v)]
    return [path]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
