"""`tracegym rl` under the watchdog: each role's stages reach the launcher through its progress file; a stuck
weight sync, a stuck env server (a request its worker never answers: the model behind it accepts and never replies)
and the prime-rl #2912 case (the trainer reached its last step while the held-out evaluation is in flight) each end
the run with an exit code and one line naming the stage, and no process left. The launcher's clock is moved past
the budget once the stage is seen busy: nothing here depends on how fast this machine is."""

import asyncio
import contextlib
import io
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_orchestrator import make
from test_trainer import one_thread, tiny_trainer  # noqa: F401 (one_thread is an autouse fixture)

from tracegym.models.vllm_server import VLLMServerConfig
from tracegym.models.vllm_servers import CORES_ENV, VLLMServers
from tracegym.runtimes.processes import process_alive
from tracegym.runtimes.watchdog import (
    DRAIN_CANCELLED_EXIT,
    STALLED_EXIT,
    ProgressFiles,
    ShutdownDeadline,
    Stage,
    WatchdogConfig,
    progress_file,
    reporting,
)
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer, Stall
from tracegym.train.launcher import Role, judge, run_roles
from tracegym.train.orchestrator import HeldOut, Orchestrator
from tracegym.train.rl_folder import RLFolder
from tracegym.train.trainer_loop import TrainerLoop


def busy(logs: Path, role: str, stage: Stage) -> float:
    """Wait (up to a minute) until `role` reports `stage` busy; when it became silent."""
    deadline = time.monotonic() + 60
    while not (state := progress_file(logs, role).read().get("stages", {}).get(stage.value, {})).get("busy"):
        assert time.monotonic() < deadline, f"{role} never reported {stage.value}"
        time.sleep(0.02)
    return float(state["since"])


def judged_at(logs: Path, config: WatchdogConfig, now: float) -> tuple[int | None, str]:
    """What the launcher does with the roles' progress at `now`: its exit code (None: go on) and what it said."""
    out = io.StringIO()
    return judge(ProgressFiles(logs, config, clock=lambda: now), out), out.getvalue()


# --- the trainer: a stuck weight sync ----------------------------------------------------------------------
def test_a_stuck_weight_sync_stops_the_run_naming_it(tmp_path):
    folder, release = RLFolder(tmp_path), threading.Event()
    folder.logs.mkdir()
    folder.write_batch(0, [], {})

    def publish(path, version: int) -> str:
        release.wait(60)  # vLLM never answers the weight update
        return "policy"

    def trainer() -> None:
        with reporting(folder.logs, "trainer"):
            TrainerLoop(folder, tiny_trainer(), publish, steps=1, checkpoint_every=1).run()

    thread = threading.Thread(target=trainer)
    thread.start()
    try:
        since = busy(folder.logs, "trainer", Stage.WEIGHT_SYNC)
        config = WatchdogConfig(weight_sync=600)
        assert judged_at(folder.logs, config, since + 599)[0] is None
        code, said = judged_at(folder.logs, config, since + 600)
    finally:
        release.set()
        thread.join()
    assert code == STALLED_EXIT
    assert said.startswith("rl: stopping everything: trainer: no progress in weight sync of version 1 for 600 s "
                           "(hard budget 600 s): last event trainer step 0 ended at ")


# --- the orchestrator: a stuck env server, and its final evaluation (eval drain) -----------------------------
@pytest.fixture(scope="module")
def env_addresses():
    with local_server("reverse-text", {"seed": 0}, workers=1) as train, \
            local_server("reverse-text", {"seed": 9}, workers=1) as held_out:
        yield {"reverse-text": train, "eval:reverse-text": held_out}


@pytest.fixture
def hung():
    """A model endpoint that accepts every chat request and never replies."""
    with FakeOpenAIServer(rule=lambda request: Stall(None)) as fake:
        yield fake


@contextlib.contextmanager
def running(orchestrator: Orchestrator, logs: Path) -> Iterator[None]:
    """The orchestrator's `run()` on a thread of its own, reporting as its role does; cancelled on exit."""
    stop = threading.Event()

    async def until_stopped() -> None:
        work = asyncio.ensure_future(orchestrator.run())
        await asyncio.wait([work, asyncio.ensure_future(asyncio.to_thread(stop.wait, 120))],
                           return_when=asyncio.FIRST_COMPLETED)
        work.cancel()
        with contextlib.suppress(BaseException):
            await work

    def role() -> None:
        with reporting(logs, "orchestrator"):
            asyncio.run(until_stopped())

    thread = threading.Thread(target=role)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_request_its_env_server_never_answers_stops_the_run_naming_the_env_server(tmp_path, env_addresses, hung):
    orchestrator = make(tmp_path, hung, env_addresses)
    orchestrator.held_out = HeldOut(envs=[], sampling=orchestrator.plan.sampling)  # straight to step 0
    logs = tmp_path / "logs"
    logs.mkdir()
    with running(orchestrator, logs):
        since = busy(logs, "orchestrator", Stage.ENV_SERVER)
        code, said = judged_at(logs, WatchdogConfig(env_server=3600), since + 3600)
    assert code == STALLED_EXIT
    assert said.startswith("rl: stopping everything: orchestrator: no progress in env server (reverse-text task ")


