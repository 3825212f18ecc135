"""Run directory: how a command makes its run folder under `--output-dir`, and writes and reads files there whole."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import tomli_w
from pydantic import AfterValidator

from tracegym.core.errors import UsageError


def _one_folder_name(value: str) -> str:
    if not value or value in (".", "..") or "/" in value or "\\" in value or "\0" in value:
        raise ValueError("must be one folder name (no '/', not '.' or '..'): the run folder stays under --output-dir")
    return value


RunId = Annotated[str, AfterValidator(_one_folder_name)]
"""A run folder's name as `--run-id` gives it: one folder name, so the run folder stays under `--output-dir`."""


def make_run_dir(output_dir: Path, name: Path | str) -> Path:
    """A new, empty folder `output_dir/name`; an existing one, or one that cannot be made, is a UsageError."""
    path = output_dir / name
    if path.exists():
        raise UsageError(f"run folder {str(path)!r} already exists; pick another --run-id or --resume it")
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise UsageError(f"--output-dir {str(output_dir)!r}: cannot create a run folder there "
                         f"({exc.strerror or exc})") from None
    return path


LOCK = ".lock"
"""The file in a run folder its writer holds a lock on (and writes its pid to) for as long as it runs."""


@contextlib.contextmanager
def owned(folder: Path) -> Iterator[None]:
    """Hold the run folder's lock while the block runs: one writer at a time. A second (a `--resume` started while
    the run is still alive) is a UsageError naming the process that holds it. The lock goes with this process,
    even when it is killed."""
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise UsageError(f"run folder {str(folder)!r} is being written by another tracegym (pid {holder}); wait for "
                         "it to end or stop it, then --resume") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write `path` whole or not at all: a reader (or a resume after a kill) never sees half a file."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def write_toml(path: Path, config: dict[str, Any]) -> None:
    """A run's config, written atomically as TOML."""
    write_atomic(path, tomli_w.dumps(config))


def read_toml(path: Path) -> dict[str, Any]:
    """A run's config; a file that cannot be read or parsed is a UsageError naming it."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{str(path)!r} is not valid TOML: {exc}") from None
