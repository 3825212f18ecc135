"""The episode log: one on-disk form for every run folder, what a killed writer leaves, and the old layouts."""

from pathlib import Path

from tracegym.config.episode_log import EpisodeLog
from tracegym.core.episode import SOLO, Episode
from tracegym.testing import make_episode, make_trace

LEGACY = Path(__file__).parent.parent / "data" / "legacy_runs"


def _log(root: Path) -> EpisodeLog:
    return EpisodeLog(root / "traces.jsonl", root / "episodes.jsonl")


def test_appended_solo_and_multi_agent_episodes_read_back_equal(tmp_path):
    log = _log(tmp_path)
    written = [Episode.solo(make_trace(reward=0.5)), make_episode({"a": 1.0, "b": -1.0})]
    for episode in written:
        log.append(episode)
    log.close()
    assert log.read().episodes == written


def test_the_traces_file_holds_every_member_trace_and_the_records_hold_none(tmp_path):
    log = _log(tmp_path)
    log.write([Episode.solo(make_trace()), make_episode({"a": 1.0, "b": -1.0})])
    assert len(log.traces.read_text().splitlines()) == 3
    assert '"traces"' not in log.episodes.read_text()


def test_a_solo_record_names_its_trace_which_the_rollout_left_unchanged(tmp_path):
    trace = make_trace()
    log = _log(tmp_path)
    log.write([Episode.solo(trace)])
    [episode] = log.read().episodes
    assert episode.id == trace.id and episode.members == [SOLO]
    assert episode.traces[SOLO].episode_id is None and episode.traces[SOLO] == trace


def test_a_solo_trace_whose_record_was_never_written_is_read_as_its_episode(tmp_path):
    log = _log(tmp_path)
    log.write([Episode.solo(make_trace())])
    log.episodes.unlink()
    read = log.read()
    assert [e.is_solo for e in read.episodes] == [True] and read.cut_short == 0


def test_member_traces_of_an_episode_without_its_record_are_left_out_and_counted(tmp_path):
    log = _log(tmp_path)
    log.write([make_episode({"a": 1.0, "b": -1.0})])
    log.episodes.unlink()
    read = log.read()
    assert read.episodes == [] and read.cut_short == 1


def test_a_line_cut_off_is_skipped_and_repair_cuts_it_before_more_is_appended(tmp_path):
    log = _log(tmp_path)
    log.append(make_episode({"a": 1.0, "b": -1.0}))
    log.close()
    with log.episodes.open("a") as f:
        f.write('{"schema_version": 1, "id": "cut')
    assert log.read().truncated_tail and len(log.read().episodes) == 1
    assert log.repair()
    log.append(Episode.solo(make_trace()))
    log.close()
    read = log.read()
    assert not read.truncated_tail and read.bad_lines == 0 and len(read.episodes) == 2


def test_write_with_keep_adds_to_what_the_files_hold(tmp_path):
    log = _log(tmp_path)
    log.write([Episode.solo(make_trace(rollout_index=0))])
    log.write([Episode.solo(make_trace(rollout_index=1))], keep=True)
    assert [e.episode_index for e in log.read().episodes] == [0, 1]


def test_an_old_single_agent_eval_folder_reads_as_solo_episodes_of_its_traces():
    read = _log(LEGACY / "eval-reverse-text").read()
    assert len(read.episodes) == 6 and all(e.is_solo for e in read.episodes)
    assert sorted((e.task_key, e.episode_index) for e in read.episodes) == sorted(
        (t.task_key, t.rollout_index) for t in read.traces)
    assert all(e.rewards[SOLO] == e.traces[SOLO].reward for e in read.episodes)


def test_an_old_multi_agent_eval_folder_reads_with_every_member_trace():
    read = _log(LEGACY / "eval-kuhn-poker").read()
    assert len(read.episodes) == 3
    assert all(set(e.traces) == set(e.members) == {"player_0", "player_1"} for e in read.episodes)


def test_an_old_rl_step_reads_its_rollouts_and_its_episodes_with_their_traces_inside():
    rl = LEGACY / "rl"
    read = EpisodeLog(rl / "traces" / "step-000001.jsonl", rl / "episodes" / "step-000001.jsonl").read()
    solo = [e for e in read.episodes if e.is_solo]
    games = [e for e in read.episodes if not e.is_solo]
    assert len(solo) == 4 and len(games) == 2
    assert all(set(e.traces) == set(e.members) for e in games)
