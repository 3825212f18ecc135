"""Proposer-solver episodes on a real env server: held-out rows (their fixed problem) and the verifier's judgement
cross the wire, and the episodes equal the same episodes in process."""

from serve_helpers import running_server

from tracegym import Endpoint
from tracegym.envs.evaluate import evaluate_episodes
from tracegym.envs.proposer_solver import PROPOSER
from tracegym.envs.registry import load_taskset
from tracegym.serve import EnvClient
from tracegym.tasksets.propose_arithmetic import PROPOSER_SYSTEM
from tracegym.testing import FakeOpenAIServer


def players(request):
    """The proposer writes a wrong-answer proposal; a solver answers 24."""
    return "2 + 2 = 5" if request.messages[0].text == PROPOSER_SYSTEM else "24"


async def test_held_out_episodes_on_a_server_match_the_same_episodes_in_process():
    options = {"split": "heldout", "num_tasks": 3}
    taskset = load_taskset("propose-arithmetic", options)
    with FakeOpenAIServer(rule=players, model="m") as fake:
        endpoint = Endpoint(base_url=fake.base_url, model="m", api_key_env=None, max_retries=0)
        with running_server(spec="propose-arithmetic", options=options) as server:
            async with EnvClient(server.bound) as client:
                served = await client.evaluate_episodes(taskset, endpoint)
        local = await evaluate_episodes(taskset, endpoint)
    assert [(e.task_key, e.rewards, e.member_metrics[PROPOSER]) for e in served] == [
        (e.task_key, e.rewards, e.member_metrics[PROPOSER]) for e in local]
    assert all(e.ok and e.member_metrics[PROPOSER]["invalid_answer"] == 1.0 for e in served)
    assert [e.traces["solver_0"].messages[-2].text for e in served] == [f"What is {r.problem}?" for r in taskset]
