"""Item flags: `--a.b.N.key VALUE` sets `key` of item N of the list at `a.b` (an array of tables, such as the
environments of `[[orchestrator.train.envs]]`), which a dotted flag alone cannot reach.

The list is the one the `@` files give, else one a `--a.b '[...]'` flag gives (JSON), else the command's default;
the item flags are applied to it in order, and the result reaches the config as if a file had written it. A
value that starts with `{` or `[` is JSON; any other is a string the field's type reads (`3`, `true`). An index the
list does not have, or a key path through a value that is no table, is a UsageError naming the flag.

>>> apply_item_flags(["--envs.0.play.learner", "alternate", "--dry-run"], {"envs": [{"id": "kuhn-poker"}]}, dict)
(['--dry-run'], {'envs': [{'id': 'kuhn-poker', 'play': {'learner': 'alternate'}}]})
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined, to_jsonable_python

from tracegym.core.errors import UsageError


def apply_item_flags(flags: Sequence[str], merged: dict[str, Any], defaults: Callable[[], dict[str, Any]],
                     ) -> tuple[list[str], dict[str, Any]]:
    """`flags` less the item flags and the flags giving the lists they index, and `merged` (the files' data) with
    those applied in order; `defaults()` is the command's default config as data (asked only for a list no file
    or flag gives)."""
    parsed = list(_flags(flags))
    lists = {tuple(path[:_index(path)]) for _, path, _ in parsed if _index(path) is not None}
    if not lists:
        return list(flags), merged
    out, rest = copy.deepcopy(merged), []
    for raw, path, value in parsed:
        at = _index(path)
        if at is None and tuple(path) not in lists:
            rest += raw
            continue
        flag = raw[0].split("=", 1)[0]
        if value is None:
            raise UsageError(f"{flag} needs a value")
        if at is None:
            _put(out, path, _decode(flag, value))
        else:
            _set_item(out, path[:at], int(path[at]), path[at + 1:], _decode(flag, value), flag, defaults)
    return rest, out


def _flags(flags: Sequence[str]) -> list[tuple[list[str], list[str], str | None]]:
    """Each argument as (its raw words, its dotted snake_case path or [] when it is no `--` flag, its value if it
    may take one: `--k=v`, or `--k v` when the next word is no flag)."""
    out: list[tuple[list[str], list[str], str | None]] = []
    i = 0
    while i < len(flags):
        arg = flags[i]
        if not arg.startswith("--"):
            out.append(([arg], [], None))
            i += 1
            continue
        name, eq, value = arg.partition("=")
        path = name[2:].replace("-", "_").split(".")
        if eq:
            out.append(([arg], path, value))
            i += 1
        elif i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            out.append(([arg, flags[i + 1]], path, flags[i + 1]))
            i += 2
        else:
            out.append(([arg], path, None))
            i += 1
    return out


def _index(path: list[str]) -> int | None:
    """Where the first list index is in a flag's path (None: it has none)."""
    return next((i for i, key in enumerate(path) if key.isdigit() and i > 0), None)


def _decode(flag: str, value: str) -> Any:
    if not value.lstrip().startswith(("{", "[")):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag}: {value!r} is not valid JSON ({exc})") from None


def _put(data: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    data[path[-1]] = value


def _set_item(data: dict[str, Any], list_path: list[str], index: int, key_path: list[str], value: Any, flag: str,
              defaults: Callable[[], dict[str, Any]]) -> None:
    """Item `index` of the list at `list_path` (taken from `defaults` when `data` has none) gets `value` at
    `key_path` (the whole item when it is empty)."""
    items = _find(data, list_path)
    if items is None:
        items = copy.deepcopy(_find(defaults(), list_path))
        if not isinstance(items, list):
            raise UsageError(f"{flag}: {'.'.join(list_path)} is not a list")
        _put(data, list_path, items)
    if not isinstance(items, list):
        raise UsageError(f"{flag}: {'.'.join(list_path)} is not a list")
    if index >= len(items):
        n = len(items)
        listed = {0: "no items", 1: "1 item (index 0)"}.get(n, f"{n} items (indices 0-{n - 1})")
        raise UsageError(f"{flag}: {'.'.join(list_path)} has {listed}; give the whole list to add one "
                         f"(--{'.'.join(list_path).replace('_', '-')} '[...]')")
    if not key_path:
        items[index] = value
        return
    item = items[index]
    for key in key_path[:-1]:
        if not isinstance(item, dict):
            raise UsageError(f"{flag}: {key!r} is set inside a value that is not a table")
        item = item.setdefault(key, {})
    if not isinstance(item, dict):
        raise UsageError(f"{flag}: {key_path[-1]!r} is set inside a value that is not a table")
    item[key_path[-1]] = value


def _find(data: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def model_defaults(cls: type[BaseModel]) -> dict[str, Any]:
    """The defaults of a config class's fields as data (a field without one is left out)."""
    out = {}
    for name, field in cls.model_fields.items():
        value = field.get_default(call_default_factory=True)
        if value is not PydanticUndefined:
            out[name] = to_jsonable_python(value)
    return out
