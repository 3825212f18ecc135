"""How a sandbox's run starts, kept cheap without changing what it runs: the program init as code compiled once
(its source where that cannot be), the wrapper started as the sandbox's own host uid through setpriv, and the
program looked up in the sandbox's PATH as `os.execvp` does."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator

import pytest
from sandbox_helpers import QUICK, runtimes

from tracegym.runtimes import process_sandbox
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.sandbox import Runtime, Sandbox


@pytest.fixture(params=[p for p in runtimes() if p.id != "container"])  # type: ignore[attr-defined]
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    runtime: Runtime = request.param
    box = await runtime.open()
    try:
        yield box
    finally:
        await box.close()


@pytest.fixture
def uncached_init() -> Iterator[None]:
    """`init_code` computed afresh in the test, and again after it."""
    process_sandbox.init_code.cache_clear()
    yield
    process_sandbox.init_code.cache_clear()


def test_the_init_is_code_compiled_by_the_sandboxs_python(uncached_init: None) -> None:
    code = process_sandbox.init_code()
    assert code.startswith("import binascii,marshal;exec(marshal.loads(")
    assert "def main()" not in code  # no source in it: nothing to compile per run


def test_the_init_runs_from_its_source_where_the_sandboxs_python_cannot_compile_it(
        uncached_init: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(process_sandbox, "sandbox_python", lambda: "/nonexistent/python3")
    with caplog.at_level(logging.WARNING):
        assert process_sandbox.init_code() == process_sandbox.INIT_SOURCE
    assert "/nonexistent/python3 could not compile it" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox has a host uid of its own only where we are root")
async def test_the_bubblewrap_wrapper_runs_as_the_sandboxs_own_host_uid() -> None:
    runtime = runtime_for("bubblewrap", QUICK)
    if reason := runtime.unavailable():
        pytest.skip(reason)
    box = await runtime.open()
    try:
        result = await box.run(["touch", "made"])
        owner = (box.workdir / "made").stat().st_uid
    finally:
        await box.close()
    assert result.exit_code == 0, result
    assert owner == box.uid  # type: ignore[attr-defined]  # a wrapper started as root would make it root's


async def test_a_program_is_found_past_a_path_folder_where_it_cannot_run(sandbox: Sandbox) -> None:
    sandbox.write_file("first/tool", "#!/bin/sh\necho first\n")  # not executable: skipped, as execvp does
    sandbox.write_file("second/tool", "#!/bin/sh\necho second\n")
    os.chmod(sandbox.workdir / "second" / "tool", 0o755)
    path = f"{sandbox.workdir}/first:{sandbox.workdir}/second:/usr/bin:/bin"
    result = await sandbox.run(["tool"], env={"PATH": path})
    assert (result.exit_code, result.stdout) == (0, "second\n"), result


async def test_a_program_in_no_path_folder_is_a_start_error_naming_it(sandbox: Sandbox) -> None:
    result = await sandbox.run(["no-such-tool-anywhere"])
    assert result.exit_code is None
    assert "no such program: 'no-such-tool-anywhere'" in (result.start_error or ""), result
