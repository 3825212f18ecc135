"""The orchestrator against a real local env server and the fake OpenAI server: groups become advantaged,
version-stamped samples; no-signal groups are dropped; it never runs ahead of the trainer."""

import asyncio
import json
import threading
import time
from collections import Counter

import pytest

from tracegym.core.episode import SOLO, Episode
from tracegym.core.errors import InfrastructureError
from tracegym.core.trace import Trace
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer
from tracegym.testing.script import Fail
from tracegym.train.orchestrator import Orchestrator
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, Poll, RLFolder
from tracegym.train.roles import orchestrator_for


def alternating_per_prompt():
    """A rule under which every other request for the same prompt gets the exact reversal: each group of four
    has two right and two wrong, however the concurrent requests interleave."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def rule(request):
        text = request.messages[-1].text
        with lock:
            seen[text] += 1
            right = seen[text] % 2 == 0
        return text[::-1] if right else "no idea"

    return rule


@pytest.fixture(scope="module")
def env_addresses():
    """The run's env servers by name: training's, and the held-out one with its own seed (as `make` configures)."""
    with local_server("reverse-text", {"seed": 0}, workers=1) as train, \
            local_server("reverse-text", {"seed": 9}, workers=1) as held_out:
        yield {"reverse-text": train, "eval:reverse-text": held_out}


def make(tmp_path, server, env_addresses, base_model: str | None = None, **orchestrator) -> Orchestrator:
    config = RLConfig.model_validate({
        "steps": orchestrator.pop("steps", 2), "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 2, "group_size": 4, "max_async_steps": 0,
                         "eval": {"envs": [{"id": "reverse-text", "options": {"seed": 9}}], "num_tasks": 3},
                         **orchestrator}})
    endpoints = Endpoints(base_url=server.base_url, base_model=base_model or server.model,
                          envs=env_addresses)
    return orchestrator_for(config, RLFolder(tmp_path), endpoints)


async def collect(orchestrator: Orchestrator, step: int = 0, version: int = 0):
    try:
        return await orchestrator.collect(step, version, orchestrator.endpoint.model)
    finally:
        await orchestrator.aclose()


async def evaluate_once(orchestrator: Orchestrator) -> None:
    """One held-out evaluation under the policy served now, then the orchestrator closed."""
    try:
        await orchestrator.evaluate(0)
    finally:
        await orchestrator.aclose()


def test_groups_become_samples_with_advantages_and_the_policy_version(tmp_path, env_addresses):
    with FakeOpenAIServer(rule=alternating_per_prompt()) as server:
        samples, metrics = asyncio.run(collect(make(tmp_path, server, env_addresses), version=0))
    assert len(samples) == 8 and metrics["rollouts"] == 8
    assert {s.policy_version for s in samples} == {0}
    assert any(s.advantage > 0 for s in samples) and any(s.advantage < 0 for s in samples)
    assert abs(sum(s.advantage for s in samples)) < 1e-9
    assert all(s.num_trained and s.token_ids for s in samples)
    assert len((tmp_path / "traces" / "step-000000.jsonl").read_text().splitlines()) == 8


def test_a_step_of_rollouts_is_saved_as_one_trace_a_line_and_a_solo_record_each(tmp_path, env_addresses):
    with FakeOpenAIServer(rule=alternating_per_prompt()) as server:
        asyncio.run(collect(make(tmp_path, server, env_addresses)))
    traces = [Trace.model_validate_json(line)
              for line in (tmp_path / "traces" / "step-000000.jsonl").read_text().splitlines()]
    records = [Episode.model_validate_json(line)
               for line in (tmp_path / "episodes" / "step-000000.jsonl").read_text().splitlines()]
    assert len(traces) == 8 and all(t.member is None and t.episode_id is None for t in traces)
    assert [(r.id, r.members) for r in records] == [(t.id, [SOLO]) for t in traces]


def test_a_single_agent_held_out_evaluation_saves_its_episodes_and_logs_the_reward_figures(tmp_path, env_addresses):
    with FakeOpenAIServer(rule=lambda request: request.messages[-1].text[::-1]) as server:
        orchestrator = make(tmp_path, server, env_addresses)

        asyncio.run(evaluate_once(orchestrator))
    episodes = RLFolder(tmp_path).step_log(0, held_out="reverse-text").read().episodes
    assert len(episodes) == 3 and all(e.is_solo and e.rewards[SOLO] == 1.0 for e in episodes)
    assert RLFolder(tmp_path).steps(held_out="reverse-text") == [0] and RLFolder(tmp_path).steps() == []
    [record] = RLFolder(tmp_path).metrics.read()
    assert set(record) == {"time", "eval_step", "env", "policy_version", "eval_reward", "eval_reward_ci95", "eval_n",
                           "eval_unscored"}
    assert (record["eval_reward"], record["eval_n"], record["eval_unscored"]) == (1.0, 3, 0)


def test_groups_without_signal_are_dropped_and_counted(tmp_path, env_addresses):
    with FakeOpenAIServer(rule=lambda r: "same answer") as server:
        samples, metrics = asyncio.run(collect(make(tmp_path, server, env_addresses)))
    assert samples == [] and metrics["groups_filtered"] == 2


def test_the_orchestrator_waits_for_the_trainer_and_evaluates_held_out_tasks(tmp_path, env_addresses):
    published = []

    folder = RLFolder(tmp_path)

    def fake_trainer() -> None:  # publishes version n+1 once batch n exists
        for step in range(2):
            Poll("batch", 30).wait(lambda s=step: folder.read_batch(s))
            assert not folder.read_batch(step + 1), "ran ahead of the trainer"
            time.sleep(0.2)
            folder.publish_policy(step + 1, "fake-model")
            published.append(step + 1)

    with FakeOpenAIServer(rule=alternating_per_prompt()) as server:
        orchestrator = make(tmp_path, server, env_addresses, steps=2)
        thread = threading.Thread(target=fake_trainer)
        thread.start()
        asyncio.run(orchestrator.run())
        thread.join(10)
    assert published == [1, 2]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "step" in r] == [0, 1]
    assert [r["eval_step"] for r in records if "eval_step" in r] == [0, 2]


def test_a_step_whose_every_rollout_failed_stops_the_run_with_the_reason(tmp_path, env_addresses):
    with FakeOpenAIServer(rule=alternating_per_prompt(), model="another-model") as server:
        orchestrator = make(tmp_path, server, env_addresses, base_model="fake-model")  # a name it does not serve
        with pytest.raises(InfrastructureError, match=r"all 8 rollouts failed.*does not exist"):
            asyncio.run(collect(orchestrator))


def test_held_out_figures_leave_failed_rollouts_out_of_the_mean_as_eval_does(tmp_path, env_addresses):
    """One held-out rollout fails at the endpoint: the mean is over the two that scored (it was 0.0 before)."""
    prompts: list[str] = []

    def right_but_one_fails(request):
        text = request.messages[-1].text
        prompts.append(text)
        return Fail(400, "scripted refusal") if len(set(prompts)) == 1 else text[::-1]

    with FakeOpenAIServer(rule=right_but_one_fails) as server:
        orchestrator = make(tmp_path, server, env_addresses)

        asyncio.run(evaluate_once(orchestrator))
    [record] = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (record["eval_n"], record["eval_unscored"]) == (2, 1)
    assert record["eval_reward"] == 1.0


class AskedFolder(RLFolder):
    """A run folder that counts the orchestrator's looks at the served policy, so a fake trainer can publish only
    once the orchestrator has looked after a batch (an asynchronous run whose trainer is slower than generation)."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.looks = 0
        self.looked = threading.Condition()

    def policy(self, base_model: str) -> tuple[int, str]:
        with self.looked:
            self.looks += 1
            self.looked.notify_all()
        return super().policy(base_model)

    def wait_for_a_look(self, after: int) -> None:
        with self.looked:
            assert self.looked.wait_for(lambda: self.looks > after, timeout=30), "the orchestrator stopped looking"


