"""Tracking: the records of `metrics.jsonl` and a sample table of each step's traces reach W&B (offline: no
network; read back from the run's own files) and TensorBoard (read back with tensorboard's event reader), from the
one place records are appended; a tracker enabled but not installed is refused naming its key."""

import asyncio
import json
import struct
import sys
from pathlib import Path

import pytest
from test_orchestrator import alternating_per_prompt, env_addresses  # noqa: F401 (env_addresses: a fixture)

from tracegym.core.episode import Episode
from tracegym.core.errors import UsageError
from tracegym.core.messages import assistant, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import RewardScore, Trace
from tracegym.testing import FakeOpenAIServer
from tracegym.train.rl_config import RLConfig, parse_rl_args
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for
from tracegym.train.tracking import TrackingConfig, build_tracking, markdown_table, scalars

RECORDS = [
    {"eval_step": 0, "env": "reverse-text", "policy_version": 0, "eval_reward": 0.25, "eval_n": 3},
    {"step": 0, "reward": 0.5, "failed/timeout": 1, "staleness": None},
    {"step": 0, "invalid_trace": "no logprobs", "problems": 2},
    {"step": 1, "reward": 0.75, "difficulty/reverse-text/refills": 2},
    {"empty_batch": 2, "attempt": 1, "rollouts": 8},  # no step of its own: at the latest one, named by its kind
]


def trace(prompt: str, reply: str, reward: float, index: int) -> Trace:
    t = Trace(taskset="reverse-text", task=TaskData(prompt=prompt, id=prompt), rollout_index=index)
    t.graph.add(user(prompt))
    t.prompt_length = 1
    t.graph.add(assistant(reply))
    t.rewards["lcs"] = RewardScore(score=reward)
    return t


TRACES = [trace("abc", "cba", 1.0, 0), trace("abc", "abc", 0.3, 1), trace("xyz", "zyx", 1.0, 0)]


def track(folder: RLFolder, **config) -> None:
    """What a run does: records and traces appended through the folder, then the tracker finished."""
    tracking = build_tracking(TrackingConfig.model_validate(config), folder.path, {"steps": 2})
    assert tracking is not None
    folder.track(tracking)
    for record in RECORDS:
        folder.metrics.append(record)
    folder.write_episodes(1, [Episode.solo(t) for t in TRACES])
    folder.close()


def test_records_become_step_indexed_numbers_named_by_their_kind():
    assert [scalars(r) for r in RECORDS] == [
        (0, {"eval/reverse-text/policy_version": 0.0, "eval/reverse-text/eval_reward": 0.25,
             "eval/reverse-text/eval_n": 3.0}),
        (0, {"reward": 0.5, "failed/timeout": 1.0}),
        (0, {"invalid_trace/problems": 2.0}),
        (1, {"reward": 0.75, "difficulty/reverse-text/refills": 2.0}),
        (None, {"empty_batch": 2.0, "empty_batch/attempt": 1.0, "empty_batch/rollouts": 8.0})]


def test_the_sample_table_escapes_what_would_break_a_markdown_table():
    assert markdown_table([[1, "a|b", "two\nlines"]]).splitlines()[-1] == "| 1 | a\\|b | two<br>lines |"


# --- W&B, offline ---------------------------------------------------------------------------------------------------
@pytest.fixture
def wandb_home(tmp_path, monkeypatch):
    """W&B's own settings and caches under tmp, and nothing that could reach the network."""
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def wandb_records(run_file: Path) -> list:
    """The records of an offline run's `.wandb` file: a LevelDB-style log (7-byte file header; 32 KiB blocks of
    chunks, each `crc32, length, type` then data; type 1 a whole record, 2/3/4 its first/middle/last part)."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, part, records = run_file.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            records.append(record)
            part = b""
    return records


def test_wandb_offline_holds_every_record_and_the_sample_table(tmp_path, wandb_home):
    folder = RLFolder(tmp_path / "run")
    folder.path.mkdir()
    track(folder, wandb={"project": "tracegym-test", "mode": "offline"}, samples=2)

    [run_file] = (folder.path / "wandb").glob("offline-run-*/run-*.wandb")
    history = {}
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(items["_step"], {}).update(items)
    assert history[0]["eval/reverse-text/eval_reward"] == 0.25 and history[0]["reward"] == 0.5
    assert history[0]["failed/timeout"] == 1 and history[0]["invalid_trace/problems"] == 2
    assert history[1]["reward"] == 0.75 and history[1]["difficulty/reverse-text/refills"] == 2
    assert history[1]["empty_batch/attempt"] == 1 and history[1]["empty_batch/rollouts"] == 8
    table = json.loads((run_file.parent / "files" / history[1]["samples/path"]).read_text())
    assert table["columns"] == ["step", "taskset", "task", "prompt", "completion", "reward"]
    assert table["data"] == [[1, "reverse-text", "abc", "abc", "cba", 1.0],  # the first rollout of each task
                             [1, "reverse-text", "xyz", "xyz", "zyx", 1.0]]


# --- TensorBoard ----------------------------------------------------------------------------------------------------
def tensorboard_events(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return events


def test_tensorboard_event_files_hold_the_scalars_and_the_sample_table(tmp_path):
    folder = RLFolder(tmp_path)
    track(folder, tensorboard=True, samples=3)
    events = tensorboard_events(tmp_path / "tensorboard")
    assert [(e.step, e.value) for e in events.Scalars("reward")] == [(0, 0.5), (1, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("eval/reverse-text/eval_reward")] == [(0, 0.25)]
    assert [e.step for e in events.Scalars("difficulty/reverse-text/refills")] == [1]
    assert [(e.step, e.value) for e in events.Scalars("empty_batch/rollouts")] == [(1, 8.0)]
    [text] = events.Tensors("samples")
    table = text.tensor_proto.string_val[0].decode()
    assert text.step == 1 and table.count("| 1 | reverse-text |") == 3 and "| abc | cba | 1.0 |" in table


def test_a_step_of_the_orchestrator_reaches_the_tracker_once_per_record(tmp_path, env_addresses):  # noqa: F811
    """The orchestrator's own records (a held-out evaluation, a step) and its traces, through the run folder."""
    with FakeOpenAIServer(rule=alternating_per_prompt()) as server:
        config = RLConfig.model_validate({
            "trainer": {"model": "unused"}, "model": {"client": "chat"}, "tracking": {"tensorboard": True},
            "orchestrator": {"tasks_per_step": 2, "group_size": 4,
                             "eval": {"envs": [{"id": "reverse-text", "options": {"seed": 9}}], "num_tasks": 3}}})
        endpoints = Endpoints(base_url=server.base_url, base_model=server.model, envs=env_addresses)
        orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)

        async def evaluate_and_step():
            try:
                await orchestrator.evaluate(0)
                orchestrator.hand_over(0, *await orchestrator.collect(0, 0, orchestrator.endpoint.model))
            finally:
                await orchestrator.aclose()

        asyncio.run(evaluate_and_step())
    events = tensorboard_events(tmp_path / "tensorboard")
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [e.value for e in events.Scalars("rollouts")] == [r["rollouts"] for r in logged if "rollouts" in r] == [8]
    assert [e.value for e in events.Scalars("eval/reverse-text/eval_n")] == [3]
    assert len(events.Tensors("samples")) == 1


