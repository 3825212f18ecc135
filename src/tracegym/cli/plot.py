"""`tracegym plot RUN_DIR`: write PNG curves of an RL run into RUN_DIR/plots/."""

from __future__ import annotations

from pathlib import Path

from tracegym.core.errors import UsageError
from tracegym.train.plots import plot_run


def run(args: list[str]) -> int:
    if len(args) != 1 or args[0].startswith("-"):
        raise UsageError("usage: tracegym plot RUN_DIR")
    for path in plot_run(Path(args[0])):
        print(path)
    return 0
