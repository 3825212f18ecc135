"""Helpers for the sandbox tests: every runtime this host can run, with short limits, and a sandbox per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.container import detect_engine
from tracegym.runtimes.limited_process import FALLBACK, LimitedProcess, detect_isolation
from tracegym.runtimes.processes import process_alive
from tracegym.runtimes.sandbox import Limits, Runtime

QUICK = Limits(wall_seconds=3, cpu_seconds=2, memory_mb=256, file_size_mb=1, open_files=64, processes=16,
               output_bytes=10_000, disk_mb=16)
"""Limits that end a hostile program within seconds."""


def runtimes(limits: Limits = QUICK) -> list[object]:
    """pytest params: the subprocess runtime as detected (skipped where this host has no namespaces: it then
    refuses to open), its process-group fallback asked for by name, bubblewrap, and the container runtime (slow: its
    image is built once per session, see conftest.py); each skipped where this host lacks it."""
    sub = runtime_for("subprocess", limits)
    params: list[object] = [pytest.param(sub, id=f"subprocess-{detect_isolation()}", marks=pytest.mark.skipif(
        bool(sub.unavailable()), reason=str(sub.unavailable())))]
    params.append(pytest.param(runtime_for(FALLBACK, limits), id="subprocess-process-group"))
    bwrap = runtime_for("bubblewrap", limits)
    params.append(pytest.param(bwrap, id="bubblewrap",
                               marks=pytest.mark.skipif(bool(bwrap.unavailable()), reason=str(bwrap.unavailable()))))
    engine, why = detect_engine()
    params.append(pytest.param(runtime_for("container", limits), id="container",
                               marks=[pytest.mark.slow, pytest.mark.skipif(engine is None, reason=why)]))
    return params


def isolated(runtime: Runtime) -> bool:
    """True when the runtime gives network and PID namespaces (not the process-group fallback)."""
    return not (isinstance(runtime, LimitedProcess) and runtime.isolation == FALLBACK)


def processes_with(token: str) -> list[int]:
    """Live processes whose command line holds `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if token.encode() in (entry / "cmdline").read_bytes() and process_alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
