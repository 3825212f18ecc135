"""Task sandbox: one rollout's sandbox, opened on first use and closed at the rollout's cleanup, and the runner
of the task's sandboxed tools in it.

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
from collections.abc import Callable
from typing import Any, TypeVar

from tracegym.core.errors import ToolError, UsageError
from tracegym.runtimes.admission import Admission, admission
from tracegym.runtimes.sandbox import ProgramResult, Runtime, Sandbox

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


class TaskSandbox:
    """A rollout's sandbox of one runtime: opened once, on first use, through `admission` (the event loop's, see
    `runtimes.admission`: every rollout's sandbox passes this one gate, whatever runtime its task returns), closed
    by `close`; concurrent first uses share one opening. An open that fails raises (RuntimeUnavailable when the
    runtime cannot run here; SandboxRefused, SandboxSetupTimeout from admission): the rollout fails, not its
    siblings."""

    def __init__(self, runtime: Runtime, admission: Admission | None = None) -> None:
        self.runtime, self.admission = runtime, admission
        self._sandbox: Sandbox | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Sandbox:
        async with self._lock:
            if self._sandbox is None:
                self._sandbox = await (self.admission or admission()).open(self.runtime)
            return self._sandbox

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
