"""Supervisor: the leader of a process group that runs one command and leaves nothing of the group behind.

`python -m tracegym.runtimes.supervisor --parent PID --grace S -- COMMAND...`, started with
`processes.spawn_group`, starts COMMAND as its child and waits. When asked to stop (SIGTERM or SIGINT), when
COMMAND exits, or when process PID is no longer its parent (its owner died, even by SIGKILL), it terminates COMMAND,
then every process left in its group (SIGTERM, `S` seconds, SIGKILL), and exits with COMMAND's exit code.

Why a process of its own: vLLM's engine core and workers outlive a killed API server, and an owner killed with
SIGKILL can stop nothing, so something in the group must outlive both to sweep it. Why not the kernel's
parent-death signal: it reaches only the direct child, and it fires when the *thread* that started the child ends
(an owner may start vLLM from a worker thread, as `VLLMServer.__aenter__` does).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from tracegym.runtimes.processes import Parent, stop_rest_of_group

POLL_S = 0.2
"""How often the supervisor checks its command and its parent."""


def command(parent: int, grace_s: float, child: Sequence[str]) -> list[str]:
    """The command line that supervises `child` for the owner `parent` (a pid), to start with `spawn_group`."""
    return [sys.executable, "-m", "tracegym.runtimes.supervisor", "--parent", str(parent), "--grace", str(grace_s),
            "--", *child]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command until it exits, we are asked to stop, or our owner is gone; then sweep the group."""
    args = _parser().parse_args(argv)
    asked: list[int] = []  # a flag a signal handler can set without taking a lock
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: asked.append(signum))  # our own entry point: its handlers are ours
    child = subprocess.Popen(args.command, stdin=subprocess.DEVNULL)
    owner = Parent(args.parent)
    while child.poll() is None and not asked and owner.alive():
        time.sleep(POLL_S)
    return shut_down(child, args.grace)


def shut_down(child: subprocess.Popen[bytes], grace_s: float) -> int:
    """Terminate the command (up to `grace_s` seconds), then whatever else is left in our group; its exit code."""
    if child.poll() is None:
        child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(grace_s)
    stop_rest_of_group(grace_s)
    return child.wait()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tracegym.runtimes.supervisor",
                                     description="Run COMMAND; stop its whole process group when it ends.")
    parser.add_argument("--parent", type=int, required=True, help="pid of the owner: its exit stops everything")
    parser.add_argument("--grace", type=float, default=15.0, help="seconds SIGTERM gets before SIGKILL")
    parser.add_argument("command", nargs="+", help="the command to run (after --)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