def test_an_asynchronous_run_evaluates_step_n_on_policy_n_not_on_the_older_one_served(tmp_path, env_addresses):
    folder = AskedFolder(tmp_path)

    def slow_trainer() -> None:  # publishes version n+1 only after the orchestrator looked again past batch n
        for step in range(3):
            Poll("batch", 30).wait(lambda s=step: folder.read_batch(s))
            folder.wait_for_a_look(after=folder.looks)
            folder.publish_policy(step + 1, "fake-model")

    with FakeOpenAIServer(rule=alternating_per_prompt()) as server:
        config = RLConfig.model_validate({
            "steps": 3, "trainer": {"model": "unused"}, "model": {"client": "chat"},
            "orchestrator": {"tasks_per_step": 2, "group_size": 4, "max_async_steps": 1,
                             "eval": {"envs": [{"id": "reverse-text", "options": {"seed": 9}}], "num_tasks": 2,
                                      "every": 1}}})
        orchestrator = orchestrator_for(config, folder, Endpoints(base_url=server.base_url, base_model=server.model,
                                                                  envs=env_addresses))
        thread = threading.Thread(target=slow_trainer)
        thread.start()
        asyncio.run(orchestrator.run())
        thread.join(10)
    evals = [r for r in folder.metrics.read() if "eval_step" in r]
    assert [(r["eval_step"], r["policy_version"]) for r in evals] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert [r["staleness"] for r in folder.metrics.read() if "step" in r] == [0, 0, 0]
