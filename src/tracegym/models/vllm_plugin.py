"""vLLM plugin: what tracegym changes inside the processes of a vLLM it starts (registered as a
`vllm.general_plugins` entry point, which vLLM loads in its API server, engine core and workers alike).

It acts only where the server's environment asks (`QUEUE_SPIN_ENV`, set by `server_env`), so any other vLLM in
the same environment runs untouched. The one change: how long a reader of vLLM's shared-memory message queues
spins before it sleeps on the queue's notification socket. vLLM spins for 1 s after each read (a loop of
`sched_yield`), so while a CPU-build worker computes a decode step the engine core, waiting for its output,
keeps a second core busy. Beside a trainer on that core it took a third of it; alone it burnt the whole core
for nothing (`benchmarks/vllm_queue_spin.py`: 0.97 cores at 1 s, 0.02 at 0 s, with the same generation speed).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

QUEUE_SPIN_ENV = "TRACEGYM_VLLM_QUEUE_SPIN_S"
"""Seconds a reader of vLLM's message queues spins after a read before it sleeps (vLLM's own: 1)."""

log = logging.getLogger("vllm.tracegym")
"""A child of vLLM's logger, so its lines reach the server's log as vLLM's own do (with the process named)."""


def register() -> None:
    """vLLM's entry point (once per process): apply the settings the environment names."""
    spin = os.environ.get(QUEUE_SPIN_ENV)
    if spin is not None:
        set_queue_spin(float(spin))


def set_queue_spin(seconds: float) -> None:
    """Make every message-queue reader created from now on in this process spin `seconds` before it sleeps."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    vllm_init = getattr(SpinCondition.__init__, "__wrapped__", SpinCondition.__init__)

    @functools.wraps(vllm_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        vllm_init(self, *args, **{**kwargs, "busy_loop_s": seconds})

    SpinCondition.__init__ = init
    log.info("tracegym: message-queue readers spin %s s before they sleep", seconds)
