"""Slow (each env-server worker imports verifiers, ~20 s on a loaded machine): a verifiers environment served by
`tracegym serve verifiers:FILE` runs under `tracegym eval` and under the RL orchestrator, its rubric's rewards
and metrics on every trace and the model's exact tokens in every training sample."""

import asyncio
import itertools
import json
import threading

import pytest
from verifiers_envs import MULTI_TURN, TOOLS

from tracegym.cli.main import main
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer, reply, tool_call
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for

pytest.importorskip("verifiers")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tool_env(tmp_path_factory):
    path = tmp_path_factory.mktemp("vf") / "tool_env.py"
    path.write_text(TOOLS)
    return f"verifiers:{path}"


@pytest.fixture(scope="module")
def served(tool_env):
    with local_server(tool_env, {"split": "train"}, workers=1) as address:
        yield address


def calls_the_tool_then_answers(request):
    """The fake model's rule: call `add` first, then answer with the tool's result."""
    if request.messages[-1].role == "tool":
        return f"It is {request.messages[-1].text}."
    return reply(None, tool_call("add", {"a": 2, "b": 3}))


def right_then_wrong():
    """Like `calls_the_tool_then_answers`, but every other answer is wrong: a group of two has a signal."""
    answers = itertools.cycle(["It is 5.", "No idea."])
    lock = threading.Lock()

    def rule(request):
        if request.messages[-1].role != "tool":
            return reply(None, tool_call("add", {"a": 2, "b": 3}))
        with lock:
            return next(answers)

    return rule


def test_eval_against_tracegym_serve_records_the_rubrics_rewards_and_metrics(tool_env, served, tmp_path, capsys):
    with FakeOpenAIServer(rule=calls_the_tool_then_answers) as server:
        code = main(["eval", tool_env, "-r", "2", "--taskset.split", "train", "--env.address", served,
                     "--model.base-url", server.base_url, "--output-dir", str(tmp_path), "--no-rich"])
    assert code == 0, capsys.readouterr().err
    [summary] = tmp_path.rglob("summary.json")
    figures = json.loads(summary.read_text())
    assert figures["num_scored"] == 2 and figures["reward"] == 1.0
    assert figures["metrics"]["add_calls"]["mean"] == 1.0 and figures["metrics"]["num_turns"]["mean"] == 2.0


def test_the_rl_orchestrator_turns_served_verifiers_rollouts_into_samples(tool_env, served, tmp_path):
    config = RLConfig.model_validate({
        "steps": 1, "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 1, "group_size": 2, "max_async_steps": 0,
                         "train": {"envs": [{"id": tool_env, "options": {"split": "train"}}]}}})
    with FakeOpenAIServer(rule=right_then_wrong()) as server:
        endpoints = Endpoints(base_url=server.base_url, base_model=server.model, envs={tool_env: served})
        orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)

        async def collect():
            try:
                return await orchestrator.collect(0, 0, orchestrator.endpoint.model)
            finally:
                await orchestrator.aclose()

        samples, metrics = asyncio.run(collect())
    assert metrics["rollouts"] == 2 and len(samples) == 2
    assert all(s.token_ids and s.num_trained for s in samples)
    assert sorted(s.advantage for s in samples) == [-0.5, 0.5]
    traces = [json.loads(line) for line in (tmp_path / "traces" / "step-000000.jsonl").read_text().splitlines()]
    assert sorted(t["rewards"]["correct"]["score"] for t in traces) == [0.0, 1.0]


def test_a_multi_turn_environment_runs_under_plain_eval(tmp_path, capsys):
    """`tracegym eval verifiers:FILE` starting its own env server (the default), as a user types it."""
    path = tmp_path / "guess.py"
    path.write_text(MULTI_TURN)
    answers = iter(["3", "7"])
    with FakeOpenAIServer(rule=lambda request: next(answers)) as server:
        code = main(["eval", f"verifiers:{path}", "-r", "1", "--env.workers", "1", "--env.spare-workers", "0",
                     "--model.base-url", server.base_url,
                     "--output-dir", str(tmp_path / "out"), "--no-rich"])
    assert code == 0, capsys.readouterr().err
    [line] = next((tmp_path / "out").rglob("traces.jsonl")).read_text().splitlines()
    trace = json.loads(line)
    assert (trace["stop_reason"], trace["stopped_by"]) == ("stop_condition", "found")
    assert trace["rewards"]["solved"]["score"] == 1.0 and trace["metrics"]["guesses"] == 1.0
