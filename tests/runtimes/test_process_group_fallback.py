"""The process-group fallback (no namespaces) runs only when asked for by name: where namespaces are missing the
`subprocess` runtime refuses to open, saying why and how to ask; asked for, it warns once per process what it does
not isolate."""

from __future__ import annotations

import logging

import pytest
from sandbox_helpers import QUICK

from tracegym.runtimes import limited_process
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.sandbox import RuntimeUnavailable


async def test_subprocess_without_namespaces_refuses_to_open_and_says_how_to_ask_for_the_fallback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limited_process, "no_namespaces", lambda: "unshare is not installed (in this test)")
    runtime = runtime_for("subprocess", QUICK)
    assert runtime.unavailable() is not None
    with pytest.raises(RuntimeUnavailable) as raised:
        await runtime.open()
    said = str(raised.value)
    for part in ("unshare is not installed (in this test)", "runtime 'process-group'",
                 "LimitedProcess(isolation='process-group')", "network"):
        assert part in said, said


async def test_the_fallback_asked_for_by_name_opens_and_warns_once_what_it_does_not_isolate(
        caplog: pytest.LogCaptureFixture) -> None:
    limited_process.warn_fallback.cache_clear()
    caplog.set_level(logging.WARNING)
    runtime = runtime_for("process-group", QUICK)
    assert runtime.name == "process-group" and runtime.unavailable() is None
    for _ in range(2):
        box = await runtime.open()
        assert (await box.run(["true"])).ok
        await box.close()
    said = [r.getMessage() for r in caplog.records if "'process-group'" in r.getMessage()]
    assert len(said) == 1 and all(what in said[0] for what in ("network", "/proc", "kill")), said
