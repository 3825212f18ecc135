"""An OpenEnv server's environment in tracegym's pipelines: `tracegym eval openenv:URL`, and one RL orchestrator
step through a local env server (whose worker rebuilds the taskset from its id) against the fake OpenAI server."""

import asyncio
import json
import threading
from collections import Counter

import pytest
from openenv_reference import GUESSES, bisect, guess_server

from tracegym.cli.main import main
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for


@pytest.fixture(scope="module")
def guess_url():
    with guess_server() as url:
        yield url


def test_eval_runs_an_openenv_server_by_its_id(guess_url, tmp_path):
    with FakeOpenAIServer(rule=bisect) as model:
        code = main(["eval", f"openenv:{guess_url}", "-n", "3", "-r", "2", "--taskset.max-turns", str(GUESSES + 1),
                     "--model.base-url", model.base_url, "--output-dir", str(tmp_path), "--no-rich", "--no-serve"])
    assert code == 0
    [run] = list(tmp_path.glob("*/*"))
    traces = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 6 and {t["taskset"] for t in traces} == {f"openenv:{guess_url}"}
    assert all(t["rewards"]["env_reward"]["score"] == 1.0 and not t["errors"] for t in traces)
    assert json.loads((run / "summary.json").read_text())["reward"] == 1.0


def half_give_up():
    """Every other request for the same prompt gives up at once (reward 0); the others bisect (reward 1)."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def rule(request):
        if len(request.messages) > 2:
            return bisect(request)
        with lock:
            seen[request.messages[-1].text] += 1
            quits = seen[request.messages[-1].text] % 2 == 0
        return "I give up." if quits else bisect(request)

    return rule


def test_an_rl_config_with_an_openenv_env_loads_and_its_orchestrator_runs_a_group(guess_url, tmp_path):
    env = {"id": f"openenv:{guess_url}", "options": {"num_tasks": 4, "max_turns": GUESSES + 1}}
    config = RLConfig.model_validate({
        "steps": 1, "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 1, "group_size": 4, "max_async_steps": 0, "train": {"envs": [env]}}})
    with local_server(env["id"], env["options"], workers=1) as address, \
            FakeOpenAIServer(rule=half_give_up()) as model:
        orchestrator = orchestrator_for(config, RLFolder(tmp_path),
                                          Endpoints(base_url=model.base_url, base_model=model.model,
                                                    envs={env["id"]: address}))

        async def one_step():
            try:
                return await orchestrator.collect(0, 0, orchestrator.endpoint.model)
            finally:
                await orchestrator.aclose()

        samples, metrics = asyncio.run(one_step())
    assert metrics["rollouts"] == 4 and len(samples) == 4
    assert sorted(s.advantage > 0 for s in samples) == [False, False, True, True]
    assert all(s.token_ids and s.num_trained for s in samples)
