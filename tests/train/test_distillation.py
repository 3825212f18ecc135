"""On-policy distillation: the per-token advantage against hand-computed values, the mix with the reward's group
advantage, the step's KL figures, and the distiller over a step's samples."""

import base64
import hashlib
import math
from collections.abc import Sequence

import pytest

import tracegym as tg
from tracegym.core.episode import Episode
from tracegym.core.graph import ImageSpan
from tracegym.core.messages import ImagePart, TextPart, user
from tracegym.core.sample import Sample
from tracegym.core.trace import Trace
from tracegym.train.advantages import AdvantageConfig, build_advantages
from tracegym.train.distillation import (
    Distiller,
    OPDConfig,
    StepImages,
    distilled,
    distilled_advantages,
    kl_metrics,
    reward_advantage,
)


def branch(advantage: float = 0.0) -> Sample:
    """A 2-token prompt and a 3-token completion sampled with probabilities 0.5, 0.25 and 0.8."""
    student = [0.0, 0.0, math.log(0.5), math.log(0.25), math.log(0.8)]
    return Sample(token_ids=[1, 2, 3, 4, 5], loss_mask=[False, False, True, True, True], logprobs=student,
                  advantage=advantage)


TEACHER = [math.log(0.9), math.log(0.1), math.log(0.5), math.log(0.2)]
"""The teacher's probability of tokens 2..5 (the first token has none): it agrees with the student's first choice
(0.5 each way of rounding: see the test), likes the second less and the third much less."""


def test_the_advantage_is_the_teacher_logprob_minus_the_students_on_sampled_tokens():
    out = distilled(branch(), TEACHER, OPDConfig())
    # token 3: log 0.1 - log 0.5 = log 0.2; token 4: log 0.5 - log 0.25 = log 2; token 5: log 0.2 - log 0.8 = log 0.25
    assert out.token_advantages == pytest.approx([0.0, 0.0, math.log(0.2), math.log(2.0), math.log(0.25)])
    assert out.token_ids == branch().token_ids and out.advantage == 0.0


def test_the_reward_advantage_is_mixed_into_every_sampled_token_by_its_weight():
    config = OPDConfig(kl_weight=0.5, reward_weight=2.0)
    out = distilled(branch(advantage=0.25), TEACHER, config)
    expected = [0.0, 0.0, 0.5 * math.log(0.2) + 0.5, 0.5 * math.log(2.0) + 0.5, 0.5 * math.log(0.25) + 0.5]
    assert out.token_advantages == pytest.approx(expected)


def test_a_zero_kl_weight_leaves_the_reward_advantage_alone():
    out = distilled(branch(advantage=-1.5), TEACHER, OPDConfig(kl_weight=0.0, reward_weight=1.0))
    assert out.token_advantages == [0.0, 0.0, -1.5, -1.5, -1.5]


def test_distilled_advantages_doctest_case():
    assert distilled_advantages([True, True, False], [-1.0, -0.5, 0.0], [-0.2, -0.5, -3.0], OPDConfig()) == \
        pytest.approx([0.8, 0.0, 0.0])


def test_teacher_logprobs_of_another_length_are_refused():
    with pytest.raises(ValueError, match="3 teacher logprobs for a sample of 5 tokens"):
        distilled(branch(), TEACHER[:3], OPDConfig())


def test_a_sample_refuses_per_token_advantages_of_another_length():
    with pytest.raises(ValueError, match="token_advantages"):
        Sample.model_validate({**branch().model_dump(), "token_advantages": [0.0]})


def test_kl_metrics_are_means_over_the_sampled_tokens():
    metrics = kl_metrics([branch()], [TEACHER])
    student = [math.log(0.5), math.log(0.25), math.log(0.8)]
    teacher = TEACHER[1:]
    assert metrics["opd/kl"] == pytest.approx(sum(s - t for s, t in zip(student, teacher, strict=True)) / 3)
    assert metrics["opd/teacher_logprob"] == pytest.approx(sum(teacher) / 3)
    assert metrics["opd/student_logprob"] == pytest.approx(sum(student) / 3)
    assert metrics["opd/tokens"] == 3


def test_kl_is_zero_when_the_teacher_is_the_student():
    sample = branch()
    assert kl_metrics([sample], [sample.logprobs[1:]])["opd/kl"] == 0.0


class TableTeacher:
    """A teacher that gives every token the logprob log(1 / (token id + 1)), and records what it scored."""

    def __init__(self) -> None:
        self.scored: list[list[int]] = []
        self.images: list[list[ImageSpan]] = []
        self.closed = False

    async def logprobs(self, token_ids: list[int], images: Sequence[ImageSpan] = ()) -> list[float]:
        self.scored.append(token_ids)
        self.images.append(list(images))
        return [-math.log(t + 1) for t in token_ids[1:]]

    async def aclose(self) -> None:
        self.closed = True


async def test_the_distiller_scores_each_sample_once_and_reports_the_kl():
    teacher = TableTeacher()
    distiller = Distiller(teacher, OPDConfig(concurrency=1))
    samples = [branch(), branch().model_copy(update={"token_ids": [1, 2, 3, 4, 9]})]
    out, metrics = await distiller(samples)
    assert sorted(teacher.scored) == sorted(s.token_ids for s in samples)
    assert out[1].token_advantages[4] == pytest.approx(-math.log(10) - math.log(0.8))
    assert set(metrics) == {"opd/kl", "opd/teacher_logprob", "opd/student_logprob", "opd/tokens", "opd/score_s"}
    await distiller.aclose()
    assert teacher.closed


async def test_the_distiller_gives_the_teacher_each_samples_images():
    picture = ImageSpan(offset=1, length=2, sha256="a" * 64)
    teacher = TableTeacher()
    await Distiller(teacher, OPDConfig(concurrency=1))([branch().model_copy(update={"images": [picture]}), branch()])
    assert teacher.images == [[picture], []]


def test_the_step_images_are_those_of_the_steps_traces_by_hash():
    data = b"\x89PNG not really"
    trace = Trace(task=tg.TaskData(prompt="p"))
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    trace.graph.add(user([ImagePart(image_url={"url": uri}), TextPart(text="which colour?")]))
    images = StepImages()
    images.keep([[Episode.solo(trace)]])
    assert images(hashlib.sha256(data).hexdigest()) == data
    with pytest.raises(ValueError, match="in none of the step's traces"):
        images("0" * 64)


async def test_a_step_mean_baseline_centres_the_kl_advantage_over_the_steps_sampled_tokens():
    samples = [branch(), branch().model_copy(update={"token_ids": [1, 2, 3, 4, 9]})]
    out, metrics = await Distiller(TableTeacher(), OPDConfig(baseline="step_mean"))(samples)
    plain, _ = await Distiller(TableTeacher(), OPDConfig())(samples)
    sampled = [a for sample in out for a, m in zip(sample.token_advantages, sample.loss_mask, strict=True) if m]
    assert sum(sampled) == pytest.approx(0.0)
    assert out[0].token_advantages[3] == pytest.approx(plain[0].token_advantages[3] + metrics["opd/kl"])


def test_opd_keeps_groups_whose_rewards_are_all_equal_unless_told_otherwise():
    assert build_advantages(reward_advantage(AdvantageConfig(), "opd")).filter_no_signal is False
    assert build_advantages(reward_advantage(AdvantageConfig(), "rl")).filter_no_signal is True
    told = AdvantageConfig(filter_no_signal=True)
    assert reward_advantage(told, "opd") is told
