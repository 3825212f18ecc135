"""Flag: command-line options a command takes itself, before its config parser sees the rest (`--resume DIR`)."""

from __future__ import annotations

from tracegym.core.errors import UsageError


def pop_flag(args: list[str], flag: str) -> tuple[str | None, list[str]]:
    """The value of `flag` (`--flag V` or `--flag=V`) and the other arguments."""
    for i, arg in enumerate(args):
        if arg == flag:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                raise UsageError(f"{flag} needs a value")
            return args[i + 1], args[:i] + args[i + 2:]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1], args[:i] + args[i + 1:]
    return None, list(args)
