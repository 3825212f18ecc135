"""A run cut at each point of a step resumes to the same final step with every group run once and trained once.

One run here is the orchestrator (real, against a real env server and the fake OpenAI server) and the trainer loop
(real, around a fake trainer whose weights are the trace ids it trained on, so a checkpoint says exactly which
samples its weights carry), interleaved in one process in a fixed order; a cut raises `Killed` at one point, which
ends both as kill -9 would end the run, and a resume builds both afresh from the run folder alone.
"""

import asyncio
import json
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tracegym.serve.env_client import EnvClient
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, JsonlLog, RLFolder
from tracegym.train.roles import orchestrator_for
from tracegym.train.trainer import STATE_FILE, WEIGHTS_FILE
from tracegym.train.trainer_loop import TrainerLoop

STEPS, TASKS, GROUP = 4, 3, 4
CONFIG = RLConfig.model_validate({
    "steps": STEPS, "checkpoint_every": 2, "trainer": {"model": "unused"}, "model": {"client": "chat"},
    "orchestrator": {"tasks_per_step": TASKS, "group_size": GROUP, "concurrency": 2 * GROUP, "max_async_steps": 1,
                     "train": {"envs": [{"id": "reverse-text"}]}}})


class Killed(Exception):
    """The run is killed here."""


class Model:
    """The fake model's rule: every other request for the same prompt gets the exact reversal (so any four of a
    group's requests are two right and two wrong), and the count of requests, which is the count of rollouts run."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, request) -> str:
        text = request.messages[-1].text
        with self.lock:
            self.seen[text] += 1
            right = self.seen[text] % 2 == 0
        return text[::-1] if right else "no idea"

    def requests(self) -> int:
        with self.lock:
            return sum(self.seen.values())


class FakeTrainer:
    """A trainer whose weights are the trace ids it trained on, in order, and which a checkpoint holds; `cut_at`:
    the checkpoint whose write is cut after the weights file."""

    is_lora = True
    dp = SimpleNamespace(main=True)
    model = torch.nn.Module()  # no weights of its own: the loop's digest of them is empty

    def __init__(self, cut_at: int | None = None) -> None:
        self.version, self.trained, self.cut_at = 0, list[str](), cut_at

    def step(self, samples) -> dict[str, float]:
        self.trained += [s.trace_id for s in samples]
        self.version += 1
        return {"loss": 0.0}

    def save_weights(self, path) -> Path:
        return Path(path)

    def save(self, path: Path, extra_state: dict) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        (path / WEIGHTS_FILE).write_text(json.dumps(self.trained))
        if self.version == self.cut_at:
            raise Killed(f"mid-write of checkpoint {path.name}")
        torch.save({"version": self.version, "extra": extra_state}, path / STATE_FILE)
        return path

    def load(self, path: Path) -> dict:
        self.trained = json.loads((path / WEIGHTS_FILE).read_text())
        state = torch.load(path / STATE_FILE, weights_only=False)
        self.version = state["version"]
        return state["extra"]


@pytest.fixture(scope="module")
def model():
    rule = Model()
    with FakeOpenAIServer(rule=rule) as server:
        yield rule, server


@pytest.fixture(scope="module")
def endpoints(model):
    _, server = model
    with local_server("reverse-text", {"seed": 0}, workers=1) as address:
        yield Endpoints(base_url=server.base_url, base_model=server.model, envs={"reverse-text": address})


async def run(folder: RLFolder, endpoints: Endpoints, trainer: FakeTrainer) -> FakeTrainer:
    """One run (or resume) to the end: the orchestrator makes its next batch whenever the served policy lets it
    (one step ahead of the trainer), else the trainer trains the next batch; as the launcher does, the folder is
    rewound first."""
    folder.rewind()
    orchestrator = orchestrator_for(CONFIG, folder, endpoints)
    loop = TrainerLoop(folder, trainer, lambda path, version: endpoints.base_model, steps=STEPS, checkpoint_every=2)
    step = loop.resume()
    try:
        while step < STEPS:
            version, _ = folder.policy(endpoints.base_model)
            if orchestrator.next_step < STEPS and orchestrator.staleness.may_start(orchestrator.next_step, version):
                await orchestrator.step(orchestrator.next_step)
            else:
                loop.step(step, folder.read_batch(step))
                step += 1
    finally:
        await orchestrator.aclose()
    return trainer


def groups(folder: RLFolder, step: int) -> Counter[str]:
    """The samples of each task in the batch of `step`."""
    return Counter(s.task_key for s in folder.read_batch(step).samples)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, endpoints):
    """The same run, never killed: each step's groups."""
    folder = RLFolder(tmp_path_factory.mktemp("reference"))
    asyncio.run(run(folder, endpoints, FakeTrainer()))
    return [groups(folder, step) for step in range(STEPS)]