# --- not installed ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("module", "flag", "key"), [("wandb", "--tracking.wandb.mode", "tracking.wandb"),
                                                     ("tensorboard", "--tracking.tensorboard", "tracking.tensorboard")])
def test_a_tracker_enabled_but_not_installed_is_refused_naming_its_key(monkeypatch, module, flag, key):
    monkeypatch.setitem(sys.modules, module, None)  # importing it now fails, as when it is not installed
    args = ["--trainer.model", "tiny", flag, *(["offline"] if module == "wandb" else [])]
    with pytest.raises(UsageError, match=rf"{key} needs the `{module}` package, which is not installed"):
        parse_rl_args(args)
    with pytest.raises(UsageError, match=rf"{key} needs the `{module}` package"):
        on = {"wandb": None, "tensorboard": True} if module == "tensorboard" else {"wandb": {}, "tensorboard": False}
        build_tracking(TrackingConfig.model_construct(samples=1, **on), Path("."), {})  # a config checked elsewhere


# --- the trainer's records ------------------------------------------------------------------------------------------
TRAINER_RECORDS = [{"step": 0, "loss": 0.5, "train_s": 2.0, "weights_digest": "ab12"},
                   {"step": 1, "loss": 0.25, "train_s": 1.5, "weights_digest": "cd34"}]


def test_the_trainers_records_reach_tensorboard_as_trainer_numbers_at_their_steps(tmp_path):
    folder = RLFolder(tmp_path)
    tracking = build_tracking(TrackingConfig(tensorboard=True), folder.path, {})
    assert tracking is not None
    folder.track(tracking)
    folder.metrics.append({"step": 3, "reward": 0.5})  # the orchestrator is ahead of the trainer
    for record in TRAINER_RECORDS:
        folder.trainer_metrics.append(record)
    folder.mirror_trainer()
    folder.close()  # follows again: nothing is logged twice
    events = tensorboard_events(tmp_path / "tensorboard")
    assert [(e.step, e.value) for e in events.Scalars("trainer/loss")] == [(0, 0.5), (1, 0.25)]
    assert "trainer/weights_digest" not in events.Tags()["scalars"]


def test_wandb_offline_holds_the_trainers_numbers_on_their_own_axis(tmp_path, wandb_home):
    folder = RLFolder(tmp_path / "run")
    folder.path.mkdir()
    tracking = build_tracking(TrackingConfig.model_validate({"wandb": {"mode": "offline"}}), folder.path, {})
    assert tracking is not None
    folder.track(tracking)
    folder.metrics.append({"step": 3, "reward": 0.5})
    for record in TRAINER_RECORDS:
        folder.trainer_metrics.append(record)
    folder.close()
    [run_file] = (folder.path / "wandb").glob("offline-run-*/run-*.wandb")
    logged = []
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            if "trainer/step" in items:
                logged.append((items["trainer/step"], items["trainer/loss"]))
    assert logged == [(0, 0.5), (1, 0.25)]


def test_a_followed_log_returns_only_whole_lines_once(tmp_path):
    folder = RLFolder(tmp_path)
    folder.trainer_metrics.append({"step": 0})
    with folder.trainer_metrics.path.open("a") as f:
        f.write('{"step": 1')  # the trainer is writing this line now
    assert [r["step"] for r in folder.trainer_metrics.read_new()] == [0]
    with folder.trainer_metrics.path.open("a") as f:
        f.write('}\n')
    assert [r["step"] for r in folder.trainer_metrics.read_new()] == [1]
    assert folder.trainer_metrics.read_new() == []
