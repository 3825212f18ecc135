"""Task sandbox: one rollout's sandbox, opened on first use and closed at the rollout's cleanup, the runner
of the task's sandboxed tools in it, and the check before any rollout that it can run here (`check_taskset`).

A tool opts in with `@sandboxed`: its call then runs in the rollout's runtime (`Task.runtime()`), not in the
worker process. Its source is sent there and run by the sandbox's `python3`, so a sandboxed tool is
self-contained: a plain function whose imports are inside its body and reach only what that interpreter has,
whose arguments and result are JSON. Its limits are the runtime's; breaking one is the tool's error, which the
model is told, as for any tool.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import secrets
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tracegym.core.errors import ToolError, UsageError
from tracegym.runtimes.admission import Admission, admission
from tracegym.runtimes.preflight import caps_refusal, check_sandbox
from tracegym.runtimes.sandbox import (
    Forward,
    Limits,
    ProgramResult,
    Runtime,
    RuntimeUnavailable,
    Sandbox,
)
from tracegym.runtimes.workdir import READ_CAP_BYTES

if TYPE_CHECKING:
    from tracegym.envs.taskset import Taskset

F = TypeVar("F", bound=Callable[..., Any])
SANDBOXED = "__tracegym_sandboxed__"
"""The attribute `@sandboxed` sets on a tool: the tool's source, decorators removed."""
RUNNER = """\
import json, sys
{source}
_arguments = json.loads(sys.stdin.read())
_result = {name}(**_arguments)
sys.stdout.write({sentinel!r} + json.dumps(_result, default=str))
"""


def sandboxed(fn: F) -> F:
    """Mark a tool to run in the rollout's sandbox (see the module docstring); its source is read here, so a
    tool that cannot run there (no source, async) is a UsageError at import time, not at the first call."""
    if inspect.iscoroutinefunction(fn):
        raise UsageError(f"sandboxed tool {fn.__name__!r} is async; a sandboxed tool is a plain function")
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError) as exc:
        raise UsageError(f"sandboxed tool {fn.__name__!r}: its source cannot be read ({exc})") from None
    function = next((node for node in tree.body if isinstance(node, ast.FunctionDef)), None)
    if function is None or function.name != fn.__name__:
        raise UsageError(f"sandboxed tool {fn.__name__!r} is not a plain `def` function")
    function.decorator_list = []
    setattr(fn, SANDBOXED, ast.unparse(function))
    return fn


def sandboxed_source(fn: Callable[..., Any]) -> str | None:
    """The source `@sandboxed` recorded for `fn`, or None when it runs in the worker."""
    return getattr(fn, SANDBOXED, None)


REFUSED_METRIC = "sandbox_refused_connections"
"""The trace metric of what a rollout's sandbox refused (the `sandbox_probe` tripwire reads it)."""


class TalliedSandbox:
    """A rollout's sandbox that adds up, over its program runs, what their network namespaces refused."""

    def __init__(self, inner: Sandbox) -> None:
        self.inner = inner
        self.refused: int | None = None
        """The runs' `refused_connections` added up; None while no run had a namespace that counts them."""

    @property
    def workdir(self) -> Path:
        return self.inner.workdir

    def write_file(self, name: str, content: str | bytes) -> None:
        self.inner.write_file(name, content)

    def read_file(self, name: str, cap: int = READ_CAP_BYTES) -> bytes | None:
        return self.inner.read_file(name, cap)

    def cannot_forward(self) -> str | None:
        return self.inner.cannot_forward()

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                  limits: Limits | None = None, forward: Forward | None = None) -> ProgramResult:
        result = await self.inner.run(argv, env=env, stdin=stdin, limits=limits, forward=forward)
        if result.refused_connections is not None:
            self.refused = (self.refused or 0) + result.refused_connections
        return result

    async def close(self) -> None:
        await self.inner.close()


