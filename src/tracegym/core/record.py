"""Record: the base of every model tracegym writes and reads back across a file or process boundary.

Traces, episodes, samples and their parts are records. A field a record does not know (a trace written by a newer
tracegym, a hand-edited file, a request from a newer client) is refused with its dotted path named, never dropped:
a field read and silently lost is data a rescore or a trainer would then compute without.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class Record(BaseModel):
    """A model whose unknown fields are an error (`extra="forbid"`); subclasses add their own config."""

    model_config = ConfigDict(extra="forbid")


def unknown_fields(error: ValidationError) -> list[str]:
    """The dotted paths of the fields `error` refused as unknown (empty when it is about something else)."""
    return [".".join(map(str, e["loc"])) for e in error.errors() if e["type"] == "extra_forbidden"]


def record_problem(error: ValidationError) -> str:
    """One line saying why a record could not be read: its unknown fields by path (written by a newer tracegym?),
    else pydantic's first complaint with its path."""
    unknown = unknown_fields(error)
    if unknown:
        return f"unknown field(s) {', '.join(unknown)} (written by a newer tracegym, or edited by hand?)"
    first = error.errors()[0]
    if first["type"] == "json_invalid":
        return f"corrupt, not JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
    where = ".".join(map(str, first["loc"]))
    return f"{where}: {first['msg']}" if where else str(first["msg"])
