"""Container: the `container` runtime; programs run in a docker or podman container, when the host has a working
engine (detected: the client alone is not enough, its daemon must answer).

Each run is one `ENGINE run --rm --init` of the image (default `python:3.12-slim`) with no network (`Limits.network`
keeps the engine's default), every capability dropped, no_new_privs, a read-only root with a tmpfs /tmp of
`Limits.disk_mb`, the sandbox's working directory bound at the same path, the sandbox's uid (ours when not root), the
memory and process limits as the engine's cgroup limits and the CPU, file-size and open-file limits as ulimits. The
engine reports how the program ended through its own exit status (125-127: it could not start it; above 128: killed
by that signal, which a program exiting with such a status itself looks like too). A container the engine keeps after
a wall-clock kill or a cancel (killing its client does not stop it) is removed by name, and every container of the
sandbox by label at close.

Not tested on the machine this was written on: it has a docker client but no daemon, so detection says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from tracegym.runtimes.process_sandbox import PROBE_TIMEOUT_S, Confinement, Launch, ProcessSandbox
from tracegym.runtimes.sandbox import Limits, RuntimeUnavailable

ENGINES = ("docker", "podman")
IMAGE = "python:3.12-slim"
ENGINE_VARIABLES = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "CONTAINER_HOST", "XDG_RUNTIME_DIR")
"""The host's variables the engine's client needs to find its daemon (never passed into the container)."""
LABEL = "tracegym.sandbox"


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


class ContainerConfinement(Confinement):
    """`ENGINE run` of one image per run."""

    private_tmp = True
    cannot_forward = ("the container runtime runs the program without tracegym's program init, which is what "
                      "carries a sandbox's loopback port to a host service (the interception proxy); run agent "
                      "programs under the subprocess or bubblewrap runtime")

    def __init__(self, engine: str, image: str) -> None:
        self.engine, self.image = engine, image

    def wrap(self, launch: Launch) -> list[str]:
        limits, sandbox_id = launch.limits, launch.marker.split("/")[0]
        user = launch.uid if launch.uid is not None else os.getuid()
        command = [self.engine, "run", "--rm", "-i", "--init", "--name", container_name(launch.marker),
                   "--label", f"{LABEL}={sandbox_id}", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                   "--read-only", "--tmpfs", f"/tmp:size={limits.disk_mb}m", "--user", f"{user}:{user}",
                   "--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m",
                   "--pids-limit", str(limits.processes),
                   "--ulimit", f"cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
                   "--ulimit", f"fsize={limits.file_size_mb << 20}",
                   "--ulimit", f"nofile={limits.open_files}:{limits.open_files}",
                   "-v", f"{launch.workdir}:{launch.workdir}", "-w", str(launch.workdir)]
        if not limits.network:
            command += ["--network", "none"]
        for name in launch.env:
            command += ["-e", name]  # the value comes from the client's environment, never its command line
        return [*command, self.image, *launch.argv]

    def spawn_env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {**env, **{k: os.environ[k] for k in ENGINE_VARIABLES if k in os.environ}}

    def exit_status(self, returncode: int | None) -> dict[str, Any] | None:
        if returncode is None or returncode < 0:
            return None
        if returncode in (125, 126, 127):
            why = {125: "the engine could not run the container", 126: "the program is not executable",
                   127: "no such program in the image"}[returncode]
            return {"start_error": f"{why} ({self.engine} exit status {returncode})"}
        if returncode > 128:
            return {"exit_code": None, "signal": returncode - 128, "cpu_s": 0.0}
        return {"exit_code": returncode, "signal": None, "cpu_s": 0.0}

    async def reap(self, marker: str) -> None:
        await self._engine("rm", "-f", container_name(marker))

    async def release(self, sandbox_id: str) -> None:
        listed = await self._engine("ps", "-aq", "--filter", f"label={LABEL}={sandbox_id}")
        if listed.split():
            await self._engine("rm", "-f", *listed.split())

    async def _engine(self, *args: str) -> str:
        """Run one engine command to its end; its stdout ('' when it failed: cleanup is best effort)."""
        with contextlib.suppress(OSError):
            proc = await asyncio.create_subprocess_exec(self.engine, *args, stdout=subprocess.PIPE,
                                                        stderr=subprocess.DEVNULL)
            out, _ = await proc.communicate()
            return out.decode() if proc.returncode == 0 else ""
        return ""


def container_name(marker: str) -> str:
    """The container of the run marked `marker` (`<sandbox id>/<run>/`)."""
    return "tracegym-" + marker.strip("/").replace("/", "-")


class Container:
    """The `container` runtime (docker or podman, whichever answers first)."""

    name = "container"

    def __init__(self, limits: Limits | None = None, *, image: str = IMAGE) -> None:
        self.limits, self.image = limits or Limits(), image

    def unavailable(self) -> str | None:
        engine, why = detect_engine()
        return None if engine else why

    async def open(self) -> ProcessSandbox:
        engine, why = detect_engine()
        if engine is None:
            raise RuntimeUnavailable(f"runtime {self.name!r} is unavailable on this host: {why}")
        return ProcessSandbox(ContainerConfinement(engine, self.image), self.limits)
