"""Interrupt: a command's own process made to unwind on SIGTERM as it does on Ctrl-C, stopping what it started.

Only a command's `run` calls this: signal handlers are process-wide, so library code never installs them.
"""

from __future__ import annotations

import signal
from types import FrameType


def sigterm_unwinds(*, once: bool = False) -> None:
    """Make SIGTERM raise KeyboardInterrupt, as SIGINT (Ctrl-C) does, so that `with` blocks and `finally` clauses
    stop every process the command started. `once`: the first SIGTERM or SIGINT unwinds and later ones of either
    are ignored, so that they cannot cut that stop short."""
    if once:
        signal.signal(signal.SIGTERM, _interrupt_once)
        signal.signal(signal.SIGINT, _interrupt_once)
    else:
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _interrupt_once(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt
