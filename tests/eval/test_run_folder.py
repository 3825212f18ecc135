"""Run folders: layout, one episode log of every run (rows users read as traces), its side logs, and what a killed
writer leaves tolerated and repaired."""

import json

import pytest

import tracegym as tg
from tracegym.core.episode import Episode
from tracegym.eval.run_folder import RunFolder
from tracegym.testing.traces import make_trace


def _folder(tmp_path) -> RunFolder:
    return RunFolder.create(tmp_path, "reverse-text", "Org/My Model", run_id="r1")


def test_a_new_folder_is_named_by_taskset_model_and_run_id(tmp_path):
    folder = _folder(tmp_path)
    assert folder.path == tmp_path / "reverse-text--My_Model" / "r1" and folder.logs.is_dir()


def test_creating_over_an_existing_run_is_refused(tmp_path):
    _folder(tmp_path)
    with pytest.raises(tg.UsageError, match="already exists"):
        _folder(tmp_path)


def test_a_folder_without_config_is_not_a_run_folder(tmp_path):
    with pytest.raises(tg.UsageError, match="not a run folder"):
        RunFolder.open(tmp_path)


def test_a_single_agent_run_stores_one_trace_a_line_and_a_solo_record_each(tmp_path):
    folder = _folder(tmp_path)
    traces = [make_trace(reward=r / 10, rollout_index=r) for r in range(3)]
    for trace in traces:
        folder.log.append(Episode.solo(trace))
    folder.log.close()
    rows = folder.traces_path.read_text().splitlines()
    assert [tg.Trace.model_validate_json(row) for row in rows] == traces
    records = [json.loads(line) for line in (folder.path / "episodes.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [t.id for t in traces] and all("traces" not in r for r in records)


def test_appended_episodes_read_back_in_order(tmp_path):
    folder = _folder(tmp_path)
    traces = [make_trace(rollout_index=r) for r in range(3)]
    for trace in traces:
        folder.log.append(Episode.solo(trace))
    folder.log.close()
    assert [e.episode_index for e in folder.log.read().episodes] == [0, 1, 2]


def test_errored_and_rescored_logs_lie_beside_the_runs_own(tmp_path):
    folder = _folder(tmp_path)
    rescored = folder.side_log("rescored-x")
    assert (folder.errored.traces.name, folder.errored.episodes.name) == ("traces.errored.jsonl",
                                                                          "episodes.errored.jsonl")
    assert (rescored.traces.parent, rescored.episodes.name) == (folder.path, "episodes.rescored-x.jsonl")


def test_repair_keeps_a_complete_last_line_that_lost_only_its_newline(tmp_path):
    folder = _folder(tmp_path)
    folder.traces_path.write_text(make_trace().model_dump_json())
    assert not folder.log.repair()
    assert len(folder.log.read().episodes) == 1
    assert folder.traces_path.read_text().endswith("\n")


def test_a_corrupt_middle_line_is_skipped_and_counted(tmp_path):
    folder = _folder(tmp_path)
    good = make_trace().model_dump_json() + "\n"
    folder.traces_path.write_text(good + "not json\n" + make_trace().model_dump_json() + "\n")
    read = folder.log.read()
    assert len(read.traces) == 2 and read.bad_lines == 1 and not read.truncated_tail
