"""Processes: a child started as the leader of its own process group, stopped with everything it started
(terminate, a grace period, kill), and a child that exits when its parent does.

The vLLM supervisor, env servers, env-server workers and RL roles are all stopped here, and each exits with its
parent through here. Nothing here installs a signal handler: a process's handlers belong to its entry point.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

Output = int | IO[Any] | None
"""Where a child's stdout or stderr goes, as `subprocess.Popen` takes it (None: ours)."""

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when its parent exits."""


def spawn_group(command: Sequence[str], *, stdout: Output = None, stderr: Output = None,
                env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `command` as the leader of a new session and process group, stdin closed. Whatever it starts stays in
    its group, so `stop(proc, grace_s, group=True)` reaches all of it; a terminal's Ctrl-C does not reach it (its
    owner decides when it stops)."""
    return subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
                            start_new_session=True)


def stop(proc: subprocess.Popen[Any], grace_s: float, *, group: bool = False) -> int:
    """Stop one child as `stop_all` does; returns its exit code (negative: the signal that ended it)."""
    stop_all([proc], grace_s, group=group)
    return proc.returncode


def stop_all(procs: Iterable[subprocess.Popen[Any]], grace_s: float, *, group: bool = False) -> None:
    """SIGTERM every process, wait up to `grace_s` seconds for them all, SIGKILL whatever is left, and reap them.

    `group`: signal each one's whole process group (each must lead one, see `spawn_group`); its SIGKILL goes to
    the group even when the leader has exited, for the processes that outlived it."""
    procs = list(procs)
    for proc in procs:
        _send(proc, signal.SIGTERM, group)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if group or proc.poll() is None:
            _send(proc, signal.SIGKILL, group)
        proc.wait()


def _send(proc: subprocess.Popen[Any], sig: int, group: bool) -> None:
    """Signal `proc` (or its group); one that is already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        elif proc.poll() is None:
            proc.send_signal(sig)


def stop_rest_of_group(grace_s: float, poll_s: float = 0.1) -> None:
    """From a group's leader: SIGTERM every other live process of its group, wait up to `grace_s` seconds for
    them to go, then SIGKILL those left. They need not be its children (an orphaned grandchild is re-parented),
    so they are found in /proc and cannot be waited for."""
    me, pgid = os.getpid(), os.getpgrp()

    def others() -> list[int]:
        return [pid for pid in group_members(pgid) if pid != me]

    _signal_pids(others(), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while others() and time.monotonic() < deadline:
        time.sleep(poll_s)
    _signal_pids(others(), signal.SIGKILL)


def _signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`, found in /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def descendants(pid: int) -> set[int]:
    """Every live process whose ancestry (by parent pid, read from /proc) leads to `pid`."""
    parents = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and fields[0] not in ("Z", "X"):
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def process_alive(pid: int) -> bool:
    """True while `pid` exists and has not exited (a zombie has)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...); None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields if len(fields) >= 3 else None


@dataclass(frozen=True)
class Parent:
    """The process that started this one (by default: our parent now). It has exited once our parent pid is
    another: an orphan is re-parented (to init or a subreaper), and its pid is not reused while we are its child.

    >>> Parent().alive()
    True
    """

    pid: int = field(default_factory=os.getppid)

    def alive(self) -> bool:
        return os.getppid() == self.pid


def watch_parent(on_exit: Callable[[], object], every_s: float = 0.5, parent: Parent | None = None
                 ) -> threading.Thread:
    """Call `on_exit` once, on a daemon thread, when `parent` (default: ours now) has exited; polled every
    `every_s` seconds, so it works where no kernel signal does and catches a parent that died even by SIGKILL."""
    watched = parent or Parent()

    def watch() -> None:
        while watched.alive():
            time.sleep(every_s)
        on_exit()

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def die_with_parent(sig: int = signal.SIGTERM, every_s: float = 0.5) -> None:
    """Have `sig` sent to this process when its parent exits, so that its handler for `sig` (or the default,
    death) decides how it ends: Linux's parent-death signal at once, and `watch_parent` as the fallback (other
    systems, and a parent that died before this call).

    The kernel's signal fires when the *thread* that started this process ends, not its process: use it only in
    a child whose parent starts it from a thread that lives as long as the child should."""
    parent = Parent()
    _parent_death_signal(sig)
    watch_parent(lambda: os.kill(os.getpid(), sig), every_s, parent)


def _parent_death_signal(sig: int) -> bool:
    """Ask Linux for `sig` at our parent's exit (prctl PR_SET_PDEATHSIG); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig) == 0
    except (OSError, AttributeError):  # no libc to load, or one without prctl: the parent watch covers it
        return False
