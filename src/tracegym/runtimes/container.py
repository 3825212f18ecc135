"""Container: the `container` runtime; programs run in a docker or podman container, when the host has a working
engine (detected: the client alone is not enough, its daemon must answer)."""

from __future__ import annotations

import functools
import shutil
import subprocess

from tracegym.runtimes.process_sandbox import ProcessSandbox
from tracegym.runtimes.sandbox import Limits, RuntimeUnavailable

ENGINES = ("docker", "podman")
PROBE_TIMEOUT_S = 10.0


@functools.cache
def detect_engine() -> tuple[str | None, str]:
    """The first engine whose daemon answers `info`, or None and why none does; asked once per process."""
    reasons = []
    for engine in ENGINES:
        if not shutil.which(engine):
            reasons.append(f"{engine} is not installed")
            continue
        try:
            done = subprocess.run([engine, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                                  timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"{engine} info failed: {exc}")
            continue
        if done.returncode == 0:
            return engine, ""
        said = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
        reasons.append(f"{engine} is installed but its engine does not answer ({said[-1] if said else 'no reason'})")
    return None, "; ".join(reasons)


class Container:
    """The `container` runtime (docker or podman, whichever answers first)."""

    name = "container"

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()

    def unavailable(self) -> str | None:
        engine, why = detect_engine()
        return None if engine else why

    async def open(self) -> ProcessSandbox:
        reason = self.unavailable()
        if reason:
            raise RuntimeUnavailable(f"runtime {self.name!r} is unavailable on this host: {reason}")
        raise RuntimeUnavailable(f"runtime {self.name!r}: not implemented yet")
