"""Command line: a command's arguments (`@ file.toml` files merged left to right, then dotted flags) parsed into its
validated config, old keys migrated with warnings, and every error one line naming where the bad key was given:
the `--flag`, or the file and the TOML key as written there. A flag into a list's item (`--a.b.0.key`) is applied
to the files' data first (`item_flags`).
"""

from __future__ import annotations

import json
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_config import ConfigFileError, cli

from tracegym.config.error_report import Origin, known_keys, one_line, validation_line
from tracegym.config.item_flags import apply_item_flags, model_defaults
from tracegym.config.renames import Rename, migrate, migrate_flags
from tracegym.core.errors import UsageError

C = TypeVar("C", bound=BaseModel)


@dataclass(frozen=True)
class ConfigFile:
    """One `@` file: its name, its data as written (nested under the flag it followed), and as migrated."""

    name: str
    written: dict[str, Any]
    data: dict[str, Any]


def parse_command(cls: type[C], args: Sequence[str], *, prog: str, description: str | None = None,
                  renames: Sequence[Rename] = (), default: C | None = None) -> tuple[C, list[str]]:
    """The validated config and the rename warnings; a bad argument is a UsageError naming where it was given."""
    files, written_flags, warnings = read_files(args, renames)
    flags, found = migrate_flags(written_flags, list(renames))
    warnings += found
    merged: dict[str, Any] = {}
    for file in files:
        merged = merge(merged, file.data)
    flags, merged = apply_item_flags(flags, merged, lambda: default.model_dump(mode="json") if default is not None
                                     else model_defaults(cls))
    with tempfile.TemporaryDirectory() as tmp:  # the migrated files, merged, reach pydantic-config as one file
        merged_file = Path(tmp) / "merged.json"
        merged_file.write_text(json.dumps(merged))
        try:
            config = cli(cls, args=["@", str(merged_file), *flags], default=default, prog=prog,
                         description=description)
        except ConfigFileError as exc:
            if isinstance(exc.__cause__, ValidationError):
                origin = origins(files, given_flags(written_flags, cls), renames)
                raise UsageError(validation_line(exc.__cause__, known_keys(cls), origin)) from None
            raise UsageError(one_line(str(exc))) from None
    return config, warnings


def read_files(args: Sequence[str], renames: Sequence[Rename]) -> tuple[list[ConfigFile], list[str], list[str]]:
    """The `@` files (`@ a.toml`, `@a.toml`, or a JSON object in place of the path; after a `--key` flag: nested
    under that key), the other arguments, and the warnings of the files' renamed keys."""
    files: list[ConfigFile] = []
    rest: list[str] = []
    warnings: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "@" or (arg.startswith("@") and len(arg) > 1):
            if arg == "@" and i + 1 >= len(args):
                raise UsageError("@ must be followed by a config file path")
            path = args[i + 1] if arg == "@" else arg[1:]
            under = rest.pop()[2:].replace("-", "_") if rest and rest[-1].startswith("--") else ""
            inline = path.lstrip().startswith("{")
            written = nest(under, inline_json(path) if inline else load(Path(path)))
            data, found = migrate(written, list(renames))
            files.append(ConfigFile(f"inline JSON {path}" if inline else path, written, data))
            warnings += found
            i += 2 if arg == "@" else 1
        else:
            rest.append(arg)
            i += 1
    return files, rest, warnings


def inline_json(text: str, where: str = "inline JSON") -> dict[str, Any]:
    """An `@` argument written as a JSON object in place of a file (`--taskset @ '{"k": 1}'`), values typed as
    JSON types them; not an object, or not JSON: a UsageError naming `where` and quoting it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: {text!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where}: {text!r} must be a JSON object ({{...}})")
    return data


def load(path: Path) -> dict[str, Any]:
    """A TOML (or JSON) config file's data; a missing or malformed file is a UsageError naming it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"config file {str(path)!r} does not exist") from None
    try:
        return json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"config file {str(path)!r} is not valid {path.suffix[1:].upper() or 'TOML'}: {exc}") from None


def given_flags(flags: Sequence[str], cls: type[BaseModel]) -> set[str]:
    """The dotted snake_case keys the flags set (`--no-x` sets `x`; `-n` sets the field it abbreviates)."""
    shorts = short_flags(cls)
    given = set()
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name.startswith("--"):
            key = name[2:].replace("-", "_")
            given |= {key, key.removeprefix("no_")}
        elif name in shorts:
            given.add(shorts[name])
    return given


def short_flags(cls: type[BaseModel]) -> dict[str, str]:
    """`-n` -> `num_tasks` for each top-level field with a one-letter alias."""
    found = {}
    for name, field in cls.model_fields.items():
        for choice in getattr(field.validation_alias, "choices", ()):
            if isinstance(choice, str) and len(choice) == 1:
                found["-" + choice] = name
    return found


def origins(files: Sequence[ConfigFile], flags: set[str], renames: Sequence[Rename]) -> Callable[[str], Origin]:
    """Where the key at a dotted path was given: a flag wins (it overrides files), then the last file that has
    it; each under the name written there, before renames; else a flag (a key nobody gave: missing, say)."""
    def origin(path: str) -> Origin:
        for written in written_names(path, renames):
            if any(f == written or f.startswith(written + ".") or written.startswith(f + ".") for f in flags):
                return Origin(written=None if written == path else written)
        for file in reversed(files):
            for written in written_names(path, renames):
                if has(file.written, written.split(".")):
                    return Origin(file=file.name, written=written)
        return Origin()
    return origin


def written_names(path: str, renames: Sequence[Rename]) -> list[str]:
    """`path` and every older name it may have been written under (renames undone, newest first)."""
    names = [path]
    for rename in reversed(renames):
        names += [rename.old + n[len(rename.new):] for n in names
                  if n == rename.new or n.startswith(rename.new + ".")]
    return names


def has(data: Any, path: list[str]) -> bool:
    for key in path:
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and key.isdigit() and int(key) < len(data):
            data = data[int(key)]
        else:
            return False
    return True


def nest(under: str, data: dict[str, Any]) -> dict[str, Any]:
    for key in reversed(under.split(".") if under else []):
        data = {key: data}
    return data


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, tables merged key by key."""
    out = dict(base)
    for key, value in top.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out