def cut_group_start(monkeypatch, call: int) -> None:
    """Kill as the `call`-th group of the run starts its rollouts (other groups of its step in flight or done)."""
    episodes, calls = EnvClient.episodes, Counter[str]()

    async def counted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise Killed(f"group {call} starting")
        return await episodes(self, *args, **kwargs)

    monkeypatch.setattr(EnvClient, "episodes", counted)


def cut_batch(monkeypatch, step: int) -> None:
    """Kill after every group of `step` finished, before its batch is written."""
    write_batch = RLFolder.write_batch

    def cut(self, at, *args, **kwargs):
        if at == step:
            raise Killed(f"batch {step} not written")
        return write_batch(self, at, *args, **kwargs)

    monkeypatch.setattr(RLFolder, "write_batch", cut)


def cut_record(monkeypatch, step: int) -> None:
    """Kill after the batch of `step` is written, before its metrics record is."""
    append = JsonlLog.append

    def cut(self, record):
        if self.path.name == "metrics.jsonl" and record.get("step") == step:
            raise Killed(f"record of step {step} not written")
        return append(self, record)

    monkeypatch.setattr(JsonlLog, "append", cut)


def cut_checkpoint(monkeypatch, step: int) -> None:
    """Kill after the trainer trained and published `step` steps, before their checkpoint."""
    checkpoint = TrainerLoop.checkpoint

    def cut(self, at, orchestrator):
        if at == step:
            raise Killed(f"checkpoint {step} not begun")
        return checkpoint(self, at, orchestrator)

    monkeypatch.setattr(TrainerLoop, "checkpoint", cut)


def kill_then_resume(tmp_path, monkeypatch, endpoints, model, trainer: FakeTrainer | None = None):
    """Run until the armed cut kills the run, then resume it to the end; returns the folder, the final trainer,
    the groups that had finished in the unfinished step, the batches made before the kill, and the rollouts the
    resume ran."""
    rule, _ = model
    folder = RLFolder(tmp_path)
    with pytest.raises(Killed):
        asyncio.run(run(folder, endpoints, trainer or FakeTrainer()))
    monkeypatch.undo()
    made = len(list((tmp_path / "batches").glob("*.msgpack")))
    unfinished = tmp_path / "partial" / f"step-{made:06d}.jsonl"  # a later step's is dropped, its batch made
    kept = [json.loads(line) for line in unfinished.read_text().splitlines()] if unfinished.exists() else []
    before = rule.requests()
    final = asyncio.run(run(folder, endpoints, FakeTrainer()))
    return folder, final, kept, made, rule.requests() - before


