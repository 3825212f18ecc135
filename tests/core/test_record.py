"""Records refuse fields they do not know, naming them, instead of dropping them (issue 34, item 9)."""

import json

import pytest
from pydantic import ValidationError

from tracegym.config.episode_log import EpisodeLog
from tracegym.core.episode import Episode
from tracegym.core.record import record_problem
from tracegym.core.sample import Sample
from tracegym.core.trace import Trace
from tracegym.testing import make_trace


def _with_unknown_node_field(trace: Trace) -> str:
    data = json.loads(trace.model_dump_json())
    data["graph"]["nodes"][0]["message"]["audio"] = {"id": "x"}
    return json.dumps(data)


def test_a_trace_with_an_unknown_nested_field_is_refused_naming_its_path():
    with pytest.raises(ValidationError) as caught:
        Trace.model_validate_json(_with_unknown_node_field(make_trace()))
    assert record_problem(caught.value).startswith("unknown field(s) graph.nodes.0.message.audio")


def test_an_unknown_top_level_trace_field_is_refused():
    data = json.loads(make_trace().model_dump_json()) | {"judge_calls": []}
    with pytest.raises(ValidationError, match="judge_calls"):
        Trace.model_validate(data)


def test_a_sample_with_an_unknown_field_is_refused():
    with pytest.raises(ValidationError, match="pixel_values"):
        Sample.model_validate({"token_ids": [1], "loss_mask": [True], "logprobs": [0.0], "pixel_values": [0.5]})


def test_a_task_rows_own_fields_still_read_back_on_a_trace():
    trace = make_trace()
    data = json.loads(trace.model_dump_json())
    data["task"]["difficulty"] = 3
    assert Trace.model_validate(data).task.model_extra == {"difficulty": 3} | (trace.task.model_extra or {})


def test_the_episode_log_names_the_unknown_field_of_the_line_it_skips(tmp_path):
    log = EpisodeLog(tmp_path / "traces.jsonl", tmp_path / "episodes.jsonl")
    log.write([Episode.solo(make_trace())])
    log.traces.write_text(_with_unknown_node_field(make_trace()) + "\n" + log.traces.read_text())
    read = log.read()
    assert read.bad_lines == 1 and len(read.episodes) == 1
    assert read.problems[log.traces].startswith("line 1: unknown field(s) graph.nodes.0.message.audio")
