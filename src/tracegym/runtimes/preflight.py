"""Preflight: the check, before any rollout starts, that a sandbox can run on this host as asked.

`check_sandbox` raises one UsageError naming the setting and the value at fault (`envs.task_sandbox.
check_taskset` runs it for a taskset's tasks, before `tracegym eval`, `tracegym serve` and `evaluate` run any):

- `runtime`: the runtime cannot run here (`Runtime.unavailable`: bwrap or the container engine missing, no
  namespaces for `subprocess`);
- `egress`: an allow-list entry whose hostname does not resolve on this host (looked up now, not at the sandbox's
  first run), or an allow-list on a runtime that cannot enforce one (the process-group fallback, the container);
- `strict_caps`: `memory_mb`, `processes` or `disk_mb` asked to cap the sandbox as a whole where this host can
  cap each process alone (no cgroup can be made, no tmpfs for its files).

A bind that does not exist (`read_only`, `devices`) fails earlier still, when its Limits are made. Where `egress`
or `strict_caps` is set, the check opens one sandbox of the runtime, as a rollout would, and closes it (a few
milliseconds; the container runtime starts no container to open one): only an open sandbox says what it enforces.
"""

from __future__ import annotations

import asyncio
import contextlib

from tracegym.core.errors import UsageError
from tracegym.runtimes import cgroup
from tracegym.runtimes.egress import resolve
from tracegym.runtimes.sandbox import Limits, Runtime, RuntimeUnavailable, Sandbox

OPEN_TIMEOUT_S = 60.0
"""Longest the check waits for its sandbox to open (a container engine under load is slow, but not this slow)."""


async def check_sandbox(runtime: Runtime, per_run: list[Limits] | None = None) -> None:
    """UsageError naming the first of `runtime`'s settings this host cannot honour, its own limits' and those its
    programs run under (`per_run`): see the module."""
    if why := runtime.unavailable():
        raise UsageError(f"runtime {runtime.name!r} cannot run on this host: {why}")
    own = getattr(runtime, "limits", None)
    every = [limits for limits in [own, *(per_run or [])] if isinstance(limits, Limits)]
    for limits in every:
        await resolve(limits.egress)  # UsageError naming an entry that does not resolve
    if not any(limits.egress or limits.strict_caps for limits in every):
        return  # nothing more that only an open sandbox tells
    try:
        sandbox = await asyncio.wait_for(runtime.open(), OPEN_TIMEOUT_S)
    except RuntimeUnavailable as exc:
        raise UsageError(f"runtime {runtime.name!r}: {exc}") from None
    except TimeoutError:
        raise UsageError(f"runtime {runtime.name!r}: opening a sandbox to check its egress and strict_caps took over "
                         f"{OPEN_TIMEOUT_S:g} s") from None
    try:
        for limits in every:
            why = egress_refusal(sandbox, limits) or caps_refusal(sandbox, limits)
            if why:
                raise UsageError(f"runtime {runtime.name!r}: {why}")
    finally:
        with contextlib.suppress(Exception):
            await sandbox.close()


def egress_refusal(sandbox: Sandbox, limits: Limits) -> str | None:
    """Why `sandbox` cannot hold a program run under `limits` to its egress allow-list, or None."""
    cannot = getattr(sandbox, "cannot_egress", None)
    why = cannot() if limits.egress and cannot is not None else None
    return f"it cannot enforce egress {list(limits.egress)}: {why}" if why else None


def caps_refusal(sandbox: Sandbox, limits: Limits) -> str | None:
    """Why `sandbox` cannot honour `limits.strict_caps` (its memory, processes or files capped per process or not
    at all), or None (also when strict_caps is off)."""
    if not limits.strict_caps:
        return None
    inner = getattr(sandbox, "inner", sandbox)  # an admitted sandbox: the runtime's own
    if getattr(inner, "memory_scope", "sandbox") == "process":
        where = cgroup.placement()
        why = where if isinstance(where, str) else "making its cgroup failed"
        return (f"strict_caps: memory_mb={limits.memory_mb} and processes={limits.processes} cannot cap the "
                f"sandbox's processes together on this host, only each process alone: {why}")
    if not getattr(inner, "disk_capped", True):
        return (f"strict_caps: disk_mb={limits.disk_mb} cannot cap the sandbox's files on this host (their tmpfs "
                "needs root; see runtimes.workdir)")
    return None