class TaskSandbox:
    """A rollout's sandbox of one runtime: opened once, on first use, through `admission` (the event loop's, see
    `runtimes.admission`: every rollout's sandbox passes this one gate, whatever runtime its task returns), closed
    by `close`; concurrent first uses share one opening. An open that fails raises (RuntimeUnavailable when the
    runtime cannot run here; SandboxRefused, SandboxSetupTimeout from admission): the rollout fails, not its
    siblings."""

    def __init__(self, runtime: Runtime, admission: Admission | None = None) -> None:
        self.runtime, self.admission = runtime, admission
        self._sandbox: TalliedSandbox | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Sandbox:
        async with self._lock:
            if self._sandbox is None:
                sandbox = await (self.admission or admission()).open(self.runtime)
                limits = getattr(self.runtime, "limits", None)
                if isinstance(limits, Limits) and (why := caps_refusal(sandbox, limits)):
                    await sandbox.close()
                    raise RuntimeUnavailable(f"runtime {self.runtime.name!r}: {why}")
                self._sandbox = TalliedSandbox(sandbox)
            return self._sandbox

    def records(self) -> dict[str, float]:
        """What the sandbox saw its programs do outside the task, as trace metrics: `sandbox_refused_connections`
        (connections and datagrams its network namespaces refused: a program probing hosts it was not given);
        empty before it opened, or where no run had a network namespace to count in."""
        if self._sandbox is None or self._sandbox.refused is None:
            return {}
        return {REFUSED_METRIC: float(self._sandbox.refused)}

    async def close(self) -> None:
        async with self._lock:
            if self._sandbox is not None:
                await self._sandbox.close()
                self._sandbox = None

    async def call_tool(self, fn: Callable[..., Any], **arguments: Any) -> Any:
        """Run sandboxed tool `fn` on `arguments` in the sandbox; its result, or a ToolError saying how it failed."""
        source = sandboxed_source(fn)
        assert source is not None, "call_tool runs only @sandboxed tools"
        sentinel = f"\n<<tracegym-tool-result-{secrets.token_hex(8)}>>"
        program = RUNNER.format(source=source, name=fn.__name__, sentinel=sentinel)
        sandbox = await self.get()
        result = await sandbox.run(["python3", "-c", program], stdin=json.dumps(arguments).encode())
        if result.ok and sentinel in result.stdout:
            return json.loads(result.stdout.rsplit(sentinel, 1)[1])
        raise ToolError(f"sandboxed tool {fn.__name__!r} {how_it_failed(result)}")


def how_it_failed(result: ProgramResult) -> str:
    """One line saying how a program run went wrong, with the end of its stderr."""
    if result.start_error:
        return f"could not start: {result.start_error}"
    if result.limit:
        what = f"broke the sandbox's {result.limit} limit"
    elif result.signal:
        what = f"was killed by signal {result.signal}"
    else:
        what = f"exited with status {result.exit_code}"
    tail = result.stderr.strip().splitlines()[-3:]
    return what + (": " + " | ".join(tail) if tail else "")


def check_taskset(taskset: Taskset) -> None:
    """`check_taskset_async` from outside an event loop."""
    asyncio.run(check_taskset_async(taskset))


async def check_taskset_async(taskset: Taskset) -> None:
    """UsageError, naming the taskset and the setting at fault, when the sandbox its tasks use cannot run on this
    host as asked (`runtimes.preflight.check_sandbox`); nothing when its tasks use none."""
    found = sandbox_of(taskset)
    if found is None:
        return
    runtime, per_run = found
    try:
        await check_sandbox(runtime, per_run)
    except UsageError as exc:
        raise UsageError(f"taskset {taskset.id!r}: {exc}") from None


def sandbox_of(taskset: Taskset) -> tuple[Runtime, list[Limits]] | None:
    """The runtime of `taskset`'s first task and the limits its programs run under besides the runtime's own (an
    agent program's), or None when its tasks use no sandbox: a task class that chooses no runtime
    (`Task.runtime`), runs no agent program (`Task.harness`) and offers no `@sandboxed` tool. The first task
    stands for all (a runtime chosen per row is checked at its rollout's setup); a taskset with no row, or whose
    first task cannot be built, is not checked (each rollout records its own failure)."""
    from tracegym.envs.task import Task  # the task module imports this one

    try:
        task = taskset.task(taskset[0])
    except Exception:
        return None
    if not isinstance(task, Task):
        return None
    harness_limits = getattr(task.harness, "limits", None)
    sandboxed = any(getattr(task.tool(spec.name), "sandboxed", False) for spec in task.tool_specs())
    chosen = type(task).runtime is not Task.runtime or task.runtime_override is not None
    if not chosen and harness_limits is None and not sandboxed:
        return None
    return task.sandbox_runtime(), [harness_limits] if isinstance(harness_limits, Limits) else []
