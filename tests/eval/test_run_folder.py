"""Run folders: layout, appends that survive a kill, a truncated last line tolerated and repaired."""

import pytest

import tracegym as tg
from tracegym.eval.run_folder import RunFolder, read_trace_file
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


def test_appended_traces_read_back_in_order(tmp_path):
    folder = _folder(tmp_path)
    traces = [make_trace(reward=r / 10, rollout_index=r) for r in range(3)]
    for trace in traces:
        folder.append(trace)
    folder.close()
    assert [t.id for t in folder.read_traces().traces] == [t.id for t in traces]


def test_a_truncated_last_line_is_tolerated_and_counted(tmp_path):
    folder = _folder(tmp_path)
    folder.append(make_trace())
    folder.close()
    with folder.traces_path.open("a") as f:
        f.write(make_trace().model_dump_json()[:50])
    read = folder.read_traces()
    assert len(read.traces) == 1 and read.truncated_tail and read.bad_lines == 0


def test_repair_cuts_the_truncated_line_so_appends_start_clean(tmp_path):
    folder = _folder(tmp_path)
    folder.append(make_trace())
    folder.close()
    with folder.traces_path.open("a") as f:
        f.write('{"schema_version": 1, "id": "cut')
    assert folder.repair()
    folder.append(make_trace())
    folder.close()
    read = folder.read_traces()
    assert len(read.traces) == 2 and not read.truncated_tail


def test_repair_keeps_a_complete_last_line_that_lost_only_its_newline(tmp_path):
    folder = _folder(tmp_path)
    folder.traces_path.write_text(make_trace().model_dump_json())
    assert not folder.repair()
    assert len(read_trace_file(folder.traces_path).traces) == 1
    assert folder.traces_path.read_text().endswith("\n")


def test_a_corrupt_middle_line_is_skipped_and_counted(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(make_trace().model_dump_json() + "\nnot json\n" + make_trace().model_dump_json() + "\n")
    read = read_trace_file(path)
    assert len(read.traces) == 2 and read.bad_lines == 1
