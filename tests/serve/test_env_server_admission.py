"""Sandbox admission from the command line: an env server's (`--sandbox.*`), split over its worker processes so
that its caps hold for the whole server, and `tracegym eval --no-serve`'s own (`--env.sandbox.*`)."""

import asyncio
from pathlib import Path

import pytest
from serve_helpers import task

from tracegym import Trace
from tracegym.cli.main import main
from tracegym.core.errors import UsageError
from tracegym.runtimes.admission import AdmissionConfig, configure_admission
from tracegym.serve import EnvClient, EnvServer, PoolSize, local_server
from tracegym.serve.env_server_choice import EnvServerChoice, WorkerPoolChoice

PROBE = f"{Path(__file__).parent / 'admission_probe.py'}:AdmissionProbe"


async def test_each_worker_of_a_served_taskset_admits_its_share_of_the_sandbox_settings(endpoint):
    pool = WorkerPoolChoice(workers=2, spare_workers=1, sandbox=AdmissionConfig(max_starting=7, warm_pool=2))
    with local_server(PROBE, pool=pool) as address:  # `tracegym serve --sandbox.max-starting 7 ...`
        async with EnvClient(address) as client:
            runs = await asyncio.gather(*(client.run(task(f"word{i}"), endpoint) for i in range(6)))
    traces = [trace for run in runs for trace in run]
    assert len(traces) == 6 and not [t.errors for t in traces if t.errors]
    assert {t.reward for t in traces} == {2.0}  # 7 starts at once over 3 worker processes (2 and a spare): 2 each
    assert {(t.metrics["share"], t.metrics["warm_pool"]) for t in traces} == {(3.0, 2.0)}


@pytest.fixture
def default_admission():
    yield
    configure_admission(None)


def test_eval_in_process_admits_its_sandboxes_under_its_env_sandbox_settings(fake, tmp_path, default_admission):
    out = tmp_path / "out"
    assert main(["eval", PROBE, "-n", "2", "--no-serve", "--no-rich", "--env.sandbox.max-starting", "5",
                 "--model.base-url", fake.base_url, "--output-dir", str(out)]) == 0
    [run] = out.glob("*/*/traces.jsonl")
    traces = [Trace.model_validate_json(line) for line in run.read_text().splitlines()]
    assert [(t.reward, t.metrics["share"]) for t in traces] == [(5.0, 1.0), (5.0, 1.0)]


def test_sandbox_settings_reach_tracegym_serve_as_its_own_flags():
    choice = EnvServerChoice(sandbox={"max_starting": 12, "setup_budget_s": 30, "warm_pool": 2})
    assert choice.serve_args() == ["--sandbox.max-starting", "12", "--sandbox.setup-budget-s", "30.0",
                                   "--sandbox.warm-pool", "2"]


def test_host_default_sandbox_settings_add_no_flag():
    assert EnvServerChoice(workers=2).serve_args() == ["--workers", "2"]


def test_a_start_cap_below_the_worker_processes_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"sandbox.max_starting=2 is below the 4 worker processes"):
        WorkerPoolChoice(workers=3, spare_workers=1, sandbox=AdmissionConfig(max_starting=2))


def test_an_env_server_built_with_a_start_cap_below_its_workers_is_refused_before_any_worker_starts():
    with pytest.raises(UsageError, match=r"sandbox.max_starting=1 is below the 3 worker processes"):
        EnvServer(PROBE, size=PoolSize.static(2, spares=1), sandbox=AdmissionConfig(max_starting=1))


def test_sandbox_settings_for_a_server_that_runs_elsewhere_are_refused():
    with pytest.raises(ValueError, match="`sandbox`"):
        EnvServerChoice(address="tcp://127.0.0.1:5555", sandbox={"max_starting": 12})
