"""The RL run folder: its layout, the orchestrator/trainer exchange (batches and policy versions), checkpoints,
metrics files and the one poller."""

import asyncio

import pytest

import tracegym as tg
from tracegym.core.sample import Sample
from tracegym.testing import make_trace
from tracegym.train.rl_folder import Endpoints, JsonlLog, Poll, RLFolder, step_name, step_of


def _sample(advantage: float) -> Sample:
    return Sample(token_ids=[1, 2, 3], loss_mask=[False, True, True], logprobs=[0.0, -0.5, -0.7],
                  advantage=advantage, policy_version=0)


def test_a_written_batch_reads_back_equal(tmp_path):
    samples = [_sample(1.0), _sample(-1.0)]
    RLFolder(tmp_path).write_batch(3, samples, {"reward": 0.5})
    batch = RLFolder(tmp_path).read_batch(3)
    assert (batch.samples, batch.meta) == (samples, {"reward": 0.5})


def test_a_batch_carries_the_orchestrators_state_to_the_trainer(tmp_path):
    RLFolder(tmp_path).write_batch(0, [], {}, state={"next_step": 1, "rng": [3, [1, 2], None]})
    assert RLFolder(tmp_path).read_batch(0).state == {"next_step": 1, "rng": [3, [1, 2], None]}


def test_a_batch_not_yet_written_reads_as_none(tmp_path):
    assert RLFolder(tmp_path).read_batch(0) is None


def test_before_any_step_the_base_model_is_served_as_version_0(tmp_path):
    assert RLFolder(tmp_path).policy("base") == (0, "base")


def test_a_published_policy_is_current(tmp_path):
    RLFolder(tmp_path).publish_policy(4, "policy")
    assert RLFolder(tmp_path).policy("base") == (4, "policy")


def test_waiting_gives_up_when_the_other_side_is_gone(tmp_path):
    with pytest.raises(tg.InfrastructureError, match="gone"):
        Poll("a batch", timeout=5, alive=lambda: False).wait(lambda: None)


def test_waiting_gives_up_after_the_timeout(tmp_path):
    with pytest.raises(tg.InfrastructureError, match="after"):
        Poll("a batch", timeout=0.1).wait(lambda: None)


def test_waiting_without_blocking_the_loop_returns_the_first_truthy_value():
    looks = iter([None, 0, "found"])
    assert asyncio.run(Poll("a file", timeout=5, every=0.01).wait_async(lambda: next(looks))) == "found"


def test_a_step_is_named_and_parsed_in_one_way(tmp_path):
    assert step_name(7) == "step-000007"
    assert step_of(tmp_path / "batches" / "step-000007.msgpack") == step_of(tmp_path / "step-000007") == 7
    with pytest.raises(tg.UsageError, match="step-N"):
        step_of(tmp_path / "latest")


def test_the_newest_complete_checkpoint_is_the_latest_and_an_unfinished_one_is_not(tmp_path):
    folder = RLFolder(tmp_path)
    assert folder.latest_checkpoint() is None
    for step in (2, 10):
        path = folder.new_checkpoint(step)
        path.mkdir(parents=True)
        folder.complete(path, version=step)
    folder.new_checkpoint(12).mkdir()  # killed mid-write: no DONE marker
    assert folder.latest_checkpoint().name == "step-000010"


def test_rewinding_drops_batches_past_the_newest_checkpoint_and_the_served_policy(tmp_path):
    folder = RLFolder(tmp_path)
    for step in range(4):
        folder.write_batch(step, [])
    path = folder.new_checkpoint(2)
    path.mkdir(parents=True)
    folder.complete(path, version=2)
    folder.publish_policy(3, "policy")
    assert folder.rewind() == 2
    assert [folder.read_batch(s) is not None for s in range(4)] == [True, True, False, False]
    assert folder.policy("base") == (0, "base")


def test_a_metrics_log_stamps_records_and_skips_a_line_cut_off_by_a_killed_writer(tmp_path):
    log = JsonlLog(tmp_path / "metrics.jsonl")
    log.append({"step": 0})
    with log.path.open("a") as f:
        f.write('{"step": 1, "rew')
    [record] = log.read()
    assert record["step"] == 0 and record["time"] > 0


def test_endpoints_and_config_round_trip_and_a_missing_one_is_named(tmp_path):
    folder = RLFolder(tmp_path)
    with pytest.raises(tg.UsageError, match=r"endpoints\.json"):
        folder.read_endpoints()
    endpoints = Endpoints(base_url="http://127.0.0.1:8000/v1", base_model="m", envs={"reverse-text": "tcp://x:1"})
    folder.write_endpoints(endpoints)
    folder.write_config({"steps": 3})
    assert (folder.read_endpoints(), folder.read_config()) == (endpoints, {"steps": 3})


def test_a_new_folder_refuses_an_existing_one_and_a_resume_needs_a_config(tmp_path):
    folder = RLFolder.create(tmp_path, "r")
    with pytest.raises(tg.UsageError, match="already exists"):
        RLFolder.create(tmp_path, "r")
    with pytest.raises(tg.UsageError, match=r"no config\.toml"):
        RLFolder.resume(folder.path)
    folder.write_config({"steps": 3})
    RLFolder.resume(folder.path)
    assert not folder.config_path.exists() and list(folder.path.glob("config.before-*.toml"))


def test_the_traces_of_a_step_are_one_json_line_each(tmp_path):
    path = RLFolder(tmp_path).write_traces(5, [make_trace(), make_trace()])
    assert path == tmp_path / "traces" / "step-000005.jsonl" and len(path.read_text().splitlines()) == 2
