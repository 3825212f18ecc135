"""A TRL-docs-style class wrapping OpenEnv's own `GenericEnvClient`, run as a taskset against openenv's own
`create_app` server at capacity 1: the pooled instance holds one session and is reset for every rollout, so all 8
rollouts complete (a new instance per rollout held one session each: 1 of 8 did)."""

import json
from pathlib import Path

import pytest
from openenv_reference import guess_server

from tracegym.cli.main import main
from tracegym.testing import FakeOpenAIServer, reply, tool_call

FILE = Path(__file__).parent / "trl_openenv_class.py"


def bisect(request):
    """A model that finds the number by bisection from the feedback its guesses got."""
    low, high, guess = 1, 100, None
    for message in request.messages:
        if message.role == "assistant" and message.tool_calls:
            guess = json.loads(message.tool_calls[0].arguments)["number"]
        if message.role == "tool" and guess is not None:
            low, high = {"higher": (guess + 1, high), "lower": (low, guess - 1)}.get(message.text, (low, high))
    if request.messages[-1].role == "tool" and request.messages[-1].text == "correct":
        return "Found it."
    return reply(None, tool_call("guess", {"number": (low + high) // 2}))


@pytest.mark.slow
def test_a_trl_class_wrapping_an_openenv_client_completes_8_of_8_on_a_capacity_1_server(tmp_path, monkeypatch):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"prompt": "Find my number.", "seed": seed}) for seed in range(8)))
    with guess_server(max_concurrent_envs=1) as url, FakeOpenAIServer(rule=bisect) as model:
        monkeypatch.setenv("GUESS_URL", url)
        assert main(["eval", f"{FILE}:GuessToolEnv", "--taskset.rows", str(rows), "-n", "8", "-c", "1",
                     "--env.workers", "1", "--model.base-url", model.base_url, "--output-dir", str(tmp_path / "out"),
                     "--no-rich"]) == 0
    [run] = list((tmp_path / "out").glob("*/*"))
    traces = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 8 and [t["errors"] for t in traces] == [[]] * 8
    assert [t["rewards"]["GuessToolEnv"]["score"] for t in traces] == [1.0] * 8
    assert sorted(t["task"]["seed"] for t in traces) == list(range(8))
