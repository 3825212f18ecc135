"""Opponent pool: the base model and each complete checkpoint's adapter, loaded once each into every server of
the run's vLLM under its own name; opponents drawn from the latest N, uniformly or the newest."""

import json
import random

import pytest
from test_weight_sync import FakeLoraServer

from tracegym.core.errors import InfrastructureError, UsageError
from tracegym.train.opponent_pool import OpponentPool, lora_loader
from tracegym.train.rl_folder import RLFolder
from tracegym.train.seating import Play


def checkpoint(folder: RLFolder, step: int, adapter: bool = True, done: bool = True) -> None:
    path = folder.new_checkpoint(step)
    (path / "adapter").mkdir(parents=True)
    if adapter:
        (path / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 8}))
    if done:
        folder.complete(path, step)


@pytest.fixture
def loaded():
    return []


def pool(tmp_path, loaded) -> tuple[RLFolder, OpponentPool]:
    folder = RLFolder(tmp_path)
    return folder, OpponentPool(folder, lambda path, name, step: loaded.append((path, name, step)), "base")


def play(**fields) -> Play:
    return Play(learner="alternate", opponent="pool", **fields)


def test_before_any_checkpoint_the_pool_is_the_base_model(tmp_path, loaded):
    _, opponents = pool(tmp_path, loaded)
    assert opponents.refresh() == [] and opponents.draw(random.Random(0), play()) == "base"


def test_each_complete_checkpoint_is_loaded_once_under_its_own_name(tmp_path, loaded):
    folder, opponents = pool(tmp_path, loaded)
    checkpoint(folder, 5)
    checkpoint(folder, 10, done=False)  # being written: not yet
    assert opponents.refresh() == ["pool-step-000005"]
    checkpoint(folder, 10)
    assert opponents.refresh() == ["pool-step-000010"] and opponents.refresh() == []
    assert [(p.parent.name, name, step) for p, name, step in loaded] == [
        ("step-000005", "pool-step-000005", 5), ("step-000010", "pool-step-000010", 10)]


def test_opponents_come_from_the_latest_n_policies_uniformly(tmp_path, loaded):
    folder, opponents = pool(tmp_path, loaded)
    for step in (5, 10, 15):
        checkpoint(folder, step)
    opponents.refresh()
    draws = {opponents.draw(random.Random(seed), play(pool_latest=2)) for seed in range(50)}
    assert draws == {"pool-step-000010", "pool-step-000015"}


def test_pick_latest_always_draws_the_newest(tmp_path, loaded):
    folder, opponents = pool(tmp_path, loaded)
    checkpoint(folder, 5)
    opponents.refresh()
    assert {opponents.draw(random.Random(seed), play(pool_pick="latest")) for seed in range(10)} == {"pool-step-000005"}


def test_a_checkpoint_without_an_adapter_is_a_usage_error(tmp_path, loaded):
    folder, opponents = pool(tmp_path, loaded)
    checkpoint(folder, 5, adapter=False)
    with pytest.raises(UsageError, match="needs a LoRA run"):
        opponents.refresh()


def test_each_adapter_is_loaded_into_every_server_of_the_run(tmp_path):
    folder = RLFolder(tmp_path)
    checkpoint(folder, 5)
    with FakeLoraServer() as first, FakeLoraServer() as replica:
        assert OpponentPool(folder, lora_loader([first.base_url, replica.base_url]), "base").refresh() == [
            "pool-step-000005"]
    for fake in (first, replica):
        [(route, body)] = fake.bodies
        assert route == "/v1/load_lora_adapter" and body["lora_name"] == "pool-step-000005"


def test_an_adapter_a_server_did_not_get_stays_out_of_the_pool_until_a_refresh_loads_it_everywhere(tmp_path, caplog):
    folder = RLFolder(tmp_path)
    for step in (5, 10):
        checkpoint(folder, step)
    with FakeLoraServer() as first, FakeLoraServer(500, "down") as replica:
        opponents = OpponentPool(folder, lora_loader([first.base_url, replica.base_url]), "base")
        assert opponents.refresh() == [] and opponents.candidates(3) == ["base"]
        assert f"did not reach {replica.base_url}" in caplog.text
        replica.status = 200
        assert opponents.refresh() == ["pool-step-000005", "pool-step-000010"]
    assert opponents.candidates(3) == ["base", "pool-step-000005", "pool-step-000010"]


def test_a_pool_refresh_that_fails_for_some_checkpoints_keeps_the_policies_in_step_order(tmp_path):
    folder = RLFolder(tmp_path)
    for step in (5, 10):
        checkpoint(folder, step)
    down = {5}

    def load(path, name, step):
        if step in down:
            raise InfrastructureError("server down")

    opponents = OpponentPool(folder, load, "base")
    assert opponents.refresh() == ["pool-step-000010"]
    down.clear()
    assert opponents.refresh() == ["pool-step-000005"]
    assert opponents.candidates(2) == ["pool-step-000005", "pool-step-000010"]
