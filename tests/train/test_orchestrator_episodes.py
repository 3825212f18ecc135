"""The orchestrator on a multi-agent environment, its env server replaced by a fake that plays each episode
from its seat binding (the learner, playing as the policy, always wins): seats per episode, fan-out into one
sample per trainable member, RAE, per-seat metrics, episodes in the run folder, held-out figures, resume."""

import asyncio
import random

import pytest

from tracegym.core.task_data import TaskData
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer, make_episode
from tracegym.train.orchestrator import Orchestrator
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for


class FakeEpisodes:
    """Plays `run_episode` / `evaluate_episodes` without a model: a member playing as the policy (no pinned
    model) beats one pinned to another model; two policies split by a seeded coin."""

    def __init__(self) -> None:
        self.bindings: list[dict[str, str]] = []
        self.coin = random.Random(0)

    def play(self, data: TaskData, endpoint, seats, index: int = 0):
        models = {m: (s.model.model if s.model else "policy") for m, s in seats.items()}  # "policy": the learner
        self.bindings.append(models)
        policy = [m for m, s in seats.items() if s.model is None]
        winner = policy[0] if len(policy) == 1 else self.coin.choice(sorted(seats))
        rewards = {m: 1.0 if m == winner else -1.0 for m in seats}
        trainable = {m: s.model is None if s.trainable is None else s.trainable for m, s in seats.items()}
        return make_episode(rewards, trainable=trainable, task=data, taskset="kuhn-poker", episode_index=index,
                            models=models)

    async def episodes(self, served, data, endpoint, indices, *, seats=None, sampling=None):
        return [self.play(data, endpoint, seats, i) for i in indices]

    async def aclose(self) -> None:
        pass


@pytest.fixture(scope="module")
def kuhn_servers():
    """Env servers of the training and held-out kuhn-poker the orchestrator asks what they serve and reads tasks
    from; `make` replaces their clients' episodes by the fake's."""
    with local_server("kuhn-poker", {"num_tasks": 50}, workers=1) as train, \
            local_server("kuhn-poker", {"num_tasks": 50, "seed": 7}, workers=1) as held_out:
        yield {"kuhn-poker": train, "eval:kuhn-poker": held_out}


def make(tmp_path, servers: dict[str, str], play: dict | None = None, advantage: str = "rae",
         **fields) -> tuple[Orchestrator, FakeEpisodes]:
    env = {"id": "kuhn-poker", "options": {"num_tasks": 50}, "play": play or {}}
    config = RLConfig.model_validate({
        "steps": 2, "trainer": {"model": "unused"}, "weight_sync": "lora",
        "orchestrator": {"tasks_per_step": 3, "group_size": 2, "max_async_steps": 0, "advantage": advantage,
                         "train": {"envs": [env]},
                         "eval": {"envs": [{**env, "options": {"num_tasks": 50, "seed": 7}}], "num_tasks": 4}},
        **fields})
    endpoints = Endpoints(base_url="http://127.0.0.1:9/v1", base_model="base", envs=servers)
    orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)
    fake = FakeEpisodes()
    for env in [*orchestrator.envs.values(), *orchestrator.held_out.envs]:
        env.client = fake
    return orchestrator, fake


def test_self_play_trains_both_seats_of_every_episode_with_rae(tmp_path, kuhn_servers):
    orchestrator, fake = make(tmp_path, kuhn_servers)
    samples, metrics = asyncio.run(orchestrator.collect(0, 0, "policy"))
    assert len(samples) == 12 and metrics["episodes"] == 6  # 3 tasks x 2 episodes x 2 seats
    assert {abs(s.advantage) for s in samples} >= {0.9}  # a cold-start RAE baseline: |A| = 0.9 on first sight
    assert all(b == {"player_0": "policy", "player_1": "policy"} for b in fake.bindings)
    assert metrics["seat/player_0/win_rate"] + metrics["seat/player_1/win_rate"] == pytest.approx(1.0)
    assert metrics["rollouts"] == 12 and "learner/advantage_mean" in metrics
    lines = (tmp_path / "episodes" / "step-000000.jsonl").read_text().splitlines()
    assert len(lines) == 6


def test_an_alternating_learner_plays_both_sides_against_the_base_model_and_alone_trains(tmp_path, kuhn_servers):
    orchestrator, fake = make(tmp_path, kuhn_servers, {"learner": "alternate", "opponent": "base"})
    samples, metrics = asyncio.run(orchestrator.collect(0, 0, "policy"))
    assert len(samples) == 6 and all(s.reward == 1.0 for s in samples)  # only the learner's traces train
    assert [b["player_0"] for b in fake.bindings] == ["policy", "base"] * 3
    assert metrics["learner/win_rate"] == 1.0 and metrics["seat/player_0/win_rate"] == 0.5


def test_group_mean_compares_a_seat_with_itself_within_the_group(tmp_path, kuhn_servers):
    orchestrator, _ = make(tmp_path, kuhn_servers, advantage="group_mean")
    samples, _ = asyncio.run(orchestrator.collect(0, 0, "policy"))
    assert all(s.advantage in (-1.0, 0.0, 1.0) for s in samples)


