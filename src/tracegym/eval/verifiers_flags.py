"""Verifiers flags: `vf-eval` / `prime eval run` spellings of `tracegym eval`'s options, translated with a note each.

A verifiers user's muscle memory (`-n 10 -r 3 -c 32 -a '{"difficulty": 2}' -S '{"top_k": 20}' -b URL`) works here:
each flag is rewritten to ours and named once on stderr with its new spelling. Flags with no equivalent are named
in one line (`--verbose`: the dashboard is the live log) or accepted with what they mean here (`--save-results`: a
run folder is always written). `-n`, `-r`, `-c` and `-m` are ours already.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tracegym.config.command_line import inline_json
from tracegym.core.errors import UsageError

SAME_VALUE = {
    "--num-examples": "--num-tasks",
    "--rollouts-per-example": "--rollouts",
    "--max-concurrent": "--concurrency",
    "--max-concurrent-requests": "--concurrency",
    "--api-base-url": "--model.base-url",
    "-b": "--model.base-url",
    "--api-key-var": "--model.api-key-env",
    "-k": "--model.api-key-env",
    "--max-tokens": "--sampling.max-tokens",
    "-t": "--sampling.max-tokens",
    "--temperature": "--sampling.temperature",
    "-T": "--sampling.temperature",
}
"""Verifiers flag -> ours, the value unchanged."""
JSON_SECTIONS = {"--env-args": "--taskset", "-a": "--taskset", "--sampling-args": "--sampling", "-S": "--sampling"}
"""Verifiers flags whose value is a JSON object: read into our section of that name (`@` inline JSON)."""
ALWAYS = {"--save-results": "a run folder is always written", "-s": "a run folder is always written"}
"""Verifiers flags that ask for what tracegym always does: dropped, with that said."""
NO_EQUIVALENT = {"--verbose": "the live dashboard (or --no-rich log lines) is the log",
                 "-v": "the live dashboard (or --no-rich log lines) is the log",
                 "--extra-env-kwargs": "pass the taskset's options as --taskset.NAME (or -a JSON)",
                 "-x": "pass the taskset's options as --taskset.NAME (or -a JSON)"}
"""Verifiers flags tracegym has no equivalent for, with what to use instead."""
SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "seed", "stop")
"""Keys of `-S` JSON that are our own sampling fields; any other goes to `sampling.extra` (sent to the endpoint)."""


def translate(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """`args` with verifiers' flags rewritten to ours, and the notes to print (one per flag rewritten or dropped);
    a flag with no equivalent or a JSON value that is not an object is a UsageError naming it."""
    out: list[str] = []
    notes: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        flag, value, step = _split(items, i)
        if flag in NO_EQUIVALENT:
            raise UsageError(f"{flag} (a verifiers flag) has no tracegym equivalent: {NO_EQUIVALENT[flag]}")
        if flag in ALWAYS:
            notes.append(f"{flag} (verifiers) is not needed: {ALWAYS[flag]}")
            i += 1
            continue
        if flag in SAME_VALUE:
            out += [SAME_VALUE[flag], _value(flag, value)]
            notes.append(f"{flag} (verifiers) is {SAME_VALUE[flag]} here")
        elif flag in JSON_SECTIONS:
            out += [JSON_SECTIONS[flag], "@", json.dumps(_json_section(flag, _value(flag, value)))]
            notes.append(f"{flag} (verifiers) is {JSON_SECTIONS[flag]}.NAME here (or {JSON_SECTIONS[flag]} @ JSON)")
        else:
            out.append(items[i])
            step = 1
        i += step
    return out, notes


def _split(items: list[str], i: int) -> tuple[str, str | None, int]:
    """The flag at `i`, its value (`--f=v` or the next item) and how many items they take."""
    flag, eq, value = items[i].partition("=")
    if eq and flag.startswith("--"):
        return flag, value, 1
    return items[i], items[i + 1] if i + 1 < len(items) else None, 2


def _value(flag: str, value: str | None) -> str:
    if value is None:
        raise UsageError(f"{flag} needs a value")
    return value


def _json_section(flag: str, text: str) -> dict[str, Any]:
    data = inline_json(text, where=flag)
    if flag in ("--sampling-args", "-S"):
        extra = {k: v for k, v in data.items() if k not in SAMPLING_FIELDS}
        data = {k: v for k, v in data.items() if k in SAMPLING_FIELDS} | ({"extra": extra} if extra else {})
    return data
