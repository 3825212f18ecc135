"""Admission control of sandbox starts: the start cap, the setup budget, the memory ceiling and the warm pool, with
fake runtimes whose opens and runs the test holds and lets go (no timing), and real runtimes in the slow tests."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from sandbox_helpers import QUICK

import tracegym as tg
from tracegym.core.errors import ErrorKind, FailureKind, UsageError
from tracegym.runtimes.admission import (
    Admission,
    AdmissionConfig,
    AdmittedSandbox,
    HostMemory,
    SandboxRefused,
    SandboxSetupTimeout,
    configure_admission,
    default_reserve_mb,
    default_starting,
)
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.sandbox import Forward, Limits, ProgramResult, Runtime
from tracegym.testing import ScriptedModel

_ids = itertools.count()
SMALL = Limits(memory_mb=100)


class Gates:
    """What the test holds and sees of a fake runtime: its opens wait for `opens`, its runs for `runs`; the opens
    and runs in progress, the peak of opens at once, and every sandbox opened."""

    def __init__(self, open_at_once: bool, ignore_cancel: bool) -> None:
        self.opens, self.runs = asyncio.Event(), asyncio.Event()
        if open_at_once:
            self.opens.set()
        self.ignore_cancel = ignore_cancel
        self.opening = self.peak = self.running = 0
        self.opened: list[FakeSandbox] = []


class FakeSandbox:
    """A sandbox that runs nothing: each run waits for its runtime's `runs` gate."""

    def __init__(self, gates: Gates) -> None:
        self.gates, self.closed = gates, False
        self.workdir = Path(f"/nonexistent/fake-sandbox-{next(_ids)}")

    def write_file(self, name: str, content: str | bytes) -> None: ...

    def read_file(self, name: str, cap: int = 0) -> bytes | None:
        return None

    def cannot_forward(self) -> str | None:
        return None

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                  limits: Limits | None = None, forward: Forward | None = None) -> ProgramResult:
        self.gates.running += 1
        try:
            await self.gates.runs.wait()
        finally:
            self.gates.running -= 1
        return ProgramResult(argv=list(argv), exit_code=0)

    async def close(self) -> None:
        self.closed = True


class FakeRuntime:
    """Opens fake sandboxes once `gates.opens` is set (at once unless `open_at_once` is False); with
    `ignore_cancel`, an open finishes even after it was cancelled (a remote create that cannot be called back)."""

    name = "fake"

    def __init__(self, limits: Limits = SMALL, *, open_at_once: bool = True,
                 ignore_cancel: bool = False) -> None:
        self.limits = limits
        self.gates = Gates(open_at_once, ignore_cancel)

    def unavailable(self) -> str | None:
        return None

    async def open(self) -> FakeSandbox:
        gates = self.gates
        gates.opening += 1
        gates.peak = max(gates.peak, gates.opening)
        try:
            while not gates.opens.is_set():
                try:
                    await gates.opens.wait()
                except asyncio.CancelledError:
                    if not gates.ignore_cancel:
                        raise
        finally:
            gates.opening -= 1
        sandbox = FakeSandbox(gates)
        gates.opened.append(sandbox)
        return sandbox


def fixed_memory(total_mb: int, available_mb: int) -> Callable[[], HostMemory]:
    return lambda: HostMemory(total_mb, available_mb)


def quiet(**fields: object) -> AdmissionConfig:
    """A config without jitter, plenty of memory, and the fields given."""
    base: dict[str, object] = {"jitter_s": 0.0, "memory_reserve_mb": 0, "setup_budget_s": 60.0, "max_starting": 4}
    return AdmissionConfig.model_validate({**base, **fields})


