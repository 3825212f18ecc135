"""The RL run folder: its layout, the orchestrator/trainer exchange (batches and policy versions), checkpoints,
metrics files and the one poller."""

import asyncio
import shutil
from pathlib import Path

import pytest

import tracegym as tg
from tracegym.core.episode import SOLO, Episode
from tracegym.core.sample import Sample
from tracegym.core.trace import StopReason, Trace
from tracegym.testing import make_episode, make_trace
from tracegym.train.rl_folder import Endpoints, JsonlLog, Poll, RLFolder, step_name, step_of

LEGACY_RL = Path(__file__).parent.parent / "data" / "legacy_runs" / "rl"


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


def checkpointed(folder: RLFolder, step: int) -> None:
    path = folder.new_checkpoint(step)
    path.mkdir(parents=True)
    folder.complete(path, version=step)


def test_rewinding_keeps_the_batches_made_past_the_newest_checkpoint_and_forgets_the_served_policy(tmp_path):
    folder = RLFolder(tmp_path)
    for step in range(4):
        folder.write_batch(step, [], {"reward": step}, state={"next_step": step + 1})
    checkpointed(folder, 2)
    folder.publish_policy(3, "policy")
    assert folder.rewind() == 2
    assert all(folder.read_batch(s) is not None for s in range(4)) and folder.made_ahead(2) == [2, 3]
    assert folder.policy("base") == (0, "base")
    assert folder.resume_state() == {"next_step": 4}  # the orchestrator goes on after the newest batch


def test_rewinding_logs_a_kept_batch_whose_metrics_record_a_kill_cut_off(tmp_path):
    folder = RLFolder(tmp_path)
    folder.write_batch(0, [], {"reward": 0.5})  # killed before its record was appended
    folder.rewind()
    folder.rewind()
    assert [(r["step"], r["reward"]) for r in folder.metrics.read()] == [(0, 0.5)]


def test_rewinding_drops_the_finished_groups_of_a_step_whose_batch_was_made(tmp_path):
    folder = RLFolder(tmp_path)
    folder.write_batch(0, [])
    for step in (0, 1):
        folder.finished_groups(step).record(0, 0, [Episode.solo(make_trace())])
    folder.rewind()
    assert not folder.finished_groups(0).kept and folder.finished_groups(1).kept


def test_finished_groups_come_back_by_place_and_only_for_the_same_task(tmp_path):
    episode = Episode.solo(make_trace())
    RLFolder(tmp_path).finished_groups(3).record(0, 1, [episode])
    kept = RLFolder(tmp_path).finished_groups(3)
    assert kept.take(0, 1, "another task") is None
    kept = RLFolder(tmp_path).finished_groups(3)
    assert kept.take(0, 0, episode.task_key) is None and kept.take(1, 1, episode.task_key) is None
    assert kept.take(0, 1, episode.task_key) == [episode] and kept.taken == 1


def test_a_group_with_a_failed_rollout_is_not_kept_for_its_failure_may_be_the_kills(tmp_path):
    folder = RLFolder(tmp_path)
    cut = make_trace(error=tg.ErrorKind.INFRASTRUCTURE, stop_reason=StopReason.ERROR)
    folder.finished_groups(0).record(0, 0, [Episode.solo(make_trace()), Episode.solo(cut)])
    assert not folder.finished_groups(0).kept


def test_a_finished_group_cut_off_by_a_kill_is_dropped_and_the_next_one_starts_on_a_new_line(tmp_path):
    folder = RLFolder(tmp_path)
    episode = Episode.solo(make_trace())
    folder.finished_groups(0).record(0, 0, [episode])
    path = tmp_path / "partial" / "step-000000.jsonl"
    with path.open("a") as f:
        f.write('{"attempt": 0, "index": 1, "epis')
    resumed = folder.finished_groups(0)
    resumed.record(0, 2, [episode])
    assert sorted(folder.finished_groups(0).kept) == [(0, 0), (0, 2)]


