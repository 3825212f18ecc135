"""The teacher of an `opd` run on images: the embedded VLM's folder scored in process puts each image's features in
its run (its logprobs are the model's own forward with the processor's pixel values, and the image changes them),
and a teacher that cannot take the images refuses them by name rather than drop them."""

import pytest
import torch
from tests.train import test_image_trainer as image_trainer
from tests.train.test_image_trainer import direct_logprobs, encoded, image_sample

from tracegym.core.errors import UsageError
from tracegym.models.embedded import embedded_model_dir
from tracegym.models.endpoint import Endpoint
from tracegym.train.rl_config import TeacherModel
from tracegym.train.rl_folder import Endpoints
from tracegym.train.teacher import TransformersTeacher, VLLMTeacher, build_teacher

vlm, pictures = image_trainer.vlm, image_trainer.pictures  # the embedded VLM and two pictures, as the trainer's tests


@pytest.fixture(scope="module")
def teacher(vlm, pictures):
    """The embedded VLM as an `[opd] scorer = "transformers"` teacher, its images read by hash."""
    folder, _, _ = vlm
    built = build_teacher(TeacherModel(name=str(folder)), "transformers",
                          Endpoints(base_url="http://127.0.0.1:9/v1", base_model="m", envs={}), pictures.__getitem__)
    assert isinstance(built, TransformersTeacher)
    return built


@pytest.fixture(scope="module")
def red(vlm, pictures, teacher):
    """The first picture's sample, its encoding, and the teacher's logprobs of its tokens after the first."""
    _, processor, _ = vlm
    sha, data = next(iter(pictures.items()))
    sample = image_sample(processor, sha, data)
    return sample, encoded(processor, data), torch.tensor(teacher._logprobs(sample.token_ids, [sha]))


def test_the_teachers_logprobs_with_an_image_equal_the_models_forward_with_the_processors_pixels(teacher, red):
    sample, inputs, logprobs = red
    everywhere = [True] * len(sample)
    assert torch.allclose(logprobs, direct_logprobs(teacher.model, inputs, True, everywhere), atol=1e-4)


def test_the_teachers_logprobs_with_an_image_differ_from_scoring_without_it(teacher, red):
    sample, _, logprobs = red
    assert (logprobs - torch.tensor(teacher._logprobs(sample.token_ids, []))).abs().max() > 1e-3


async def test_the_teacher_scores_the_images_a_sample_carries(teacher, red):
    sample, _, logprobs = red
    scored = await teacher.logprobs(sample.token_ids, sample.images)
    assert torch.allclose(torch.tensor(scored), logprobs)


async def test_an_endpoint_teacher_given_images_refuses_them_naming_the_teacher(red):
    teacher = VLLMTeacher(Endpoint(base_url="http://127.0.0.1:9/v1", model="m", api_key_env=None))
    with pytest.raises(UsageError, match=r"\[teacher\] endpoint .* takes token ids only.*scorer = 'transformers'"):
        await teacher.logprobs(red[0].token_ids, red[0].images)
    await teacher.aclose()


async def test_a_text_teacher_given_images_refuses_them_naming_the_teacher(red):
    teacher = TransformersTeacher(str(embedded_model_dir()))
    with pytest.raises(UsageError, match=r"\[teacher\] .* cannot score a sample with images: it takes text only"):
        await teacher.logprobs(red[0].token_ids, red[0].images)
