"""`tracegym rl` on an image taskset: each piece that cannot take its images is refused by name, up front."""

import json

import pytest

from tracegym.core.errors import UsageError
from tracegym.train.image_run import ImageRun
from tracegym.train.image_run import check_image_run as check
from tracegym.train.rl_config import RLConfig, env_servers

COLOURS = {"id": "colour-codeword", "options": {"num_tasks": 4}}


@pytest.fixture
def models(tmp_path):
    """A VLM's folder and a text model's (their config.json is what decides)."""
    (tmp_path / "vlm").mkdir()
    (tmp_path / "vlm" / "config.json").write_text(json.dumps({"model_type": "idefics3", "vision_config": {}}))
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return tmp_path


def config(name, envs=(COLOURS,), client: str = "tokens", **fields) -> RLConfig:
    return RLConfig.model_validate({"model": {"name": str(name), "client": client},
                                    "orchestrator": {"train": {"envs": list(envs)}}, **fields})


def check_image_run(c: RLConfig) -> None:
    check(env_servers(c.orchestrator).values(), ImageRun(c.model, c.mode, c.teacher, c.trainer.lora_projector,
                                                         c.weight_sync, c.opd.scorer))


def test_an_rl_run_of_a_vlm_on_an_image_taskset_passes(models):
    check_image_run(config(models / "vlm"))


def test_a_text_model_on_an_image_taskset_is_refused_naming_the_taskset(models):
    with pytest.raises(UsageError, match=r"taskset 'colour-codeword', task .*takes text only"):
        check_image_run(config(models / "text"))


def test_the_chat_client_on_an_image_taskset_is_refused(models):
    with pytest.raises(UsageError, match=r"taskset 'colour-codeword'.*client = 'chat'"):
        check_image_run(config(models / "vlm", client="chat"))


def test_the_chat_client_of_an_sft_student_passes(models):
    check_image_run(config(models / "vlm", client="chat", mode="sft", teacher={"name": str(models / "vlm")}))


def test_opd_scored_by_vllm_on_an_image_taskset_is_refused_naming_the_scorer(models):
    teacher = {"name": str(models / "vlm")}
    with pytest.raises(UsageError, match=r"'colour-codeword'.*mode = 'opd'.*set \[opd\] scorer = 'transformers'"):
        check_image_run(config(models / "vlm", mode="opd", teacher=teacher))


def test_opd_from_a_vlm_teacher_scored_in_process_on_an_image_taskset_passes(models):
    teacher = {"name": str(models / "vlm")}
    check_image_run(config(models / "vlm", mode="opd", teacher=teacher, opd={"scorer": "transformers"}))


def test_opd_from_a_text_teacher_on_an_image_taskset_is_refused(models):
    teacher = {"name": str(models / "text")}
    with pytest.raises(UsageError, match=r"taskset 'colour-codeword'.*\[teacher\] 'text' takes text only"):
        check_image_run(config(models / "vlm", mode="opd", teacher=teacher, opd={"scorer": "transformers"}))


def test_sft_from_a_text_teacher_on_an_image_taskset_is_refused(models):
    teacher = {"name": str(models / "text")}
    with pytest.raises(UsageError, match=r"taskset 'colour-codeword'.*\[teacher\] 'text' takes text only"):
        check_image_run(config(models / "vlm", mode="sft", teacher=teacher))


def test_sft_from_a_vlm_teacher_on_an_image_taskset_passes(models):
    check_image_run(config(models / "vlm", mode="sft", teacher={"name": str(models / "vlm")}))


def test_an_adapter_on_the_projector_with_lora_sync_is_refused(models):
    with pytest.raises(UsageError, match=r"lora_projector.*weight_sync = 'merged'"):
        check_image_run(config(models / "vlm", trainer={"lora_projector": True}))


def test_a_text_taskset_is_not_looked_at_for_images(models):
    check_image_run(config(models / "text", envs=[{"id": "reverse-text"}], client="chat"))
