"""Traces through the env server are identical in content to in-process ones (messages, rewards, tokens)."""

from serve_helpers import running_server

from tracegym import Sampling, evaluate
from tracegym.serve import EnvClient
from tracegym.testing.echo import Echo

OPTIONS = {"num_tasks": 3, "turns": 3}
VOLATILE = {"id", "started_at", "spans"}
"""Fields that differ between any two runs (a fresh id, the wall clock, durations)."""


async def test_server_traces_match_in_process_traces(endpoint):
    sampling = Sampling(temperature=0.0, max_tokens=16)
    local = await evaluate(Echo(OPTIONS), endpoint, rollouts=2, sampling=sampling)
    with running_server(OPTIONS) as server:
        async with EnvClient(server.bound) as client:  # the one object that moves the rollouts out of process
            remote = await client.evaluate(Echo(OPTIONS), endpoint, rollouts=2, sampling=sampling)
    assert _content(remote) == _content(local)
    assert all(t.graph.tokens() for t in remote) and all(t.num_turns == 3 for t in remote)


def _content(traces):
    return sorted((t.model_dump(mode="json", exclude=VOLATILE) for t in traces),
                  key=lambda d: (d["task_key"], d["rollout_index"]))
