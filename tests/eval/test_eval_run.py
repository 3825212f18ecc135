"""Eval run: the plan refuses keys it cannot tell apart, and a run that leaves a planned rollout without a
trace says so instead of exiting as if it were done."""

import pytest

import tracegym as tg
from tracegym.core.errors import InfrastructureError
from tracegym.eval.eval_run import Plan, check_complete, check_unique_keys
from tracegym.eval.run_folder import RunFolder
from tracegym.testing import make_trace


def test_a_taskset_giving_two_rows_one_key_is_refused():
    rows = list(tg.Taskset(id="t", data=[{"prompt": "a", "id": "k"}, {"prompt": "b"}, {"prompt": "c", "id": "k"}]))
    with pytest.raises(tg.UsageError, match=r"taskset 't' gives key 'k' to tasks 0 and 2"):
        check_unique_keys("t", rows)


def test_a_run_whose_traces_came_back_under_other_keys_is_not_complete(tmp_path):
    taskset = tg.Taskset(id="t", data=[{"prompt": "same"}] * 2)
    rows = list(taskset)
    pairs = [(d, 0) for d in rows]
    folder = RunFolder.create(tmp_path, "t", "m")
    folder.append(make_trace(task=rows[0]))
    folder.append(make_trace(task=tg.TaskData(prompt="same")))  # keyed by content, not by its position
    folder.close()
    with pytest.raises(InfrastructureError, match=r"1 of 2 rollouts have no trace after the run \(first: task '1'"):
        check_complete(Plan(taskset, pairs, pairs), folder.read_traces().traces, folder)
