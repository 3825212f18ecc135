"""The shipped ReAct agent (`examples/agents/react_agent.py`, an `openai` SDK program) solves the example agent
taskset against the fake OpenAI server: a tool call, its result, an answer; streamed or not (a streamed call is
streamed from the endpoint too); in this process and in an env server's workers; the trace holds each call's exact
tokens on one branch."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import tracegym as tg
from tracegym.envs.harness import ProgramHarness
from tracegym.envs.registry import load_taskset
from tracegym.testing import FakeOpenAIServer, reply, tool_call
from tracegym.testing.scripted_model import encode, render, render_body

pytest.importorskip("openai")
EXAMPLE = Path(__file__).parents[2] / "examples" / "agents" / "react_arithmetic.py"
SPEC = f"{EXAMPLE}:ReactArithmetic"


def calculator_then_answer(request: tg.ModelRequest) -> object:
    """Call `calculate` on the question's expression, then answer with what it returned."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"The answer is {last.text}."
    expression = re.search(r"What is (.*)\?", last.text).group(1)
    return reply(None, tool_call("calculate", {"expression": expression}))


@pytest.fixture
def server():
    with FakeOpenAIServer(rule=calculator_then_answer) as server:
        yield server


def endpoint(server) -> tg.Endpoint:
    return tg.Endpoint(base_url=server.base_url, model=server.model, api_key_env=None)


def assert_solved_with_exact_tokens(trace: tg.Trace, server: FakeOpenAIServer) -> None:
    assert not trace.errors and trace.stop_reason == tg.StopReason.COMPLETED, trace.errors
    assert trace.rewards["exact"].score == 1.0 and trace.metrics["used_calculator"] == 1.0
    assert [m.role for m in trace.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert len(trace.branches) == 1
    last = trace.graph.nodes[-1]
    prompt = encode(render(trace.messages[:-1]))
    assert trace.graph.tokens() == prompt + encode(render_body(last.message))  # what the server saw and sampled
    assert last.logprobs and sum(last.mask) == len(encode(render_body(last.message)))


@pytest.mark.parametrize("stream", [True, False])
async def test_the_react_agent_solves_the_example_taskset_through_the_proxy(server, stream, monkeypatch):
    taskset = load_taskset(SPEC)
    if not stream:
        task_class = taskset.task_class
        harness = task_class.harness
        monkeypatch.setattr(task_class, "harness", ProgramHarness(
            [a for a in harness.command if a != "--stream"], env=harness.env, files=harness.files,
            limits=harness.limits))
    traces = await tg.evaluate(taskset, endpoint(server), num_tasks=1, rollouts=2)
    for trace in traces:
        assert_solved_with_exact_tokens(trace, server)
    assert len(server.requests) == 4 and all(r.get("stream", False) is stream for r in server.requests)


def test_eval_runs_the_agent_taskset_in_env_server_workers(server, tmp_path):
    """`tracegym eval` on the example file, as the README shows it: rollouts in env-server worker processes, each
    with its own proxy."""
    command = [sys.executable, "-m", "tracegym.cli.main", "eval", SPEC, "-n", "2", "-r", "2", "--no-rich",
               "--model.base-url", server.base_url, "-m", server.model, "--model.api-key-env", "None",
               "--output-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [run] = list(tmp_path.glob("*ReactArithmetic--fake-model/*"))
    traces = [tg.Trace.model_validate_json(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 4
    for trace in traces:
        assert_solved_with_exact_tokens(trace, server)
