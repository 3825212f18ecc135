"""Harness: what drives a rollout after its setup: tracegym's own turn loop (`Task.harness = None`, the default) or
an agent program (`ProgramHarness`) run in the rollout's sandbox, whose model calls come through the
interception proxy.

A program harness is the rollout's turn machinery for a program that owns its loop: its stages are timed spans
on the same trace (`setup:program`, `program`, and one `model` span per call), its failures are classified as the
loop's are, and the rollout's own timeouts bound it. The program's exit status, its bounded stdout and stderr,
and the files it left in its working directory are the task's `program` (a `ProgramRun`) for rewards to read;
the directory is removed after scoring.

Any CLI agent plugs in through the command template: each argument (and each `env` value) may name
`{prompt}` (the task's last user message), `{model}`, `{workdir}` and `{task_key}`; an `env` value may also name
`{base_url}` and `{api_key}` (the proxy), which a command argument may not: the key (also in the base URL's path)
reaches the program through its environment only, never its command line, which other processes can read in
/proc. The program also gets `OPENAI_BASE_URL`, `OPENAI_API_KEY` and `OPENAI_MODEL`, which the
OpenAI SDKs read, plus `TRACEGYM_PROMPT`, `TRACEGYM_MESSAGES` (the task's prompt as OpenAI messages, JSON) and
`TRACEGYM_TASK_KEY` (the rollout's task key). It runs without network: `127.0.0.1` at the proxy's port is carried
to the proxy and nowhere else (see ProgramHarness).
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tracegym.core.errors import StageTimeout, TaskError, UsageError
from tracegym.core.trace import StopReason
from tracegym.envs.proxy import InterceptionProxy, ProxyLease
from tracegym.envs.task_sandbox import how_it_failed
from tracegym.runtimes.sandbox import Limits, ProgramResult, RuntimeUnavailable, Sandbox

if TYPE_CHECKING:
    from tracegym.envs.rollout import Rollout
    from tracegym.envs.task import Task

PLACEHOLDERS = ("prompt", "base_url", "api_key", "model", "workdir", "task_key")
"""The names a command template may use (`{prompt}`, ...)."""
_BEFORE_THE_PROXY = ("prompt", "model", "workdir", "task_key")
"""The names a setup command may use (it runs before the proxy has a key for the rollout)."""
KEYED = ("api_key", "base_url")
"""The names that carry the rollout's proxy key (the base URL holds it in its path): environment only."""
WALL_GRACE_S = 10.0
"""How long past its wall limit the program stage waits for the runtime to end the program itself."""

Files = Callable[["Task[Any, Any]"], Mapping[str, str | bytes]]
"""What to install in a rollout's working directory: relative path -> text or bytes, from its task."""


class Harness(Protocol):
    """Drives one rollout after `Task.setup`: records its turns and errors on `rollout.trace` and says why it ended."""

    async def drive(self, rollout: Rollout) -> StopReason:
        """Run the rollout; errors it records itself, or raises to be recorded at the rollout's current stage."""
        ...


@dataclass
class ProgramRun:
    """One rollout's agent program, as rewards see it (`task.program`): its working directory (until the
    rollout's cleanup), how the setup command and the program ended, and how many model calls it made."""

    sandbox: Sandbox
    setup: ProgramResult | None = None
    result: ProgramResult | None = None
    """None until the program ended on its own or by a limit (a rollout ended by a failed call has none)."""
    calls: int = 0

    @property
    def workdir(self) -> Path:
        """The program's working directory on the host."""
        return self.sandbox.workdir

    @property
    def exit_code(self) -> int | None:
        """The program's exit status (None: it has not ended, did not start, or a signal ended it)."""
        return self.result.exit_code if self.result is not None else None

    def file(self, name: str) -> str | None:
        """The text of a regular file the program left in its working directory (its first 16 MiB, never through
        a link: `Sandbox.read_file`); None when there is none."""
        data = self.sandbox.read_file(name)
        return None if data is None else data.decode(errors="replace")


