"""vLLM plugin: what tracegym changes inside the processes of a vLLM it starts (registered as a `vllm.general_plugins`
entry point, which vLLM loads in its API server, engine core and workers alike).

It acts only where the server's environment asks (`QUEUE_SPIN_ENV`, set by `server_env`), so any other vLLM in the
same environment runs untouched. What it changes: how long a reader of vLLM's shared-memory message queues spins
before it sleeps on the queue's notification socket, and how often it rechecks while asleep (`RECHECK_MS`). vLLM
spins for 1 s after each read (a loop of `sched_yield`), so while a CPU-build worker computes a decode step the
engine core, waiting for its output, keeps a second core busy: alone it burnt that whole core (0.96-0.97 cores at 1
s, 0.02 at 0, for generation 2-5% faster), and beside a one-thread load on that core it took 0.36-0.47 of it (the
load got 0.51-0.63 of a core, against 0.99-1.0 at 0; `benchmarks/vllm_queue_spin.py`). In the `tracegym rl` loop,
where the trainer is that load, a step with both sides compiled took 4.9-5.2 s, against 5.2-6.1 s before.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

QUEUE_SPIN_ENV = "TRACEGYM_VLLM_QUEUE_SPIN_S"
"""Seconds a reader of vLLM's message queues spins after a read before it sleeps (vLLM's own: 1)."""

RECHECK_MS = 5
"""How often a sleeping reader looks at the queue without being woken (vLLM's: every 5 s). A reader that sleeps
relies on the writer's notification, and vLLM's notification socket drops one now and then (its send queue holds
one message, and a slot frees only once the reader's side has caught up): at 0 s of spin about 1% of messages
waited for the next one or for the recheck, which stalled a `tracegym rl` step by seconds. vLLM's 1 s spin hides
that; a 5 ms recheck bounds it (p99 5.2 ms, max 5.9 ms; `benchmarks/vllm_queue_spin.py`), at a wake-up every 5 ms
while the queue is idle."""


def register() -> None:
    """vLLM's entry point (once per process): apply the settings the environment names."""
    spin = os.environ.get(QUEUE_SPIN_ENV)
    if spin is not None:
        set_queue_spin(float(spin))


def set_queue_spin(seconds: float) -> None:
    """Make every message-queue reader created from now on in this process spin `seconds` before it sleeps, and
    wake every `RECHECK_MS` while it sleeps."""
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = RECHECK_MS

    vllm_init = getattr(SpinCondition.__init__, "__wrapped__", SpinCondition.__init__)

    @functools.wraps(vllm_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        vllm_init(self, *args, **{**kwargs, "busy_loop_s": seconds})

    SpinCondition.__init__ = init  # type: ignore[method-assign]  # patching vLLM's class is the point
    # on stderr, not vLLM's logger: that one can be configured away (and was, in a CI run), this line must show
    print(f"tracegym (pid {os.getpid()}): message-queue readers spin {seconds} s before they sleep", file=sys.stderr,
          flush=True)
