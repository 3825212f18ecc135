"""TOML data: JSON-shaped config data made writable as TOML (which has no null)."""

from __future__ import annotations

from typing import Any


def toml_ready(value: Any) -> Any:
    """`value` with every None dropped from dicts and lists (an unset option is simply absent)."""
    if isinstance(value, dict):
        return {k: toml_ready(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [toml_ready(v) for v in value if v is not None]
    return value