@dataclass(frozen=True)
class ProgramHarness:
    """Run `command` (a template, see the module) in each rollout's sandbox (`Task.sandbox()`: a fresh one of the
    task's `runtime()`, closed by its cleanup after scoring).

    `files` are installed in the working directory and `setup` (a command) is run there first, both in the
    rollout's `setup:program` stage (under `Timeouts.setup`). The program runs under `limits`:
    `limits.wall_seconds` is its time limit; `limits.network` is off by default: the program reaches the proxy
    all the same, at 127.0.0.1 on its own loopback, which the sandbox carries to the proxy's Unix socket and
    nowhere else (so it cannot reach the model server's admin routes or the env server). A runtime that cannot
    carry it (`Sandbox.cannot_forward`) fails at `setup:program` saying so."""

    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Files | None = None
    setup: Sequence[str] = ()
    limits: Limits = field(default_factory=lambda: Limits(wall_seconds=600.0))

    def __post_init__(self) -> None:
        if isinstance(self.command, str) or not self.command:
            raise UsageError(f"harness command must be a non-empty list of arguments, not {self.command!r}")
        _check_template("harness command", self.command, PLACEHOLDERS)
        _refuse_keys_on_argv(self.command)
        _check_template("harness env", list(self.env.values()), PLACEHOLDERS)
        _check_template("harness setup", self.setup, _BEFORE_THE_PROXY)

    async def drive(self, rollout: Rollout) -> StopReason:
        """Prepare the sandbox (`setup:program`), run the program with a proxy lease (`program`), and end as the
        program did; see the module for what a program is told."""
        run = await rollout.timed("setup:program", self._prepare(rollout), rollout.timeouts.setup)
        async with InterceptionProxy.shared().lease(rollout) as lease:
            try:
                run.result = await rollout.timed("program", self._run(rollout, run, lease),
                                                 self.limits.wall_seconds + WALL_GRACE_S)
            except Exception as exc:  # the program stage's own failure (model calls record theirs)
                rollout.error_from(exc, "program")
                return StopReason.after(exc)
            finally:
                run.calls = lease.calls
            if lease.ended.done():  # a call's failure ended the rollout (recorded at its stage)
                return lease.ended.result()
            truncated = lease.truncated
        return _ending(rollout, run, truncated)

    # --- stages ------------------------------------------------------------------------------------------
    async def _prepare(self, rollout: Rollout) -> ProgramRun:
        run = ProgramRun(await rollout.task.sandbox())  # the task's runtime; closed by the task's cleanup
        rollout.task.program = run
        sandbox = run.sandbox
        unreachable = sandbox.cannot_forward()
        if unreachable and not self.limits.network:
            raise RuntimeUnavailable(f"the program cannot reach the interception proxy: {unreachable}")
        if self.files is not None:
            install(sandbox, self.files(rollout.task))
        if self.setup:
            values = _values(rollout, sandbox, None)
            limits = self.limits.model_copy(update={"wall_seconds": rollout.timeouts.setup})
            run.setup = await sandbox.run([_fill(part, values) for part in self.setup], env=_env(values),
                                          limits=limits)
            if not run.setup.ok:
                raise TaskError(f"the setup command {_fill(self.setup[0], values)!r} {how_it_failed(run.setup)}")
        return run

    async def _run(self, rollout: Rollout, run: ProgramRun, lease: ProxyLease) -> ProgramResult | None:
        """The program's result; None when a call's failure ended the rollout first (the program is then
        cancelled, which reaps its process tree)."""
        values = _values(rollout, run.sandbox, lease)
        argv = [_fill(part, values) for part in self.command]
        env = {**_env(values), **{name: _fill(value, values) for name, value in self.env.items()}}
        program = asyncio.create_task(run.sandbox.run(argv, env=env, limits=self.limits, forward=lease.forward))
        either: set[asyncio.Future[Any]] = {program, lease.ended}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not program.done():
                program.cancel()
            await asyncio.gather(program, return_exceptions=True)
        return None if program.cancelled() else program.result()



