"""Slow: the opponent pool against a real vLLM: a checkpoint the trainer saved (its LoRA adapter) is loaded into
the running server under its pool name, and a kuhn-poker episode seated as the orchestrator seats it plays the
pool opponent through it."""

import json
import random
import urllib.request

import pytest

import tracegym as tg
from tracegym.envs.registry import load_taskset
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig
from tracegym.train.opponent_pool import OpponentPool, lora_loader
from tracegym.train.rl_folder import RLFolder
from tracegym.train.seating import Play, Seating
from tracegym.train.trainer import TrainerConfig, build_trainer

pytestmark = pytest.mark.slow


def served_models(base_url: str) -> set[str]:
    with urllib.request.urlopen(f"{base_url}/models", timeout=30) as response:
        return {m["id"] for m in json.load(response)["data"]}


async def test_a_checkpoint_adapter_loaded_by_the_pool_plays_a_real_episode(tmp_path):
    model_dir = str(embedded_model_dir())
    folder = RLFolder(tmp_path)
    trainer = build_trainer(TrainerConfig(model=model_dir, lora_rank=8, num_threads=1))
    checkpoint = folder.new_checkpoint(1)  # as the trainer loop writes one: the state, then its DONE marker
    trainer.save(checkpoint)
    folder.complete(checkpoint, trainer.version)
    config = VLLMServerConfig(model=model_dir, served_model_name=SERVED_MODEL_NAME, max_model_len=1024,
                              enable_lora=True, max_lora_rank=8)
    with VLLMServer(config) as server:
        policy = tg.Endpoint(base_url=server.base_url, model=SERVED_MODEL_NAME, api_key_env=None)
        pool = OpponentPool(folder, lora_loader(policy.servers()), base_model=SERVED_MODEL_NAME)
        assert pool.refresh() == ["pool-step-000001"]
        assert "pool-step-000001" in served_models(server.base_url)
        play = Play(learner="alternate", opponent="pool", pool_pick="latest")
        seating = Seating(["player_0", "player_1"], play, {}, policy, SERVED_MODEL_NAME, pool.draw)
        seats = seating.binding("player_1", SERVED_MODEL_NAME, random.Random(0))  # the opponent moves first
        kuhn = load_taskset("kuhn-poker", {"seed": 3})
        [row] = list(kuhn.head(1))
        episode = await tg.run_episode(kuhn, row, policy, seats=seats,
                                       sampling=tg.Sampling(temperature=0.0, max_tokens=16))

    assert episode.ended_normally and episode.error is None, episode.error
    assert episode.models == {"player_0": "pool-step-000001", "player_1": SERVED_MODEL_NAME}
    assert episode.trainable == {"player_0": False, "player_1": True}
    opponent = episode.traces["player_0"]
    assert opponent.model == "pool-step-000001" and opponent.num_turns >= 1 and not opponent.errors
    assert episode.outcomes and set(episode.rewards.values()) <= {-1.0, 0.0, 1.0}