def test_the_evaluation_after_the_last_step_is_the_eval_drain_and_cancelled_past_its_budget(tmp_path, env_addresses,
                                                                                           hung):
    orchestrator = make(tmp_path, hung, env_addresses, steps=2)
    orchestrator.next_step = 2  # its last batch handed over; the trainer is still training it
    folder, asked = orchestrator.folder, threading.Event()
    policy = folder.policy
    folder.policy = lambda base: (asked.set(), policy(base))[1]  # type: ignore[method-assign]
    logs = tmp_path / "logs"
    logs.mkdir()
    with running(orchestrator, logs):
        assert asked.wait(60)  # waiting for the last policy, which is not the drain yet
        published = time.time()
        folder.publish_policy(2, "policy")  # the trainer reached max_steps
        since = busy(logs, "orchestrator", Stage.EVAL_DRAIN)
        assert since >= published
        busy(logs, "orchestrator", Stage.ENV_SERVER)
        code, said = judged_at(logs, WatchdogConfig(eval_drain=300), since + 300)
    assert code == DRAIN_CANCELLED_EXIT
    assert said.startswith("rl: every step trained; the held-out evaluation after the last step was cancelled: "
                           "orchestrator: no progress in eval drain after step 2 for 300 s")


# --- the launcher: real role processes, stopped --------------------------------------------------------------
def stand_in(logs: Path, name: str, body: str) -> Role:
    """A role process that reports as `name` and runs `body` (Python, with `watch`, `Stage`, `beat`, `logs`)."""
    code = ("import sys, threading, time\nfrom pathlib import Path\n"
            "from tracegym.runtimes.watchdog import Stage, beat, reporting, watch\n"
            f"logs = Path({str(logs)!r})\nwith reporting(logs, {name!r}):\n"
            + "".join(f"    {line}\n" for line in body.splitlines()))
    log_path = logs / f"{name}.log"
    log = log_path.open("ab")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
    return Role(name, proc, log_path, log)


@pytest.fixture
def servers(tmp_path):
    """vLLM servers that stay up (never started: the roles here never call them)."""
    servers = VLLMServers(VLLMServerConfig(model="/m", log_path=tmp_path / "vllm.log", env={CORES_ENV: "0"}), 1)
    for server in servers.servers:
        server.running = lambda: True  # type: ignore[method-assign]
    return servers


def supervised(roles: list[Role], servers: VLLMServers, logs: Path, config: WatchdogConfig) -> tuple[int, str]:
    out = io.StringIO()
    with ShutdownDeadline(config.shutdown) as deadline:
        code = run_roles(roles, servers, out, ProgressFiles(logs, config), deadline)
    assert not any(process_alive(r.proc.pid) for r in roles)
    return code, out.getvalue()


STUCK = "threading.Event().wait()"


def test_the_launcher_stops_every_role_when_the_trainer_is_stuck_in_weight_sync(tmp_path, servers):
    roles = [stand_in(tmp_path, "trainer", f"with watch(Stage.WEIGHT_SYNC, 'of version 1'):\n    {STUCK}"),
             stand_in(tmp_path, "orchestrator", STUCK)]  # waiting for the next policy
    code, said = supervised(roles, servers, tmp_path, WatchdogConfig(weight_sync=0.5))
    assert code == STALLED_EXIT
    assert "rl: stopping everything: trainer: no progress in weight sync of version 1 for" in said


def test_a_run_whose_trainer_finished_cancels_an_eval_drain_that_makes_no_progress(tmp_path, servers):
    roles = [stand_in(tmp_path, "trainer", "pass"),  # reached max_steps and exited 0
             stand_in(tmp_path, "orchestrator", f"with watch(Stage.EVAL_DRAIN, 'after step 2'):\n    {STUCK}")]
    code, said = supervised(roles, servers, tmp_path, WatchdogConfig(eval_drain=0.5))
    assert code == DRAIN_CANCELLED_EXIT
    assert "the held-out evaluation after the last step was cancelled: orchestrator: no progress in eval drain" in said


def test_a_run_whose_trainer_finished_waits_for_an_eval_drain_that_progresses(tmp_path, servers):
    trained = tmp_path / "trained"
    roles = [stand_in(tmp_path, "trainer", f"Path({str(trained)!r}).touch()"),
             stand_in(tmp_path, "orchestrator", "with watch(Stage.EVAL_DRAIN, 'after step 2'):\n"
                      f"    while not Path({str(trained)!r}).exists(): time.sleep(0.02)\n"
                      "    beat(Stage.EVAL_DRAIN, 'held-out task 0 evaluated')")]
    code, said = supervised(roles, servers, tmp_path, WatchdogConfig())
    assert code == 0 and said.endswith("rl: done\n")