async def until(predicate: Callable[[], bool], deadline_s: float = 10.0) -> None:
    """Yield to the loop until `predicate()` holds (AssertionError past the deadline)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not predicate():
        assert loop.time() < end, "condition not reached before the deadline"
        await asyncio.sleep(0.001)


# --- the start cap -----------------------------------------------------------------------------------------------

async def test_never_more_than_the_cap_open_at_once() -> None:
    runtime = FakeRuntime(open_at_once=False)
    admission = Admission(quiet(max_starting=3), memory=fixed_memory(100_000, 100_000))
    opens = [asyncio.ensure_future(admission.open(runtime)) for _ in range(10)]
    await until(lambda: runtime.gates.opening == 3 and admission.queued == 7)
    runtime.gates.opens.set()
    sandboxes = await asyncio.gather(*opens)
    assert runtime.gates.peak == 3
    assert len({id(s.inner) for s in sandboxes}) == 10


async def test_one_of_several_processes_sharing_the_cap_starts_only_its_share_at_once() -> None:
    runtime = FakeRuntime(open_at_once=False)
    admission = Admission(quiet(max_starting=7), share=3, memory=fixed_memory(100_000, 100_000))
    opens = [asyncio.ensure_future(admission.open(runtime)) for _ in range(6)]
    await until(lambda: runtime.gates.opening == 2 and admission.queued == 4)
    runtime.gates.opens.set()
    await asyncio.gather(*opens)
    assert admission.slots == 2 and runtime.gates.peak == 2


def test_a_cap_too_small_to_give_each_sharing_process_a_start_is_refused_naming_it() -> None:
    with pytest.raises(UsageError, match=r"sandbox.max_starting=2 is below the 3 worker processes"):
        configure_admission(quiet(max_starting=2), share=3)


async def test_a_first_program_holds_its_start_slot_until_it_returns() -> None:
    runtime = FakeRuntime()
    admission = Admission(quiet(max_starting=1, start_hold_s=60.0), memory=fixed_memory(100_000, 100_000))
    first = await admission.open(runtime)
    running = asyncio.ensure_future(first.run(["agent"]))
    await until(lambda: runtime.gates.running == 1)
    second = asyncio.ensure_future(admission.open(runtime))
    await until(lambda: admission.queued == 1)
    assert not second.done() and admission.starting == 1
    runtime.gates.runs.set()
    assert (await running).ok
    assert isinstance(await second, AdmittedSandbox)


async def test_a_long_first_program_gives_its_slot_back_after_the_hold() -> None:
    runtime = FakeRuntime()
    admission = Admission(quiet(max_starting=1, start_hold_s=0.0), memory=fixed_memory(100_000, 100_000))
    first = await admission.open(runtime)
    running = asyncio.ensure_future(first.run(["agent"]))
    await until(lambda: runtime.gates.running == 1)
    await admission.open(runtime)  # the agent still runs: the slot is back
    assert not running.done()
    runtime.gates.runs.set()
    await running


# --- the setup budget --------------------------------------------------------------------------------------------

async def test_an_open_past_its_budget_fails_naming_the_runtime_and_the_budget_and_siblings_go_on() -> None:
    hanging, fine = FakeRuntime(open_at_once=False, ignore_cancel=True), FakeRuntime()
    hanging.name = "hanging"
    admission = Admission(quiet(setup_budget_s=0.2), memory=fixed_memory(100_000, 100_000))
    stuck = asyncio.ensure_future(admission.open(hanging))
    siblings = [await admission.open(fine) for _ in range(3)]
    with pytest.raises(SandboxSetupTimeout, match=r"runtime 'hanging': .* budget of 0.2 s \(setup_budget_s\) "
                                                  r"while opening it"):
        await stuck
    assert len(siblings) == 3 and admission.committed_mb == 300  # the siblings' commitments alone
    hanging.gates.opens.set()  # the late open finishes: its sandbox is closed, never handed out
    await until(lambda: bool(hanging.gates.opened) and hanging.gates.opened[0].closed)


async def test_a_start_waiting_for_a_slot_past_its_budget_fails_saying_so() -> None:
    runtime = FakeRuntime()
    admission = Admission(quiet(max_starting=1, start_hold_s=60.0, setup_budget_s=0.2),
                          memory=fixed_memory(100_000, 100_000))
    first = await admission.open(runtime)
    running = asyncio.ensure_future(first.run(["agent"]))
    await until(lambda: runtime.gates.running == 1)  # its launch holds the only slot
    with pytest.raises(SandboxSetupTimeout, match="while waiting for a start slot"):
        await admission.open(runtime)
    runtime.gates.runs.set()
    await running


class HangsOnHang(tg.Task):
    """Opens its sandbox at setup; its runtime never finishes opening when the prompt says `hang`."""

    async def setup(self) -> None:
        await self.sandbox()

    def runtime(self) -> Runtime:
        return FakeRuntime(open_at_once=self.data.prompt != "hang")


@pytest.fixture
def short_budget() -> object:
    configure_admission(quiet(setup_budget_s=0.3))
    yield
    configure_admission(None)


async def test_a_rollout_whose_sandbox_runs_out_of_budget_is_a_failed_rollout_and_its_sibling_finishes(
        short_budget: object) -> None:
    taskset = tg.Taskset(id="budget", data=[tg.TaskData(prompt="hang"), tg.TaskData(prompt="fine")])
    taskset.task_class = HangsOnHang
    traces = await tg.evaluate(taskset, ScriptedModel(["done"]), num_tasks=2, rollouts=1)
    by_prompt = {t.task.prompt: t for t in traces}
    [error] = by_prompt["hang"].errors
    assert (error.kind, error.failure, error.stage) == (ErrorKind.INFRASTRUCTURE, FailureKind.SANDBOX_ERROR, "setup")
    assert "runtime 'fake': the sandbox's setup ran past its budget of 0.3 s" in error.message
    assert by_prompt["fine"].errors == [] and by_prompt["fine"].stop_reason == tg.StopReason.COMPLETED


# --- the memory ceiling ------------------------------------------------------------------------------------------

async def test_a_sandbox_the_host_could_never_hold_is_refused_at_once_naming_memory_mb() -> None:
    admission = Admission(quiet(memory_reserve_mb=1000), memory=fixed_memory(4000, 3000))
    with pytest.raises(SandboxRefused, match=r"Limits.memory_mb=5000 can never start on this host: it has 4000 MB "
                                             r"\(MemTotal\), 3000 MB available now, less the reserve of 1000 MB"):
        await admission.open(FakeRuntime(Limits(memory_mb=5000)))
    assert admission.committed_mb == 0


async def test_a_sandbox_that_fits_later_waits_until_one_closes() -> None:
    runtime = FakeRuntime(Limits(memory_mb=800))
    admission = Admission(quiet(memory_reserve_mb=1000), memory=fixed_memory(4000, 3000))  # room: 2000 MB
    first, _second = await admission.open(runtime), await admission.open(runtime)
    third = asyncio.ensure_future(admission.open(runtime))
    await until(lambda: admission.queued == 1)
    assert not third.done() and len(runtime.gates.opened) == 2
    await first.close()
    await third
    assert admission.committed_mb == 1600


async def test_one_of_several_processes_sharing_the_config_commits_only_its_share_of_the_memory() -> None:
    runtime = FakeRuntime(Limits(memory_mb=800))
    admission = Admission(quiet(memory_reserve_mb=1000), share=2, memory=fixed_memory(4000, 3000))  # room: 1000 MB
    await admission.open(runtime)
    second = asyncio.ensure_future(admission.open(runtime))
    await until(lambda: admission.queued == 1)
    assert not second.done() and admission.committed_mb == 800
    second.cancel()


async def test_a_sandbox_above_its_process_s_share_is_refused_at_once_naming_the_share() -> None:
    admission = Admission(quiet(memory_reserve_mb=1000), share=4, memory=fixed_memory(4000, 3000))
    with pytest.raises(SandboxRefused, match=r"3000 MB for sandboxes, 750 MB of it this process's \(one of 4"):
        await admission.open(FakeRuntime(Limits(memory_mb=800)))


async def test_a_sandbox_waits_while_other_processes_hold_the_memory_it_needs() -> None:
    host = {"available": 1500}
    admission = Admission(quiet(memory_reserve_mb=1000), memory=lambda: HostMemory(4000, host["available"]))
    waiting = asyncio.ensure_future(admission.open(FakeRuntime(Limits(memory_mb=800))))
    await until(lambda: admission.queued == 1)
    host["available"] = 3000  # another process exits; the waiting start reads /proc/meminfo again
    await waiting


async def test_overcommit_counts_each_cap_at_a_fraction() -> None:
    runtime = FakeRuntime(Limits(memory_mb=800))
    admission = Admission(quiet(memory_reserve_mb=1000, memory_overcommit=4.0), memory=fixed_memory(4000, 3000))
    for _ in range(10):
        await admission.open(runtime)
    assert admission.committed_mb == 2000


async def test_a_runtime_without_limits_is_admitted_uncounted_and_said_so(caplog: pytest.LogCaptureFixture) -> None:
    runtime = FakeRuntime()
    del runtime.limits
    admission = Admission(quiet(), memory=fixed_memory(100, 0))  # no memory at all: only an uncounted one starts
    await admission.open(runtime)
    assert admission.committed_mb == 0
    assert "runtime 'fake' states no Limits: its sandboxes are not counted" in caplog.text


# --- the warm pool -----------------------------------------------------------------------------------------------

async def test_the_pool_hands_out_each_sandbox_once_and_refills() -> None:
    runtime = FakeRuntime()
    admission = Admission(quiet(warm_pool=2), memory=fixed_memory(100_000, 100_000))
    cold = await admission.open(runtime)  # the first open is cold and starts the pool
    pool = admission.pool(runtime)
    assert pool is not None
    await pool.full()
    ready = list(pool._ready)
    taken = [await admission.open(runtime) for _ in range(2)]
    assert [s.inner for s in taken] == ready  # taken from the pool, each once
    await pool.full()
    assert pool.ready == 2 and len(runtime.gates.opened) == 5  # refilled: the cold one, 2, and 2 more
    assert cold.inner not in ready and not set(pool._ready) & {cold.inner, *ready}


async def test_closing_the_admission_closes_what_the_pool_never_handed_out() -> None:
    runtime = FakeRuntime()
    admission = Admission(quiet(warm_pool=3), memory=fixed_memory(100_000, 100_000))
    handed = await admission.open(runtime)
    pool = admission.pool(runtime)
    assert pool is not None
    await pool.full()
    await admission.close()
    pooled = [s for s in runtime.gates.opened if s is not handed.inner]
    assert len(pooled) == 3 and all(s.closed for s in pooled)
    assert not handed.inner.closed  # the rollout's to close
    await handed.close()
    assert handed.inner.closed and admission.committed_mb == 0


def test_the_defaults_follow_the_host() -> None:
    assert (default_starting(1), default_starting(2), default_starting(256)) == (8, 16, 64)
    assert (default_reserve_mb(2048), default_reserve_mb(65536), default_reserve_mb(1 << 20)) == (512, 6553, 8192)


# --- real runtimes -----------------------------------------------------------------------------------------------

@pytest.mark.slow
async def test_a_burst_of_real_starts_through_admission_all_run_and_leave_nothing() -> None:
    runtime = runtime_for("subprocess", QUICK)
    admission = Admission(AdmissionConfig(max_starting=2, jitter_s=0.01, warm_pool=2))

    async def start() -> tuple[ProgramResult, Path]:
        sandbox = await admission.open(runtime)
        try:
            return await sandbox.run(["true"]), sandbox.workdir
        finally:
            await sandbox.close()

    done = await asyncio.gather(*(start() for _ in range(24)))
    pool = admission.pool(runtime)
    assert pool is not None
    await pool.full()
    pooled = [s.workdir for s in list(pool._ready)]
    assert all(p.exists() for p in pooled)
    await admission.close()
    assert all(result.ok for result, _ in done), [r for r, _ in done if not r.ok]
    assert not any(workdir.exists() for _, workdir in done)
    assert not any(p.parent.exists() for p in pooled)
    assert admission.committed_mb == 0 and admission.starting == 0