def test_held_out_evaluation_plays_each_task_with_the_learner_in_each_seat(tmp_path, kuhn_servers):
    orchestrator, fake = make(tmp_path, kuhn_servers, {"learner": "alternate", "opponent": "base"})
    asyncio.run(orchestrator.evaluate(0))
    (record,) = [m for m in orchestrator.folder.metrics.read() if "eval_reward" in m]
    assert record["eval_n"] == 8 and record["eval_reward"] == 1.0 and record["eval_win_rate"] == 1.0
    assert [b["player_0"] for b in fake.bindings] == ["policy"] * 4 + ["base"] * 4
    assert len(orchestrator.folder.step_log(0, held_out="kuhn-poker").read().episodes) == 8


def test_the_seating_and_the_baselines_come_back_on_a_resume(tmp_path, kuhn_servers):
    first, fake = make(tmp_path, kuhn_servers, {"learner": "random", "opponent": "base"})
    asyncio.run(first.collect(0, 0, "policy"))
    state = first.state_dict()
    again, again_fake = make(tmp_path / "again", kuhn_servers, {"learner": "random", "opponent": "base"})
    again.load_state_dict(state)
    assert again.state_dict() == state
    asyncio.run(first.collect(1, 0, "policy"))
    asyncio.run(again.collect(1, 0, "policy"))
    assert again_fake.bindings == fake.bindings[6:]


def test_a_step_of_self_play_through_a_real_env_server_trains_each_seat_on_its_own_exact_tokens(tmp_path):
    """kuhn-poker on a real env server, both seats played by the fake OpenAI server (bet, then call: every hand
    goes to a showdown); each seat's samples are its own trace's exact tokens, with loss only on its replies."""
    config = RLConfig.model_validate({
        "steps": 1, "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 2, "group_size": 2, "max_async_steps": 0, "advantage": "rae",
                         "train": {"envs": [{"id": "kuhn-poker", "options": {"num_tasks": 8}}]}}})
    with FakeOpenAIServer(rule=lambda request: "bet call") as server, \
            local_server("kuhn-poker", {"num_tasks": 8}, workers=1) as address:
        endpoints = Endpoints(base_url=server.base_url, base_model=server.model, envs={"kuhn-poker": address})
        orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)

        async def one_step():
            try:
                return await orchestrator.collect(0, 0, server.model)
            finally:
                await orchestrator.aclose()

        samples, metrics = asyncio.run(one_step())
    log = RLFolder(tmp_path).step_log(0)
    episodes = log.read().episodes
    assert len(episodes) == 4 and all(e.ok for e in episodes) and len(samples) == 8
    assert len(log.traces.read_text().splitlines()) == 8  # traces/step-N.jsonl holds every member's trace
    traces = {t.id: t for e in episodes for t in e.traces.values()}
    for sample in samples:
        trace = traces[sample.trace_id]
        assert sample.token_ids == [i for n in trace.graph.nodes for i in (n.token_ids or [])]
        assert sum(sample.loss_mask) == sum(sum(n.mask or []) for n in trace.graph.nodes if n.sampled) > 0
        assert abs(sample.advantage) == pytest.approx(1.8) or abs(sample.advantage) < 1.8  # RAE, |R| = 2 chips
    assert metrics["seat/player_0/win_rate"] + metrics["seat/player_1/win_rate"] == pytest.approx(1.0)
    assert metrics["episodes"] == 4 and metrics["episode_errors"] == 0


def test_a_learner_trains_against_a_scripted_opponent_the_env_server_plays(tmp_path):
    """kuhn-poker on a real env server, the learner (the fake OpenAI server: always checks, and folds to a bet) in
    each seat in turn against `always-bet`, which the env server plays; only the learner's traces train, and the
    held-out evaluation plays the same script."""
    env = {"id": "kuhn-poker", "options": {"num_tasks": 8},
           "play": {"learner": "alternate", "opponent": "script", "script": "always-bet"}}
    config = RLConfig.model_validate({
        "steps": 1, "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 2, "group_size": 2, "max_async_steps": 0, "advantage": "group_mean",
                         "train": {"envs": [env]}, "eval": {"envs": [env], "num_tasks": 3}}})
    with FakeOpenAIServer(rule=lambda request: "check fold") as server, \
            local_server("kuhn-poker", {"num_tasks": 8}, workers=1) as address:
        endpoints = Endpoints(base_url=server.base_url, base_model=server.model,
                              envs={"kuhn-poker": address, "eval:kuhn-poker": address})
        orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)

        async def step_and_evaluate():
            try:
                collected = await orchestrator.collect(0, 0, server.model)
                await orchestrator.evaluate(0)
                return collected
            finally:
                await orchestrator.aclose()

        _, metrics = asyncio.run(step_and_evaluate())
    episodes = RLFolder(tmp_path).step_log(0).read().episodes
    assert [sorted(e.models.values()) for e in episodes] == [[server.model, "script:always-bet"]] * 4
    assert [e.trainable for e in episodes] == [{"player_0": True, "player_1": False},
                                               {"player_0": False, "player_1": True}] * 2
    assert metrics["learner/win_rate"] == 0.0 and metrics["rollouts"] == 4  # it folds every bet it faces
    (record,) = [m for m in RLFolder(tmp_path).metrics.read() if "eval_reward" in m]
    assert record["eval_n"] == 6 and record["eval_win_rate"] == 0.0 and record["eval_reward"] == -1.0
