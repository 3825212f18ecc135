"""evaluate and friends: an Endpoint is a model too, options are checked, and a rollout never raises."""

import pytest

import tracegym as tg
from tracegym.core.errors import StageTimeout
from tracegym.envs.evaluate import failed_trace
from tracegym.testing import FakeOpenAIServer, ScriptedModel


@tg.reward
def said_yes(task, trace):
    return float(trace.last_reply == "yes")


TASKSET = tg.Taskset(id="yes", data=[{"prompt": "q"}, {"prompt": "r"}], rewards=[said_yes])


async def test_an_endpoint_is_reached_through_a_client_made_and_closed_for_the_call():
    with FakeOpenAIServer(rule=lambda request: "yes", model="m") as fake:
        endpoint = tg.Endpoint(base_url=fake.base_url, model="m", api_key_env=None)
        traces = await tg.evaluate(TASKSET, endpoint, rollouts=2)
        [one] = await tg.run_group(TASKSET, TASKSET[0], endpoint, 1)
    assert [t.reward for t in traces] == [1.0] * 4 and one.reward == 1.0


async def test_a_misspelt_option_is_a_usage_error_naming_it():
    with pytest.raises(tg.UsageError, match=r"unknown option 'rollout' \(options: concurrency, infra_retries"):
        await tg.evaluate(TASKSET, ScriptedModel(["yes"]), rollout=2)


async def test_a_misspelt_option_of_one_rollout_or_group_is_the_same_usage_error():
    with pytest.raises(tg.UsageError, match=r"unknown option 'seed' \(options: infra_retries, sampling, timeouts\)"):
        await tg.run_rollout(TASKSET, TASKSET[0], ScriptedModel(["yes"]), seed=2)  # type: ignore[call-arg]
    with pytest.raises(tg.UsageError, match="unknown option 'rollout'"):
        await tg.run_group(TASKSET, TASKSET[0], ScriptedModel(["yes"]), 2, rollout=2)  # type: ignore[call-arg]


class NamelessModel:
    """A model client with a bug: reading its name raises."""

    @property
    def name(self) -> str:
        raise AttributeError("no name")


async def test_a_bug_below_run_rollout_is_a_failed_trace_not_an_exception():
    trace = await tg.run_rollout(TASKSET, TASKSET[0], NamelessModel())  # type: ignore[arg-type]
    assert trace.stop_reason == tg.StopReason.ERROR
    assert [(e.kind, e.stage, e.message) for e in trace.errors] == [
        (tg.ErrorKind.TASK, "setup", "AttributeError: no name")]


def test_a_failed_trace_takes_a_tracegym_error_s_own_kind_and_a_timeout_ends_as_one():
    data = TASKSET[0]
    plain = failed_trace(data, "yes", 3, ValueError("x"), stage="env_server", kind=tg.ErrorKind.INFRASTRUCTURE)
    model = failed_trace(data, "yes", 0, tg.ModelError("m"))
    timeout = failed_trace(data, "yes", 0, StageTimeout("t"))
    assert (plain.rollout_index, plain.errors[0].kind, plain.errors[0].stage) == (
        3, tg.ErrorKind.INFRASTRUCTURE, "env_server")
    assert (model.errors[0].kind, model.stop_reason) == (tg.ErrorKind.MODEL, tg.StopReason.ERROR)
    assert (timeout.errors[0].kind, timeout.stop_reason) == (tg.ErrorKind.TIMEOUT, tg.StopReason.TIMEOUT)
