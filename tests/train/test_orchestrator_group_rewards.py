"""RL with a group reward: the env server scores each group of `group_size` rollouts together before the
orchestrator sees it, so the group reward reaches the advantages (and the step's episode log)."""

import asyncio
import itertools
import threading
from collections import defaultdict

from tracegym.core.episode import SOLO
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for

TASKSET = '''
import tracegym as tg


class Longest(tg.Task):
    @tg.reward(group=True)
    def longest(self, traces):
        best = max(len(t.last_reply) for t in traces)
        return [float(len(t.last_reply) == best) for t in traces]


class Ranked(tg.Taskset):
    id = "ranked"
    task_class = Longest

    def load(self):
        return [{"prompt": f"Say something ({i})."} for i in range(4)]
'''


def growing():
    """Replies to one prompt that grow by a letter a call: each group has exactly one longest."""
    counts: dict[str, itertools.count] = defaultdict(lambda: itertools.count(1))
    lock = threading.Lock()

    def rule(request):
        with lock:
            return "x" * next(counts[request.messages[-1].text])

    return rule


def test_a_group_reward_decides_the_advantages_of_its_group(tmp_path):
    path = tmp_path / "ranked.py"
    path.write_text(TASKSET)
    spec = f"{path}:Ranked"
    config = RLConfig.model_validate({
        "steps": 1, "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 2, "group_size": 3, "max_async_steps": 0,
                         "train": {"envs": [{"id": spec}]}}})
    with FakeOpenAIServer(rule=growing()) as server, local_server(spec, workers=1) as address:
        folder = RLFolder(tmp_path / "run")
        orchestrator = orchestrator_for(config, folder, Endpoints(base_url=server.base_url,
                                                                  base_model=server.model, envs={spec: address}))

        async def one_step():
            try:
                return await orchestrator.collect(0, 0, server.model)
            finally:
                await orchestrator.aclose()

        samples, metrics = asyncio.run(one_step())
    assert metrics["rollouts"] == 6 and metrics["reward"] == 1 / 3
    assert sorted(round(s.advantage, 6) for s in samples) == sorted([round(2 / 3, 6)] * 2 + [round(-1 / 3, 6)] * 4)
    episodes = folder.step_log(0).read().episodes
    by_task = defaultdict(list)
    for episode in episodes:
        by_task[episode.task_key].append(episode.traces[SOLO].rewards["longest"].score)
    assert sorted(sorted(scores) for scores in by_task.values()) == [[0.0, 0.0, 1.0]] * 2