def assert_exactly_once(folder: RLFolder, trainer: FakeTrainer, reference: list[Counter[str]]) -> None:
    """Every step trained once into the final weights, on the batch made for it, which holds the groups of the same
    tasks as a run never killed, whole; no sample twice; one metrics record per step."""
    assert [r["step"] for r in folder.trained_steps()] == list(range(STEPS))
    batches = [folder.read_batch(step).samples for step in range(STEPS)]
    assert trainer.trained == [s.trace_id for batch in batches for s in batch]
    assert len(set(trainer.trained)) == len(trainer.trained) == STEPS * TASKS * GROUP
    assert [groups(folder, step) for step in range(STEPS)] == reference
    assert [r["step"] for r in folder.metrics.read() if "step" in r] == list(range(STEPS))
    assert folder.latest_checkpoint().name == f"step-{STEPS:06d}"
    assert not list(folder.path.glob("partial/*.jsonl"))


def step_record(folder: RLFolder, step: int) -> dict:
    [record] = [r for r in folder.metrics.read() if r.get("step") == step]
    return record


def rollouts_left(made: int, kept: list[dict]) -> int:
    """The rollouts a resume must run: those of the steps whose batch was not made, but the groups kept."""
    return ((STEPS - made) * TASKS - len(kept)) * GROUP


def test_a_run_killed_while_a_steps_groups_run_keeps_the_finished_ones_and_runs_the_others_once(
        tmp_path, monkeypatch, endpoints, model, reference):
    cut_group_start(monkeypatch, call=2 * TASKS + 3)  # step 2's third group: one or two of its groups finished
    folder, trainer, kept, made, ran = kill_then_resume(tmp_path, monkeypatch, endpoints, model)
    assert made == 2 and 1 <= len(kept) <= 2
    assert ran == rollouts_left(made, kept)
    assert step_record(folder, 2)["groups_kept"] == len(kept)
    kept_ids = {e["id"] for group in kept for e in group["episodes"]}
    assert kept_ids <= {s.trace_id for s in folder.read_batch(2).samples}  # trained as they ran before the kill
    assert_exactly_once(folder, trainer, reference)


def test_a_run_killed_after_a_steps_rollouts_runs_none_of_them_again(
        tmp_path, monkeypatch, endpoints, model, reference):
    cut_batch(monkeypatch, step=2)
    folder, trainer, kept, made, ran = kill_then_resume(tmp_path, monkeypatch, endpoints, model)
    assert (made, len(kept)) == (2, TASKS) and ran == rollouts_left(made, kept)
    assert step_record(folder, 2)["groups_kept"] == TASKS
    assert_exactly_once(folder, trainer, reference)


def test_a_run_killed_between_a_batch_and_its_metrics_record_logs_the_step_once(
        tmp_path, monkeypatch, endpoints, model, reference):
    cut_record(monkeypatch, step=2)
    folder, trainer, kept, made, ran = kill_then_resume(tmp_path, monkeypatch, endpoints, model)
    assert made == 3 and ran == rollouts_left(made, kept)
    assert_exactly_once(folder, trainer, reference)


def test_a_run_killed_after_a_trainer_step_before_its_checkpoint_trains_the_kept_batches_again_once(
        tmp_path, monkeypatch, endpoints, model, reference):
    cut_checkpoint(monkeypatch, step=STEPS)  # steps 2 and 3 trained past checkpoint 2, which the resume starts at
    folder, trainer, _, made, ran = kill_then_resume(tmp_path, monkeypatch, endpoints, model)
    assert (made, ran) == (STEPS, 0)
    assert [r.get("resumed_from") for r in folder.trainer_metrics.read()] == [None] * STEPS + [2, None]
    assert_exactly_once(folder, trainer, reference)


def test_a_run_killed_mid_checkpoint_write_resumes_from_the_one_before(
        tmp_path, monkeypatch, endpoints, model, reference):
    folder, trainer, _, made, ran = kill_then_resume(tmp_path, monkeypatch, endpoints, model,
                                                     FakeTrainer(cut_at=STEPS))
    assert (made, ran) == (STEPS, 0)
    assert next(r for r in folder.trainer_metrics.read() if "resumed_from" in r)["resumed_from"] == 2
    assert_exactly_once(folder, trainer, reference)
