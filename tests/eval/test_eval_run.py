"""Eval run: finding the work refuses keys it cannot tell apart, a run that leaves an expected pair without an
episode says so instead of exiting as if it were done, and a run is made of its parts."""

import io

import pytest

import tracegym as tg
from tracegym.core.episode import Episode
from tracegym.core.errors import InfrastructureError
from tracegym.eval.eval_config import parse_eval_args
from tracegym.eval.eval_parts import EvalParts, LocalEnvServer, eval_parts
from tracegym.eval.eval_run import (
    check_complete,
    check_unique_keys,
    execute,
    work_for,
)
from tracegym.eval.run_folder import RunFolder
from tracegym.models.model_choice import ModelChoice
from tracegym.testing import FakeOpenAIServer, make_trace


def test_a_taskset_giving_two_rows_one_key_is_refused():
    rows = list(tg.Taskset(id="t", data=[{"prompt": "a", "id": "k"}, {"prompt": "b"}, {"prompt": "c", "id": "k"}]))
    with pytest.raises(tg.UsageError, match=r"taskset 't' gives key 'k' to tasks 0 and 2"):
        check_unique_keys("t", rows)


def test_a_run_whose_episodes_came_back_under_other_keys_is_not_complete(tmp_path):
    taskset = tg.Taskset(id="t", data=[{"prompt": "same"}] * 2)
    rows = list(taskset)
    pairs = [(d, 0) for d in rows]
    folder = RunFolder.create(tmp_path, "t", "m")
    folder.log.append(Episode.solo(make_trace(task=rows[0])))
    folder.log.append(Episode.solo(make_trace(task=tg.TaskData(prompt="same"))))  # keyed by content, not position
    folder.log.close()
    with pytest.raises(InfrastructureError, match=r"1 of 2 episodes are not in the run folder after the run "
                                                  r"\(first: task '1' #0\)"):
        check_complete(pairs, folder)


def test_the_builder_picks_where_rollouts_run_from_the_config():
    taskset = tg.Taskset(id="t", data=[{"prompt": "a"}])
    local = eval_parts(parse_eval_args(["reverse-text", "-n", "3", "--taskset.max-words", "4"]), taskset)
    assert isinstance(local.env, LocalEnvServer) and local.env.taskset_id == "reverse-text"
    assert local.env.options["max_words"] == 4 and local.num_tasks == 3
    assert eval_parts(parse_eval_args(["reverse-text", "--no-serve"]), taskset).env is None
    address = parse_eval_args(["reverse-text", "--no-serve", "--env-address", "tcp://127.0.0.1:5555"])
    assert eval_parts(address, taskset).env == ["tcp://127.0.0.1:5555"]


def test_a_run_is_made_of_its_parts_without_a_config(tmp_path):
    def reversed_prompt(task, trace) -> float:
        return float(trace.last_reply == task.data.prompt[::-1])

    taskset = tg.Taskset(id="t", data=[{"prompt": "abc"}, {"prompt": "xy"}], rewards=[reversed_prompt])
    folder = RunFolder.create(tmp_path, "t", "m")
    out = io.StringIO()
    with FakeOpenAIServer(rule=lambda request: request.messages[-1].text[::-1], model="m") as server:
        parts = EvalParts(taskset, "t", ModelChoice(name="m", base_url=server.base_url), rollouts=2, rich=False)
        summary = execute(parts, folder, work_for(parts), out=out)
    assert (summary.num_traces, summary.reward) == (4, 1.0)
    assert "run folder:" in out.getvalue()
