"""A run ends when its program does: a child that keeps the program's stdout open does not hold the run (the
outside audit saw the process-group fallback wait 15 s for one, and report no limit); it is killed and counted."""

from __future__ import annotations

import secrets

import pytest
from runtime_helpers import wait_until
from sandbox_helpers import QUICK, processes_with, runtimes

from tracegym.runtimes.sandbox import Runtime

WALL_S = 20.0
"""Far past what the program takes, and far short of what its child would hold the pipe for."""


@pytest.mark.parametrize("runtime", runtimes(QUICK.model_copy(update={"wall_seconds": WALL_S})))
async def test_a_run_returns_when_its_program_exits_though_a_child_holds_its_output(runtime: Runtime) -> None:
    token = secrets.token_hex(8)
    holder = f"python3 -c 'import time; time.sleep(60)' {token} &"
    box = await runtime.open()
    try:
        result = await box.run(["sh", "-c", f"{holder} echo started"])
        assert result.ok and result.stdout.strip() == "started", result
        assert result.limit is None and result.left_running == 1 and result.duration_s < WALL_S, result
        assert wait_until(lambda: not processes_with(token), 5), "the child holding the output outlived the run"
    finally:
        await box.close()
