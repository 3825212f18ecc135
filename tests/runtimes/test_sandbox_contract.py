"""The Sandbox contract under every runtime this host has: output, stdin, a scrubbed environment, a fresh
working directory removed at close, start errors and the wall limit as data, and a clear error for a runtime
the host lacks."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from sandbox_helpers import runtimes

from tracegym.core.errors import ErrorKind, UsageError
from tracegym.runtimes.catalog import RUNTIMES, available_runtimes, runtime_for
from tracegym.runtimes.container import Container
from tracegym.runtimes.sandbox import Runtime, RuntimeUnavailable, Sandbox

PY = "python3"


@pytest.mark.parametrize("runtime", runtimes())
async def test_sandbox_runs_a_program_in_its_own_workdir(runtime: Runtime) -> None:
    sandbox = await runtime.open()
    assert isinstance(sandbox, Sandbox)
    try:
        assert list(sandbox.workdir.iterdir()) == []
        (sandbox.workdir / "data.txt").write_text("from the host")
        program = ("import os, sys; print(open('data.txt').read(), os.getcwd()); "
                   "print(sys.stdin.read().upper(), file=sys.stderr); open('out.txt', 'w').write('x')")
        result = await sandbox.run([PY, "-c", program], stdin=b"some input")
        assert result.ok, result
        assert result.stdout.split() == ["from", "the", "host", str(sandbox.workdir)]
        assert result.stderr.strip() == "SOME INPUT"
        assert (sandbox.workdir / "out.txt").read_text() == "x"
    finally:
        await sandbox.close()
    assert not sandbox.workdir.exists()
    await sandbox.close()  # closing twice is harmless


@pytest.mark.parametrize("runtime", runtimes())
async def test_sandbox_environment_has_nothing_of_the_hosts(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGYM_TEST_SECRET", "hunter2-host-secret")
    sandbox = await runtime.open()
    try:
        result = await sandbox.run(["env"], env={"GIVEN": "yes"})
        assert result.ok
        names = {line.split("=", 1)[0] for line in result.stdout.splitlines()}
        assert "hunter2" not in result.stdout and "TRACEGYM_TEST_SECRET" not in names
        assert {"PATH", "HOME", "GIVEN"} <= names
        assert not names & {n for n in os.environ if n not in ("PATH", "HOME", "LANG", "TMPDIR", "PWD")}
    finally:
        await sandbox.close()


@pytest.mark.parametrize("runtime", runtimes())
async def test_sandbox_start_error_and_failure_are_data(runtime: Runtime) -> None:
    sandbox = await runtime.open()
    try:
        missing = await sandbox.run(["no-such-program-xyz"])
        assert missing.start_error is not None and "no-such-program-xyz" in missing.start_error
        assert not missing.ok
        failed = await sandbox.run([PY, "-c", "import sys; print('bad', file=sys.stderr); sys.exit(3)"])
        assert (failed.exit_code, failed.limit, failed.start_error) == (3, None, None)
        assert failed.stderr.strip() == "bad"
    finally:
        await sandbox.close()


@pytest.mark.parametrize("runtime", runtimes())
async def test_sandbox_cancel_reaps_the_program(runtime: Runtime) -> None:
    sandbox = await runtime.open()
    try:
        run = asyncio.ensure_future(sandbox.run(["sleep", "30"]))
        await asyncio.sleep(0.5)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    finally:
        await sandbox.close()
    assert sandbox.sweep() == []  # type: ignore[attr-defined]


async def test_runtime_for_names_every_runtime_and_refuses_others() -> None:
    assert {runtime_for(name).name for name in RUNTIMES} == set(RUNTIMES)
    with pytest.raises(UsageError, match="unknown runtime 'docker'; known: subprocess, bubblewrap, container"):
        runtime_for("docker")
    assert set(available_runtimes()) == set(RUNTIMES)


async def test_a_runtime_the_host_lacks_says_which_and_why() -> None:
    container = Container(image="tracegym-no-such-image:none")  # no engine here, or no such image in its store
    reason = container.unavailable()
    assert reason is not None
    with pytest.raises(RuntimeUnavailable) as raised:
        await container.open()
    assert str(raised.value).startswith("runtime 'container' is unavailable on this host: ")
    assert reason in str(raised.value)
    assert raised.value.kind == ErrorKind.INFRASTRUCTURE


def test_on_linux_the_subprocess_runtime_is_available() -> None:
    assert runtime_for("subprocess").unavailable() is None or not sys.platform.startswith("linux")
