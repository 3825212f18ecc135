"""Group rewards and judge rewards on an env server: a `run` request's rollouts are scored as one group there, an
eval sends each task's group whole, and the judge's calls come back on the traces."""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict

import pytest
from group_reward_tasks import MULTI_AGENT_SPEC, SPEC, ranked
from serve_helpers import running_server

import tracegym as tg
from tracegym.serve import EnvClient, EnvServer
from tracegym.testing import FakeOpenAIServer


def growing():
    """A policy whose replies to one prompt grow by a letter a call: each group has one longest reply."""
    counts: dict[str, itertools.count] = defaultdict(lambda: itertools.count(1))
    lock = threading.Lock()

    def rule(request):
        with lock:
            return "x" * next(counts[request.messages[-1].text])

    return rule


def endpoint_of(server: FakeOpenAIServer) -> tg.Endpoint:
    return tg.Endpoint(base_url=server.base_url, model=server.model, api_key_env=None, max_retries=0)


def assert_one_longest_per_task(traces: list[tg.Trace]) -> None:
    by_task = defaultdict(list)
    for trace in traces:
        by_task[trace.task_key].append(trace)
    for group in by_task.values():
        best = max(len(t.last_reply) for t in group)
        assert [t.rewards["longest"].score for t in group] == [float(len(t.last_reply) == best) for t in group]
        assert all(t.ok for t in group)


@pytest.fixture(scope="module")
def server():
    with running_server(spec=SPEC) as srv:
        yield srv


async def test_a_group_run_on_the_server_is_scored_as_one_group(server):
    with FakeOpenAIServer(rule=growing()) as policy:
        async with EnvClient(server.bound) as env:
            traces = await env.run_group(ranked(), ranked()[0], endpoint_of(policy), 3)
    assert sorted(t.rewards["longest"].score for t in traces) == [0.0, 0.0, 1.0]
    assert_one_longest_per_task(traces)


async def test_an_eval_on_the_server_sends_each_task_s_group_whole_however_small_its_requests(server):
    with FakeOpenAIServer(rule=growing()) as policy:
        async with EnvClient(server.bound, per_request=1) as env:
            traces = await env.evaluate(ranked(), endpoint_of(policy), num_tasks=2, rollouts=3)
    assert len(traces) == 6
    assert_one_longest_per_task(traces)


async def test_one_rollout_on_the_server_leaves_its_group_reward_none(server):
    with FakeOpenAIServer(rule=growing()) as policy:
        async with EnvClient(server.bound) as env:
            trace = await env.run_rollout(ranked(), ranked()[0], endpoint_of(policy))
    assert trace.rewards["longest"].score is None and trace.rewards["length"].score == 1.0


async def test_a_judge_on_the_server_records_its_calls_on_the_traces_that_come_back():
    with FakeOpenAIServer(rule=growing()) as policy, FakeOpenAIServer(["VERDICT: yes"], model="judge-model") as judge:
        options = {"judge": endpoint_of(judge).model_dump(mode="json")}
        with running_server(options, spec=SPEC) as judged_server:
            async with EnvClient(judged_server.bound) as env:
                taskset = ranked(options)
                traces = await env.run_group(taskset, taskset[0], endpoint_of(policy), 2)
    assert [t.rewards["judge"].score for t in traces] == [1.0, 1.0]
    assert [(j.judge, j.model, j.score) for t in traces for j in t.judgments] == [("judge", "judge-model", 1.0)] * 2
    assert "Response:\nx" in traces[0].judgments[0].prompt and len(judge.requests) == 2


def test_a_server_of_a_multi_agent_taskset_with_a_group_reward_is_refused_before_any_worker_starts():
    with pytest.raises(tg.UsageError, match="group reward 'compared' on a multi-agent taskset"):
        EnvServer(MULTI_AGENT_SPEC)
