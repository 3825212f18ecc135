"""Regeneration of an empty batch, deterministic with fakes: the first batch with samples is handed over, each
empty attempt is logged and its traces kept; after the last attempt the run stops saying what became of the
rollouts, the orchestrator role exits with STOPPED_EXIT and the launcher reports the stop."""

import asyncio
import doctest
import io
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from test_filters import FakeGroups, clean, gibberish, orchestrator

from tracegym.train import launcher, regeneration, roles
from tracegym.train.regeneration import STOPPED_EXIT, EmptyBatch, regenerated, rollouts_fate


def batches(*sizes: int):
    """`make` for `regenerated`: attempt n gives `sizes[n]` samples; records the attempts it was asked for."""
    asked: list[int] = []

    async def make(attempt: int):
        asked.append(attempt)
        return ["sample"] * sizes[attempt], {"rollouts": 4, "attempt": attempt}

    return make, asked


def test_the_first_batch_with_samples_is_handed_over_with_the_attempts_it_took():
    make, asked = batches(0, 0, 2, 5)
    empty: list[tuple[int, dict]] = []
    samples, metrics = asyncio.run(regenerated(make, 5, str, lambda n, m: empty.append((n, m))))
    assert samples == ["sample"] * 2 and asked == [0, 1, 2]
    assert metrics == {"rollouts": 4, "attempt": 2, "batch_attempts": 3}
    assert empty == [(0, {"rollouts": 4, "attempt": 0}), (1, {"rollouts": 4, "attempt": 1})]


def test_after_the_last_empty_attempt_it_stops_with_the_reason_built_from_every_attempt():
    make, asked = batches(0, 0, 0, 7)
    with pytest.raises(EmptyBatch, match=r"^step 3: nothing to train on after 3 attempts: attempts \[0, 1, 2\]$"):
        asyncio.run(regenerated(make, 3, lambda tried: f"attempts {[m['attempt'] for m in tried]}", what="step 3"))
    assert asked == [0, 1, 2]  # never a fourth


def test_the_modules_doctest_runs():
    assert doctest.testmod(regeneration).failed == 0


def test_the_reason_says_what_failed_what_filters_dropped_per_environment_and_what_had_no_signal():
    tried = [{"rollouts": 8, "rollouts_failed": 1, "failed/timeout": 1, "rollouts_filtered": 5,
              "filters/reverse-text/gibberish": 5 / 7, "filters/reverse-text/dropped": 5 / 7,
              "filters/reverse-text/checked": 7, "filters/all/gibberish": 5 / 7, "filters/all/dropped": 5 / 7,
              "filters/all/checked": 7}] * 2
    assert rollouts_fate(tried, no_signal=1) == (
        "16 rollouts: 2 failed (timeout 2), 10 dropped by enforced filters (reverse-text: 10 of 14, caught by "
        "gibberish 10), 4 left without signal (1 groups had every reward the same) or with samples too stale or "
        "untrainable")


# --- in the orchestrator ------------------------------------------------------------------------------------------
def test_a_step_left_empty_by_a_filter_is_made_again_with_new_tasks_and_every_attempts_traces_are_kept(
        tmp_path, endpoints):
    junk = [gibberish] * 4
    orch = orchestrator(tmp_path, endpoints, FakeGroups(junk, junk, [clean] * 4), batch_attempts=3,
                        filters={"gibberish": {"mode": "enforce"}})
    samples, metrics = asyncio.run(orch.make_batch(0, 0, "base"))
    assert len(samples) == 4 and metrics["batch_attempts"] == 3 and metrics["rollouts_filtered"] == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["empty_batch"], r["attempt"], r["rollouts_filtered"]) for r in records] == [(0, 0, 4), (0, 1, 4)]
    saved = [json.loads(line) for line in (tmp_path / "traces" / "step-000000.jsonl").read_text().splitlines()]
    assert len(saved) == 12 and sum("filter/dropped" in t["metrics"] for t in saved) == 8
    assert len({t["task_key"] for t in saved}) == 3  # a new task each attempt


def test_a_step_that_stays_empty_stops_the_run_naming_the_filter_and_the_environment(tmp_path, endpoints):
    junk = [gibberish] * 4
    orch = orchestrator(tmp_path, endpoints, FakeGroups(junk, junk), batch_attempts=2,
                        filters={"gibberish": {"mode": "enforce"}})
    with pytest.raises(EmptyBatch) as stopped:
        asyncio.run(orch.make_batch(0, 0, "base"))
    assert str(stopped.value) == (
        "step 0: nothing to train on after 2 attempts: 8 rollouts: 0 failed, 8 dropped by enforced filters "
        "(reverse-text: 8 of 8, caught by gibberish 8 and repetition 0), 0 left without signal or with samples too "
        "stale or untrainable")


def test_groups_without_signal_are_named_as_the_reason(tmp_path, endpoints):
    same = [lambda reward, task: clean(1.0, task=task)] * 4
    orch = orchestrator(tmp_path, endpoints, FakeGroups(same, same, same), batch_attempts=3)
    with pytest.raises(EmptyBatch, match=r"0 dropped by enforced filters, 12 left without signal \(3 groups had"):
        asyncio.run(orch.make_batch(0, 0, "base"))


# --- the stop, end to end through the role and the launcher --------------------------------------------------------
def test_the_orchestrator_role_exits_with_stopped_exit_and_one_line(tmp_path, monkeypatch, capsys):
    reason = "step 0: nothing to train on after 2 attempts: ..."

    def stops(run_dir):
        raise EmptyBatch(reason)

    monkeypatch.setitem(roles.ROLES, "orchestrator", stops)
    assert roles.main(["orchestrator", str(tmp_path)]) == STOPPED_EXIT
    assert capsys.readouterr().err == f"orchestrator: stopped the run: {reason}\n"


def test_the_launcher_reports_the_stop_with_the_reason_and_stops_everything(tmp_path):
    def role(name: str, code: str) -> launcher.Role:
        log_path = tmp_path / f"{name}.log"
        log = log_path.open("ab")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
        return launcher.Role(name, proc, log_path, log)

    said = "orchestrator: stopped the run: step 4: nothing to train on after 3 attempts: 24 rollouts: ..."
    roles_ = [role("trainer", "import time; time.sleep(60)"),
              role("orchestrator", f"import sys; print('starting'); print({said!r}, file=sys.stderr); sys.exit(4)")]
    servers = SimpleNamespace(servers=[SimpleNamespace(running=lambda: True, log_path="vllm.log")])
    out = io.StringIO()
    try:
        assert launcher.supervise(roles_, servers, out) == 1
    finally:
        for r in roles_:
            r.stop()
    assert out.getvalue() == f"rl: stopping everything: {said}\n"
