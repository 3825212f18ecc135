"""The env client mirrors the in-process API: the same four calls with the same arguments, errors as data."""

import inspect

import pytest
from serve_helpers import task

import tracegym as tg
from tracegym.envs import evaluate as in_process
from tracegym.serve import EnvClient
from tracegym.testing import ScriptedModel
from tracegym.testing.echo import Echo

MIRRORED = ["run_rollout", "run_group", "evaluate_iter", "evaluate"]


@pytest.mark.parametrize("name", MIRRORED)
def test_each_call_takes_the_in_process_arguments(name):
    ours = list(inspect.signature(getattr(EnvClient, name)).parameters.values())[1:]  # less `self`
    theirs = list(inspect.signature(getattr(in_process, name)).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in theirs]
    assert [p.annotation for p in ours if p.name != "model"] == [p.annotation for p in theirs if p.name != "model"]


async def test_a_rollout_a_group_and_an_evaluation_run_on_the_server(server, endpoint):
    async with EnvClient(server.bound) as env:
        one = await env.run_rollout(Echo(), task("one"), endpoint, rollout_index=2)
        group = await env.run_group(Echo(), task("group"), endpoint, 3)
        evaluated = await env.evaluate(Echo(), endpoint, num_tasks=2, rollouts=2)
    assert (one.rollout_index, one.reward) == (2, 1.0)
    assert [t.rollout_index for t in group] == [0, 1, 2] and all(t.reward == 1.0 for t in group)
    assert [(t.task_key, t.rollout_index) for t in evaluated] == [
        (d.key, i) for d in Echo().head(2) for i in range(2)]


async def test_a_failed_request_is_a_failed_trace_per_rollout_not_an_exception(server, endpoint):
    async with EnvClient(server.bound, request_timeout=0.3) as env:
        group = await env.run_group(Echo(), task("sleep-2"), endpoint, 2)
    assert [t.rollout_index for t in group] == [0, 1]
    assert {(t.taskset, t.stop_reason, t.errors[0].kind, t.errors[0].stage) for t in group} == {
        ("echo", tg.StopReason.TIMEOUT, tg.ErrorKind.TIMEOUT, "env_server")}


async def test_a_live_model_client_is_refused_in_one_line(server):
    async with EnvClient(server.bound) as env:
        with pytest.raises(tg.UsageError, match="through its Endpoint, not a ScriptedModel"):
            await env.run_rollout(Echo(), task(), ScriptedModel(["hi"]))


async def test_a_run_request_the_worker_would_refuse_is_a_usage_error_here_before_it_is_sent(server, endpoint):
    """The request is built from `RunRequest`, the model the worker validates: its rules hold at the client."""
    sent = server.stats["run_requests"]
    async with EnvClient(server.bound) as env:
        with pytest.raises(tg.UsageError, match=r"run request seats: seat 'p1': .* its Endpoint, not a ScriptedModel"):
            await env.run_episodes(task(), endpoint, seats={"p1": tg.Seat(model=ScriptedModel(["hi"]))})
        with pytest.raises(tg.UsageError, match=r"run request infra_retries: .*less than or equal to 100"):
            await env.run(task(), endpoint, infra_retries=101)
    assert server.stats["run_requests"] == sent


async def test_a_misspelt_option_is_a_usage_error_naming_it(server, endpoint):
    async with EnvClient(server.bound) as env:
        with pytest.raises(tg.UsageError, match="unknown option 'rollout'"):
            await env.evaluate(Echo(), endpoint, rollout=2)
        with pytest.raises(tg.UsageError, match="unknown option 'rollout'"):
            await env.run_group(Echo(), task(), endpoint, 2, rollout=2)
        with pytest.raises(tg.UsageError, match=r"unknown option 'seed' \(options: infra_retries, sampling"):
            await env.run_rollout(Echo(), task(), endpoint, seed=2)


def test_per_request_below_one_is_a_usage_error():
    with pytest.raises(tg.UsageError, match="per_request must be at least 1"):
        EnvClient("tcp://127.0.0.1:1", per_request=0)