def test_the_trained_steps_are_those_the_newest_weights_carry(tmp_path):
    folder = RLFolder(tmp_path)
    for record in ({"step": 0}, {"step": 1}, {"step": 2}, {"step": 1, "resumed_from": 1}, {"step": 2}):
        folder.trainer_metrics.append(record)
    assert [r["step"] for r in folder.trained_steps()] == [0, 1, 2]
    assert "resumed_from" in folder.trained_steps()[1]


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
    assert folder.read_config() == {"steps": 3}  # kept until the new one replaces it: a killed resume can resume
    assert list(folder.path.glob("config.before-*.toml"))


def test_a_step_of_rollouts_is_one_trace_a_line_and_one_solo_record_a_line(tmp_path):
    traces = [make_trace(), make_trace()]
    log = RLFolder(tmp_path).write_episodes(5, [Episode.solo(t) for t in traces])
    assert log.traces == tmp_path / "traces" / "step-000005.jsonl"
    assert [Trace.model_validate_json(line) for line in log.traces.read_text().splitlines()] == traces
    records = [Episode.model_validate_json(line) for line in log.episodes.read_text().splitlines()]
    assert log.episodes == tmp_path / "episodes" / "step-000005.jsonl"
    assert [(r.id, r.members, r.traces) for r in records] == [(t.id, [SOLO], {}) for t in traces]


def test_a_step_made_again_keeps_its_earlier_attempts_episodes(tmp_path):
    folder = RLFolder(tmp_path)
    first, second = Episode.solo(make_trace()), make_episode({"a": 1.0, "b": -1.0})
    folder.write_episodes(2, [first])
    folder.write_episodes(2, [second], keep=True)
    assert folder.step_log(2).read().episodes == [first, second]


def test_a_held_out_evaluation_is_an_episode_log_of_its_own_under_evals(tmp_path):
    folder = RLFolder(tmp_path)
    episode = Episode.solo(make_trace())
    log = folder.write_episodes(4, [episode], held_out="eval:reverse-text")
    assert log.traces == tmp_path / "evals" / "eval-reverse-text" / "traces" / "step-000004.jsonl"
    assert folder.step_log(4, held_out="eval:reverse-text").read().episodes == [episode]
    assert (folder.steps(), folder.steps(held_out="eval:reverse-text")) == ([], [4])
    assert folder.held_out_envs() == ["eval-reverse-text"]


# --- a folder written before every run was an episode ---------------------------------------------------------------
@pytest.fixture
def legacy_rl(tmp_path) -> RLFolder:
    """A copy of the RL run folder the code of 2be8836 wrote (tests/data/legacy_runs/README.md): steps 1 and 2 with
    single-agent traces and multi-agent episodes (their traces inside), and a held-out kuhn-poker evaluation."""
    return RLFolder(Path(shutil.copytree(LEGACY_RL, tmp_path / "rl")))


def test_an_old_folders_steps_read_as_episodes_of_both_shapes(legacy_rl):
    for step, rollouts, games in ((1, 4, 2), (2, 2, 1)):
        read = legacy_rl.step_log(step).read()
        assert sorted(e.is_solo for e in read.episodes) == [False] * games + [True] * rollouts
        assert all(e.traces for e in read.episodes) and (read.bad_lines, read.cut_short) == (0, 0)
        assert len(read.traces) == rollouts + 2 * games


def test_an_old_folders_held_out_evaluation_reads_as_its_episodes(legacy_rl):
    [episode] = legacy_rl.step_log(0, held_out="eval-kuhn-poker").read().episodes
    assert episode.members == ["player_0", "player_1"] and set(episode.traces) == {"player_0", "player_1"}


def test_an_old_folders_steps_and_held_out_evaluations_are_listed(legacy_rl):
    assert legacy_rl.steps() == [1, 2]
    assert legacy_rl.held_out_envs() == ["eval-kuhn-poker"]
    assert legacy_rl.steps(held_out="eval-kuhn-poker") == [0]