def _ending(rollout: Rollout, run: ProgramRun, truncated: bool) -> StopReason:
    """Why the rollout ended, from how its program did: on its own after calling the model is a normal end
    (its exit status is the rewards' to judge); not starting, a limit, a signal, or no model call is an error."""
    result = run.result
    assert result is not None
    if result.limit == "wall":
        said = f"the program ran past its time limit (stopped after {result.duration_s:.1f} s)"
        rollout.error_from(StageTimeout(said), "program")
        return StopReason.TIMEOUT
    if result.start_error is not None or result.limit is not None or result.signal is not None:
        rollout.error_from(TaskError(f"the program {how_it_failed(result)}"), "program")
        return StopReason.ERROR
    if run.calls == 0:
        rollout.error_from(TaskError(f"the program never called the model: it {how_it_failed(result)}"), "program")
        return StopReason.ERROR
    return StopReason.TRUNCATED if truncated else StopReason.COMPLETED


def install(sandbox: Sandbox, files: Mapping[str, str | bytes]) -> None:
    """Write `files` into the sandbox's working directory (`Sandbox.write_file`: owned as the directory is, never
    through a link); a path that is absolute or leaves the directory, or that the directory cannot take, is a
    TaskError."""
    for name, content in files.items():
        try:
            sandbox.write_file(name, content)
        except (ValueError, OSError) as exc:
            raise TaskError(f"task file {name!r} cannot be installed: {exc}") from None


# --- the program's arguments and environment ---------------------------------------------------------------
def _values(rollout: Rollout, sandbox: Sandbox, lease: ProxyLease | None) -> dict[str, str]:
    """What the template names stand for in this rollout (the proxy's two only once it has a lease)."""
    prompt = rollout.task.prompt()
    users = [m for m in prompt if m.role == "user"]
    values = {"prompt": users[-1].text if users else "", "model": rollout.model.name,
              "workdir": str(sandbox.workdir), "task_key": rollout.trace.task_key,
              "messages": json.dumps([m.to_openai() for m in prompt])}
    if lease is not None:
        values |= {"base_url": lease.base_url, "api_key": lease.key}
    return values


def _env(values: Mapping[str, str]) -> dict[str, str]:
    env = {"OPENAI_MODEL": values["model"], "TRACEGYM_PROMPT": values["prompt"],
           "TRACEGYM_MESSAGES": values["messages"], "TRACEGYM_TASK_KEY": values["task_key"]}
    if "base_url" in values:
        env |= {"OPENAI_BASE_URL": values["base_url"], "OPENAI_API_KEY": values["api_key"]}
    return env


def _fill(template: str, values: Mapping[str, str]) -> str:
    return template.format_map(values)


def _refuse_keys_on_argv(command: Sequence[str]) -> None:
    """A UsageError for a command argument naming the proxy's key (`{api_key}`, or `{base_url}`, which holds it)."""
    for part in command:
        named = [name for _, name, _, _ in string.Formatter().parse(part) if name in KEYED]
        if named:
            raise UsageError(
                f"harness command: {part!r} names {{{named[0]}}}, which carries the rollout's proxy key; a command "
                f"line is readable by other processes (/proc/PID/cmdline), so the key reaches the program through "
                f"its environment only: have it read OPENAI_API_KEY and OPENAI_BASE_URL (always set), or name "
                f"{{{named[0]}}} in `env` (e.g. env={{'AGENT_API_KEY': '{{api_key}}'}})")


def _check_template(what: str, parts: Sequence[str], known: Sequence[str]) -> None:
    """A UsageError naming the first placeholder of `parts` that is not `known` (or a malformed one)."""
    for part in parts:
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(part) if name is not None]
        except ValueError as exc:
            raise UsageError(f"{what}: {part!r} is not a valid template ({exc}; write {{{{ for a brace)") from None
        for name in names:
            if name not in known:
                raise UsageError(f"{what}: {part!r} names {{{name}}}; known: "
                                 f"{', '.join('{' + k + '}' for k in known)}")
