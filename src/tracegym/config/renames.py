"""Renames: config keys that moved or changed name, migrated for one release with a warning naming the new key.

A rename maps a dotted old path to a dotted new path. It applies to TOML data (nested dicts) and to CLI flags
(`--old.path` -> `--new.path`, kebab- or snake-case). A value given under both names is an error. A key that moved
into a section of its own name (`model` -> `model.name`) moves only when given a value: `[model]` as a table and
`--model.base-url` are already the new spelling. Such a move is a shorthand kept for good (`--model NAME` is how
vLLM, TRL and verifiers users say it), so it moves without a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracegym.core.errors import UsageError


@dataclass(frozen=True)
class Rename:
    """`old` (dotted path) is now `new`; `since` names the release that renamed it."""

    old: str
    new: str
    since: str = "0.1"

    def warning(self) -> str:
        return f"config key {self.old!r} was renamed {self.new!r} (in {self.since}); please update your config"

    def into_itself(self) -> bool:
        """True when the key moved into a section of its own name (`model` -> `model.name`)."""
        return self.new.startswith(self.old + ".")


def moved_into(section: str, keys: Mapping[str, str], since: str = "0.1") -> list[Rename]:
    """Renames of top-level keys that moved into `section`: `keys` maps each old key to its field there."""
    return [Rename(old, f"{section}.{field}", since) for old, field in keys.items()]


def migrate(data: dict[str, Any], renames: list[Rename]) -> tuple[dict[str, Any], list[str]]:
    """A copy of `data` with every old key moved to its new place, and the warnings to show."""
    data = _deep_copy(data)
    warnings = []
    for rename in renames:
        found, value = _pop(data, rename.old.split("."))
        if not found:
            continue
        if rename.into_itself() and isinstance(value, dict):  # the section itself, not the old key
            _put(data, rename.old.split("."), value)
            continue
        target = rename.new.split(".")
        if _pop(_deep_copy(data), target)[0]:
            raise UsageError(f"config sets both {rename.old!r} (old name) and {rename.new!r}; keep only {rename.new!r}")
        _put(data, target, value)
        if not rename.into_itself():
            warnings.append(rename.warning())
    return data, warnings


def migrate_flags(args: list[str], renames: list[Rename]) -> tuple[list[str], list[str]]:
    """CLI arguments with old flag names replaced by new ones, and the warnings to show."""
    out, warnings = [], []
    for arg in args:
        flag, eq, value = arg.partition("=")
        if flag.startswith("--"):
            name = original = flag[2:].replace("-", "_")
            for rename in renames:  # in order, so a key moved and then renamed ends at its newest name
                if name == rename.old or (name.startswith(rename.old + ".") and not rename.into_itself()):
                    name = rename.new + name[len(rename.old):]
                    if not rename.into_itself():
                        warnings.append(rename.warning())
            if name != original:
                flag = "--" + name.replace("_", "-")
        out.append(flag + eq + value)
    return out, warnings


def _pop(data: dict[str, Any], path: list[str]) -> tuple[bool, Any]:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            return False, None
        node = child
    if path[-1] not in node:
        return False, None
    return True, node.pop(path[-1])


def _put(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if isinstance(value, dict) and isinstance(node.get(path[-1]), dict):
        node[path[-1]].update(value)
    else:
        node[path[-1]] = value


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
