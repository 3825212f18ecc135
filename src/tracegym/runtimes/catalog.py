"""Catalog: the runtimes by name (`subprocess`, `bubblewrap`, `container`, and `process-group`: the subprocess
runtime without namespaces, which runs only when asked for by this name), each built with the limits its programs
run under."""

from __future__ import annotations

from collections.abc import Callable

from tracegym.core.errors import UsageError
from tracegym.runtimes.bubblewrap import Bubblewrap
from tracegym.runtimes.container import Container
from tracegym.runtimes.limited_process import FALLBACK, LimitedProcess
from tracegym.runtimes.sandbox import Limits, Runtime

RUNTIMES: dict[str, Callable[[Limits], Runtime]] = {
    "subprocess": LimitedProcess,
    "bubblewrap": Bubblewrap,
    "container": Container,
    FALLBACK: lambda limits: LimitedProcess(limits, isolation=FALLBACK),
}
"""Every runtime name and what builds it."""


def runtime_for(name: str, limits: Limits | None = None) -> Runtime:
    """The runtime called `name`, its sandboxes' programs under `limits`. An unknown name is a UsageError listing
    the known ones; a runtime this host lacks is still returned: its `unavailable()` says why, and its `open()`
    raises RuntimeUnavailable naming it."""
    try:
        make = RUNTIMES[name]
    except KeyError:
        raise UsageError(f"unknown runtime {name!r}; known: {', '.join(RUNTIMES)}") from None
    return make(limits or Limits())


def available_runtimes() -> dict[str, str | None]:
    """Each runtime's name and why this host cannot run it (None: it can)."""
    return {name: make(Limits()).unavailable() for name, make in RUNTIMES.items()}
