"""The watchdog: busy stages silent past their budgets are named (soft) and stop the run (hard); progress and idle
stages are never stalls; roles' progress files are judged by the launcher. On a fake clock, or tiny budgets with
stages that never progress (so nothing depends on how fast this machine is)."""

import asyncio
import threading
import time

import pytest

from tracegym.runtimes.watchdog import (
    Budget,
    ProgressFile,
    ProgressFiles,
    Stage,
    Stalled,
    Watchdog,
    WatchdogConfig,
    Watcher,
    beat,
    build_watchdog,
    progress_file,
    reporting,
    until_stalled,
    watch,
    watch_named,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def test_a_busy_stage_silent_past_its_soft_budget_is_named_with_its_last_event(clock):
    watchdog = build_watchdog(WatchdogConfig(warn_after=120, trainer_step=600), clock)
    with watchdog.watch(Stage.TRAINER_STEP, "40"):
        pass
    with watchdog.watch(Stage.TRAINER_STEP, "41"):
        clock.now += 121
        [stall] = watchdog.stalls()
    assert not stall.hard
    assert stall.line().startswith("no progress in trainer step 41 for 121 s: last event trainer step 40 "
                                   "ended at ")
    assert (stall.stage, stall.detail) == ("trainer step", "41") and "step 40 ended" in stall.last


def test_a_busy_stage_silent_past_its_hard_budget_says_so(clock):
    watchdog = build_watchdog(WatchdogConfig(weight_sync=600), clock)
    with watchdog.watch(Stage.WEIGHT_SYNC, "version 3"):
        clock.now += 600
        [stall] = watchdog.stalls()
    assert stall.hard
    assert stall.line().startswith("no progress in weight sync version 3 for 600 s (hard budget 600 s): last event")


def test_progress_in_a_stage_restarts_its_silence(clock):
    watchdog = build_watchdog(WatchdogConfig(warn_after=10), clock)
    with watchdog.watch(Stage.ENV_SERVER, "step 0"):
        clock.now += 9
        watchdog.beat(Stage.ENV_SERVER, "episode a#0 returned")
        clock.now += 9
        assert watchdog.stalls() == []
        clock.now += 1
        [stall] = watchdog.stalls()
    assert stall.last.startswith("episode a#0 returned at ")


def test_an_idle_stage_is_never_stalled(clock):
    watchdog = build_watchdog(WatchdogConfig(checkpoint=1), clock)
    with watchdog.watch(Stage.CHECKPOINT, "step 1"):
        pass
    watchdog.beat(Stage.CHECKPOINT, "ignored: nothing is busy")
    clock.now += 10_000
    assert watchdog.stalls() == []


def test_a_stage_is_busy_until_its_last_open_watch_ends(clock):
    watchdog = build_watchdog(WatchdogConfig(warn_after=5), clock)
    with watchdog.watch(Stage.MODEL_CALL, "a"):
        with watchdog.watch(Stage.MODEL_CALL, "b"):
            clock.now += 5
        clock.now += 5  # b's end was progress; a is still in flight
        [stall] = watchdog.stalls()
    assert stall.detail == "a"
    clock.now += 100
    assert watchdog.stalls() == []


def test_soft_budget_is_the_warning_time_capped_at_the_hard_budget():
    config = WatchdogConfig(warn_after=120, tool=60, scoring=300)
    assert config.budget(Stage.TOOL) == Budget(soft=60, hard=60)
    assert config.budget(Stage.SCORING) == Budget(soft=120, hard=300)
    assert WatchdogConfig(enabled=False).budget(Stage.TOOL).hard == float("inf")


def test_watch_reports_to_the_current_watchdog_only(clock):
    watchdog = Watchdog(clock=clock)
    with watch(Stage.TOOL, "outside"):  # no watchdog: nothing happens
        pass
    with watchdog.using(), watch(Stage.TOOL, "search"):
        assert watchdog.snapshot()["stages"]["tool"]["busy"] == ["search"]
    beat(Stage.TOOL, "nobody hears this")
    assert watchdog.snapshot()["stages"]["tool"]["busy"] == []


def test_the_rollout_loops_stage_names_map_to_watched_stages(clock):
    watchdog = Watchdog(clock=clock)
    with watchdog.using():
        for name in ("model", "tool:search", "scoring:exact", "stop:done", "setup", "env_response"):
            with watch_named(name):
                pass
    assert set(watchdog.snapshot()["stages"]) == {"model call", "tool", "scoring"}


def test_the_watcher_warns_once_per_silence_then_stops_at_the_hard_budget(clock):
    watchdog = build_watchdog(WatchdogConfig(warn_after=10, batch_assembly=30), clock)
    warned, stopped = [], []
    watcher = Watcher(watchdog, warned.append, stopped.append)
    with watchdog.watch(Stage.BATCH_ASSEMBLY, "step 2"):
        clock.now += 11
        assert watcher.check() is None and watcher.check() is None
        clock.now += 20
        stall = watcher.check()
    assert [w.stage for w in warned] == ["batch assembly"]
    assert stopped == [stall] and stall is not None and stall.hard


def test_until_stalled_cancels_a_stage_that_never_progresses_and_raises_one_line():
    async def stuck() -> None:
        with watch(Stage.MODEL_CALL, "task 7"):
            await asyncio.Event().wait()

    watchdog = build_watchdog(WatchdogConfig(warn_after=0.05, model_call=0.2))
    warned = []
    with pytest.raises(Stalled, match=r"^no progress in model call task 7 for 0 s \(hard budget 0.2 s\)") as caught:
        asyncio.run(until_stalled(stuck(), watchdog, warned.append))
    assert "\n" not in str(caught.value) and warned and warned[0].stage == "model call"


def test_until_stalled_returns_what_a_healthy_run_returns():
    async def quick() -> int:
        with watch(Stage.SCORING, "exact"):
            return 42

    assert asyncio.run(until_stalled(quick(), build_watchdog(WatchdogConfig()), print)) == 42


def written_busy(file: ProgressFile, stage: str) -> float:
    """Wait (a minute at most) for the file to show `stage` busy; when it became so."""
    deadline = time.monotonic() + 60
    while not (state := file.read().get("stages", {}).get(stage, {})).get("busy"):
        assert time.monotonic() < deadline, f"{file.path} never showed {stage} busy"
        time.sleep(0.01)
    return float(state["since"])


def test_a_progress_file_ends_up_with_the_newest_of_a_burst_of_snapshots(tmp_path):
    file = ProgressFile(tmp_path / "progress-x.json")
    for n in range(200):
        file.write({"last": str(n), "stages": {}})
    deadline = time.monotonic() + 60
    while file.read().get("last") != "199":
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_launcher_judges_each_roles_progress_file(tmp_path, clock):
    inside, done = threading.Event(), threading.Event()

    def trainer() -> None:
        with reporting(tmp_path, "trainer"), watch(Stage.WEIGHT_SYNC, "version 1"):
            inside.set()
            done.wait(60)

    thread = threading.Thread(target=trainer)
    thread.start()
    try:
        assert inside.wait(60)
        files = ProgressFiles(tmp_path, WatchdogConfig(warn_after=10, weight_sync=100), clock)
        since = written_busy(progress_file(tmp_path, "trainer"), "weight sync")
        clock.now = since + 11
        warnings, stalled = files.check()
        assert len(warnings) == 1 and stalled is None
        assert warnings[0].startswith("watchdog: trainer: no progress in weight sync version 1 for 11 s: last event")
        assert files.check() == ([], None)  # said once
        clock.now = since + 100
        _, stalled = files.check()
        assert stalled is not None and stalled[0] == "trainer" and stalled[1].hard
    finally:
        done.set()
        thread.join()
