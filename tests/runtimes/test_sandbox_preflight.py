"""Bad sandbox input is refused before any rollout starts: one UsageError naming the setting and its value (an
egress hostname that does not resolve, egress a runtime cannot enforce, a runtime this host lacks, strict caps no
cgroup can give, a bind that does not exist), from the API (`evaluate`, `check_taskset_async`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tracegym as tg
from tracegym.core.errors import UsageError
from tracegym.envs.harness import ProgramHarness
from tracegym.envs.task_sandbox import TaskSandbox, check_taskset_async
from tracegym.runtimes import cgroup
from tracegym.runtimes.bubblewrap import probe
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.preflight import check_sandbox
from tracegym.runtimes.sandbox import Limits, RuntimeUnavailable
from tracegym.testing import ScriptedModel

NO_CGROUP = "no cgroup can be made here (the test says so)"


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A host without bwrap on its PATH (the probe, cached per process, forgets what it found before and after)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    probe.cache_clear()
    yield
    probe.cache_clear()


@pytest.fixture
def no_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host where no sandbox cgroup can be made (as on one without delegated controllers)."""
    monkeypatch.setattr(cgroup, "placement", lambda: NO_CGROUP)


async def refused(options: dict[str, object]) -> str:
    """What `evaluate` raises for python-functions with `options`, asserting the model was never called."""
    taskset = tg.load_taskset("python-functions", {"num_tasks": 2, **options})
    calls: list[object] = []
    with pytest.raises(UsageError) as raised:
        await tg.evaluate(taskset, ScriptedModel(rule=lambda request: calls.append(request) or "```python\n```"))
    assert calls == []
    return str(raised.value)


async def test_an_egress_hostname_that_does_not_resolve_is_refused_naming_it_before_any_rollout() -> None:
    said = await refused({"egress": ["nohost.invalid:80"]})
    assert said.startswith("taskset 'python-functions': egress entry 'nohost.invalid:80' does not resolve on this host")


async def test_egress_on_a_runtime_that_cannot_enforce_it_is_refused_naming_both() -> None:
    said = await refused({"runtime": "process-group", "egress": ["127.0.0.1:80"]})
    assert "runtime 'process-group'" in said and "egress ['127.0.0.1:80']" in said


async def test_a_runtime_this_host_lacks_is_refused_naming_it(no_bwrap: None) -> None:
    said = await refused({})
    assert "runtime 'bubblewrap' cannot run on this host: bwrap is not installed" in said


async def test_strict_caps_where_no_cgroup_can_be_made_are_refused_naming_the_caps(no_cgroup: None) -> None:
    said = await refused({"strict_caps": True})
    assert "strict_caps: memory_mb=512 and processes=32 cannot cap the sandbox's processes together" in said
    assert NO_CGROUP in said


async def test_strict_caps_pass_where_the_sandbox_gets_a_cgroup() -> None:
    if isinstance(cgroup.placement(), str):
        pytest.skip(f"no cgroup here: {cgroup.placement()}")
    await check_sandbox(runtime_for("subprocess", Limits(strict_caps=True, disk_mb=64)))


async def test_a_rollout_sandbox_with_strict_caps_is_refused_at_open_too(no_cgroup: None) -> None:
    sandbox = TaskSandbox(runtime_for("bubblewrap", Limits(strict_caps=True)))
    with pytest.raises(RuntimeUnavailable, match="strict_caps"):
        await sandbox.get()


def test_a_read_only_path_that_does_not_exist_is_refused_naming_it_at_load() -> None:
    with pytest.raises(UsageError, match=r"read_only.*'/no/such/path' is not an existing absolute path"):
        tg.load_taskset("python-functions", {"read_only": ["/no/such/path"]})


def test_a_harness_bind_that_does_not_exist_is_refused_when_its_limits_are_made() -> None:
    with pytest.raises(ValueError, match="'/no/such/venv' is not an existing absolute path"):
        ProgramHarness(command=["agent"], limits=Limits(read_only=("/no/such/venv",)))


class EgressAgent(tg.Task):
    """An agent program allowed to reach one host that does not exist."""

    harness = ProgramHarness(command=["agent"], limits=Limits(egress=("nohost.invalid:443",)))


async def test_an_agent_program_egress_entry_is_checked_like_the_runtime_s() -> None:
    taskset = tg.Taskset(id="agents", data=[tg.TaskData(prompt="go")])
    taskset.task_class = EgressAgent
    with pytest.raises(UsageError, match=r"taskset 'agents': egress entry 'nohost\.invalid:443' does not resolve"):
        await check_taskset_async(taskset)


async def test_a_taskset_whose_tasks_use_no_sandbox_is_not_checked(no_bwrap: None) -> None:
    await check_taskset_async(tg.load_taskset("reverse-text"))
