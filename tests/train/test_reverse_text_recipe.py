"""The reverse-text recipe's shipped configs: SFT, then RL or OPD from its weights, on one disjoint split."""

import tomllib
from pathlib import Path

import pytest

from tracegym.train.rl_config import RLConfig

CONFIGS = Path(__file__).parents[2] / "configs"


def _config(name: str) -> RLConfig:
    return RLConfig.model_validate(tomllib.loads((CONFIGS / name).read_text()))


SFT = "sft/reverse_text_recipe.toml"
FOLLOWERS = ["rl/reverse_text_from_sft.toml", "opd/reverse_text.toml"]


def _sft_weights() -> str:
    sft = _config(SFT)
    return str(sft.output_dir / str(sft.run_id) / "weights" / "merged")


def test_the_sft_stage_writes_servable_weights_under_a_fixed_run_id():
    sft = _config(SFT)
    assert sft.mode == "sft" and sft.weight_sync == "merged" and sft.run_id == "reverse-text-recipe"
    assert sft.steps % sft.checkpoint_every == 0  # its last step is a checkpoint: weights/merged is the last policy


def test_the_rl_stage_starts_from_the_sft_stages_weights_on_the_exact_reward():
    rl = _config("rl/reverse_text_from_sft.toml")
    assert rl.mode == "rl" and rl.model.name == _sft_weights()
    assert all(env.options["reward"] == "exact" for env in rl.orchestrator.train.envs)


def test_the_opd_teacher_is_the_sft_stages_weights():
    opd = _config("opd/reverse_text.toml")
    assert opd.mode == "opd" and opd.teacher is not None and opd.teacher.name == _sft_weights()


@pytest.mark.parametrize("follower", FOLLOWERS)
def test_every_stage_is_evaluated_on_the_same_held_out_tasks(follower):
    first, then = _config(SFT).orchestrator.eval, _config(follower).orchestrator.eval
    assert [(e.id, e.options) for e in then.envs] == [(e.id, e.options) for e in first.envs]
    assert then.num_tasks == first.num_tasks and then.sampling.temperature == first.sampling.temperature == 0.0


@pytest.mark.parametrize("name", [SFT, *FOLLOWERS])
def test_every_stage_trains_on_the_train_side_and_evaluates_on_the_held_out_side(name):
    config = _config(name)
    assert {env.options["split"] for env in config.orchestrator.train.envs} == {"train"}
    assert {env.options["split"] for env in config.orchestrator.eval.envs} == {"held_out"}
