"""Malloc: the memory allocator a trainer process runs with (tcmalloc where the machine has it).

torch on CPU allocates and frees a micro-batch's activations every step. glibc's malloc raises its mmap threshold
after the first large frees, so later activations come from its heap and their pages stay mapped when freed:
the process keeps every step's peak, and reuse still faults pages in. tcmalloc keeps freed pages for reuse
without that growth. A reverse-text step of SmolLM2-135M (16 samples, float32, LoRA) measured 2.71 s and 1.98 GB
peak RSS under tcmalloc against 3.26 s and 2.81 GB under glibc (`benchmarks/trainer_step.py`); fixing glibc's
threshold instead cut the memory but made the step 1.6x slower (5.3 s). The library is preloaded
(`LD_PRELOAD`), so it applies to a process that is about to start, not to the running one.
"""

from __future__ import annotations

import ctypes.util
import os
from typing import Literal

Malloc = Literal["tcmalloc", "system"]
LIBRARIES = ("tcmalloc_minimal", "tcmalloc")
"""tcmalloc's library names, the one without the heap profiler first (Debian: `libtcmalloc-minimal4`)."""


def tcmalloc_library() -> str | None:
    """The name the dynamic linker finds tcmalloc by (e.g. `libtcmalloc_minimal.so.4`), or None where it is not
    installed."""
    return next((found for name in LIBRARIES if (found := ctypes.util.find_library(name))), None)


def malloc_env(malloc: Malloc, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) for a process that should run with `malloc`: tcmalloc prepended to
    `LD_PRELOAD` where installed and not preloaded already; unchanged for `system` or where it is missing."""
    env = dict(os.environ if env is None else env)
    return env | preload(malloc, env.get("LD_PRELOAD", ""))


def preload(malloc: Malloc, preloaded: str = "") -> dict[str, str]:
    """The `LD_PRELOAD` entry that gives a process started with `preloaded` the `malloc` allocator; empty when
    there is nothing to add."""
    library = tcmalloc_library() if malloc == "tcmalloc" else None
    if not library or "tcmalloc" in preloaded:
        return {}
    return {"LD_PRELOAD": f"{library}:{preloaded}" if preloaded else library}
