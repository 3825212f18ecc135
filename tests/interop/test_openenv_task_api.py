"""An OpenEnv environment that lists its tasks (OpenEnv's Task API) runs as a taskset of one split: each task reset
with its split and index, its spec kept; an unknown split, or a server without the API, is one line naming it."""

import asyncio

import pytest
from openenv_reference import bisect, guess_server, listed_guess_server

from tracegym import run_rollout
from tracegym.core.errors import UsageError
from tracegym.interop.openenv_taskset import OpenEnvTaskset
from tracegym.testing import ScriptedModel


def test_a_split_of_the_task_api_is_the_tasksets_tasks_each_reset_by_its_index():
    with listed_guess_server() as url:
        taskset = OpenEnvTaskset({"url": url, "split": "test"})
        rows = list(taskset)
        assert [(r.id, r.reset, r.spec) for r in rows] == [
            ("test-0", {"split": "test", "index": 0}, {"id": "test-0", "target": 44}),
            ("test-1", {"split": "test", "index": 1}, {"id": "test-1", "target": 55})]
        traces = [asyncio.run(run_rollout(taskset, row, ScriptedModel(rule=bisect))) for row in rows]
    guesses = [[m.tool_calls[0].arguments for m in t.completion if m.tool_calls] for t in traces]
    assert [t.reward for t in traces] == [1.0, 1.0]
    assert guesses[0][-1] == '{"guess": 44}' and guesses[1][-1] == '{"guess": 55}'


def test_num_tasks_takes_the_first_tasks_of_the_split():
    with listed_guess_server() as url:
        assert [r.id for r in OpenEnvTaskset({"url": url, "split": "train", "num_tasks": 2})] == ["train-0", "train-1"]


def test_an_unknown_split_is_refused_naming_the_servers_splits():
    with listed_guess_server() as url, pytest.raises(UsageError, match=r"split 'dev' cannot be read .*its splits: "
                                                                       r"train, test"):
        list(OpenEnvTaskset({"url": url, "split": "dev"}))


def test_a_split_on_a_server_without_the_task_api_is_refused_naming_the_server():
    with guess_server() as url, pytest.raises(UsageError, match=f"OpenEnv server {url} has no Task API"):
        list(OpenEnvTaskset({"url": url, "split": "test"}))


def test_our_server_lists_its_tasksets_tasks_as_one_split_that_our_client_runs_by_index():
    import httpx

    from tracegym.envs.registry import load_taskset
    from tracegym.interop.openenv_server import OpenEnvServer

    served = load_taskset("reverse-text", {"num_tasks": 3})
    with OpenEnvServer(served, workers=0).running() as url:
        listed = OpenEnvTaskset({"url": url, "split": "train", "text_action": "message"})
        rows = list(listed)
        base = url.replace("ws://", "http://")
        unknown = httpx.post(f"{base}/reverse-text/num_tasks", json={"split": "test"})
        trace = asyncio.run(run_rollout(listed, rows[2], ScriptedModel(["anything"])))
    assert [r.spec["prompt"] for r in rows] == [row.prompt for row in served]
    assert unknown.status_code == 400 and "splits: train" in unknown.json()["detail"]
    assert served[2].prompt in trace.prompt[-1].text  # the reset by index started task 2
