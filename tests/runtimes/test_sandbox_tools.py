"""Per-tool opt-in: a `@sandboxed` tool of a Task runs in the rollout's sandbox (another process, in the sandbox's
working directory, under its limits), a plain tool beside it in the worker; the sandbox closes with the rollout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tracegym as tg
from tracegym.core.errors import ErrorKind, UsageError
from tracegym.envs.task_sandbox import sandboxed
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.sandbox import Limits, Runtime
from tracegym.testing import ScriptedModel
from tracegym.testing.script import reply, tool_call


@sandboxed
def where_sandboxed(note: str) -> dict:
    """Say which process runs this tool.

    Args:
        note: Echoed back.
    """
    import os

    return {"pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd(), "note": note}


def where_worker(note: str) -> dict:
    """Say which process runs this tool.

    Args:
        note: Echoed back.
    """
    return {"pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd(), "note": note}


@sandboxed
def spin(seconds: float) -> str:
    """Busy-wait.

    Args:
        seconds: How long.
    """
    while True:
        pass


class ToolTask(tg.Task):
    tools = (where_sandboxed, where_worker, spin)

    def runtime(self) -> Runtime:
        return runtime_for("subprocess", Limits(wall_seconds=1.5, cpu_seconds=5))


async def test_a_sandboxed_tool_runs_in_the_rollouts_sandbox_and_a_plain_one_in_the_worker() -> None:
    script = [reply(None, tool_call("where_sandboxed", {"note": "in"}), tool_call("where_worker", {"note": "out"})),
              reply(None, tool_call("spin", {"seconds": 9})), "done"]
    taskset = tg.Taskset(id="tools", data=[tg.TaskData(prompt="Where?")])
    taskset.task_class = ToolTask
    [trace] = await tg.evaluate(taskset, ScriptedModel(script), num_tasks=1, rollouts=1)
    inside, outside, spun = (json.loads(m.text) if m.text.startswith("{") else m.text
                             for m in trace.completion if m.role == "tool")
    assert outside == {"pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd(), "note": "out"}
    assert inside["note"] == "in" and inside["pid"] != os.getpid()
    assert Path(inside["cwd"]).parent.name.startswith("tracegym-sandbox-")  # <temp>/tracegym-sandbox-<id>/work
    assert not Path(inside["cwd"]).exists(), "the rollout's sandbox outlived its cleanup"
    if os.geteuid() == 0:
        assert inside["uid"] != 0
    assert spun.startswith("Error: ToolError: sandboxed tool 'spin' broke the sandbox's ")
    assert [(e.kind, e.stage) for e in trace.errors] == [(ErrorKind.TOOL, "tool:spin")]
    assert trace.stop_reason == tg.StopReason.COMPLETED


def test_a_tool_that_cannot_be_sandboxed_is_refused_at_import() -> None:
    with pytest.raises(UsageError, match="sandboxed tool 'coroutine' is async"):
        @sandboxed
        async def coroutine(x: int) -> int:
            """Nothing.

            Args:
                x: A number.
            """
            return x
    with pytest.raises(UsageError, match="sandboxed tool 'len': its source cannot be read"):
        sandboxed(len)


async def test_the_readmes_sandboxed_tool_runs_as_printed(tmp_path: Path) -> None:
    import importlib.util
    import re

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL) if "@sandboxed" in block)
    (tmp_path / "readme_tool.py").write_text(code)  # a module of its own, as a user's would be (source readable)
    spec = importlib.util.spec_from_file_location("readme_tool", tmp_path / "readme_tool.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Snippet(tg.Task):
        tools = (module.run_python,)

    script = [reply(None, tool_call("run_python", {"code": "import os; print(6 * 7, os.getcwd())"})), "done"]
    taskset = tg.Taskset(id="snippet", data=[tg.TaskData(prompt="Run it.")])
    taskset.task_class = Snippet
    [trace] = await tg.evaluate(taskset, ScriptedModel(script), num_tasks=1, rollouts=1)
    [answer] = [m.text for m in trace.completion if m.role == "tool"]
    assert answer.startswith("42 ") and "tracegym-sandbox-" in answer and trace.errors == []


@sandboxed
def probe(address: str) -> str:
    """Try to reach a host.

    Args:
        address: HOST:PORT.
    """
    import socket

    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return "reached"
    except OSError as exc:
        return type(exc).__name__


class ProbeTask(tg.Task):
    tools = (probe, where_sandboxed)

    def runtime(self) -> Runtime:
        return runtime_for("subprocess", Limits(wall_seconds=10, cpu_seconds=5))


async def run_probe(*addresses: str) -> tg.Trace:
    calls = [tool_call("probe", {"address": a}) for a in addresses] or [tool_call("where_sandboxed", {"note": ""})]
    script = [reply(None, *calls), "done"]
    taskset = tg.Taskset(id="probes", data=[tg.TaskData(prompt="Probe.")])
    taskset.task_class = ProbeTask
    [trace] = await tg.evaluate(taskset, ScriptedModel(script), num_tasks=1, rollouts=1)
    return trace


@pytest.mark.skipif(os.geteuid() != 0, reason="the subprocess runtime has a network namespace only as root")
async def test_a_sandboxed_program_reaching_outside_its_task_is_counted_on_the_trace() -> None:
    trace = await run_probe("10.255.255.1:80", "127.0.0.1:9")  # no route out; the host's loopback is not its own
    assert trace.metrics["sandbox_refused_connections"] == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="the subprocess runtime has a network namespace only as root")
async def test_a_sandboxed_program_that_stays_inside_counts_no_refusal() -> None:
    trace = await run_probe()
    assert trace.metrics["sandbox_refused_connections"] == 0
