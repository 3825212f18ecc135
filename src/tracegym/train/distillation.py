"""On-policy distillation: each sampled token's advantage is the teacher's logprob of it minus the student's.

The student samples as in RL (exact tokens, the sampler's logprobs); the teacher scores the same token ids. For a
token `x_t` sampled from the student `pi` after prefix `x_<t`, `log q(x_t | x_<t) - log pi(x_t | x_<t)` is the
negative of a one-sample estimate of the reverse KL `KL(pi || q)` at that position, so the policy gradient with it
as the advantage pushes the student towards the teacher where the student actually goes (Agarwal et al. 2024,
"On-policy distillation of language models"; Thinking Machines' tinker-cookbook). The task reward's group advantage
may be mixed in (`reward_weight`). The student's logprob is the sampler's: at temperature 1 (and top_p 1) that is
the student's own distribution; at another temperature it is the tempered one that was sampled.

>>> distilled_advantages([True, True, False], [-1.0, -0.5, 0.0], [-0.2, -0.5, -3.0], OPDConfig())
[0.8, 0.0, 0.0]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import ModelError
from tracegym.core.graph import ImageSpan
from tracegym.core.sample import Sample
from tracegym.models.image_prompt import image_bytes, image_hash, message_images
from tracegym.train.advantages import AdvantageConfig
from tracegym.train.signal import Group, Metrics, RLSignal, StepGroups


class Teacher(Protocol):
    """What scores a sequence (`train.teacher` has the teachers): its logprob of each token after the first, with
    the sequence's images (each in its run of placeholder tokens) where it has some."""

    async def logprobs(self, token_ids: list[int], images: Sequence[ImageSpan] = ()) -> list[float]: ...

    async def aclose(self) -> None: ...


class OPDConfig(BaseModel):
    """The `[opd]` section: how an `opd` run turns the teacher's logprobs into advantages."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kl_weight: float = Field(default=1.0, ge=0.0)
    """Scale of the per-token negative reverse KL (teacher logprob minus student logprob) in the advantage."""
    reward_weight: float = 0.0
    """Weight of the task reward's group advantage (`[orchestrator.advantage]`), added to every sampled token's
    advantage; 0: pure distillation."""
    baseline: Literal["none", "step_mean"] = "none"
    """`step_mean`: the step's mean of `teacher - student` over its sampled tokens is subtracted from every token's
    (a constant baseline: the gradient's expectation is unchanged). Without it, a student far from its teacher gets a
    large negative advantage on every token, which pushes down all it sampled at once and, clipped, moves the
    policy past its samples (`benchmarks/opd_reverse_text.md`)."""
    scorer: Literal["vllm", "transformers"] = "vllm"
    """Who scores the student's tokens: `vllm`, the teacher's endpoint (its `base_url`, or a vLLM server the run
    starts for `[teacher] name`); `transformers`, the teacher directory loaded in the orchestrator's process (no
    server: for a small teacher on a machine short of cores)."""
    concurrency: int = Field(default=16, gt=0)
    """Scoring requests in flight at once (one per sample)."""


def distilled_advantages(loss_mask: Sequence[bool], student: Sequence[float], teacher: Sequence[float],
                         config: OPDConfig, reward_advantage: float = 0.0, baseline: float = 0.0) -> list[float]:
    """One advantage per token: `kl_weight * (teacher - student - baseline) + reward_weight * reward_advantage`
    where the mask is on, 0.0 elsewhere (all three sequences aligned with the sample's tokens)."""
    mixed = config.reward_weight * reward_advantage
    return [config.kl_weight * (t - s - baseline) + mixed if m else 0.0
            for m, s, t in zip(loss_mask, student, teacher, strict=True)]


def distilled(sample: Sample, teacher: Sequence[float], config: OPDConfig, baseline: float = 0.0) -> Sample:
    """`sample` with its per-token advantages from the teacher's logprob of each of its tokens after the first
    (`teacher[i]` is token `i + 1`'s); the first token carries no loss (nothing predicts it)."""
    aligned = [0.0, *teacher]
    if len(aligned) != len(sample):
        raise ValueError(f"{len(teacher)} teacher logprobs for a sample of {len(sample)} tokens")
    advantages = distilled_advantages(sample.loss_mask, sample.logprobs, aligned, config, sample.advantage,
                                      baseline)
    return sample.model_copy(update={"token_advantages": advantages})


def kl_metrics(samples: Sequence[Sample], teachers: Sequence[Sequence[float]]) -> dict[str, float]:
    """Means over every sampled token of the step: the per-token reverse KL estimate (student logprob minus the
    teacher's; 0 when they agree), the teacher's logprob and the student's."""
    student, teacher = [], []
    for sample, scores in zip(samples, teachers, strict=True):
        for mask, mine, theirs in zip(sample.loss_mask[1:], sample.logprobs[1:], scores, strict=True):
            if mask:
                student.append(mine)
                teacher.append(theirs)
    if not student:
        return {}
    return {"opd/kl": statistics.fmean(s - t for s, t in zip(student, teacher, strict=True)),
            "opd/teacher_logprob": statistics.fmean(teacher), "opd/student_logprob": statistics.fmean(student),
            "opd/tokens": float(len(student))}


def reward_advantage(advantage: AdvantageConfig, mode: str) -> AdvantageConfig:
    """The run's reward advantage: in `opd` a group whose rewards are all equal is kept (its tokens still carry the
    teacher's signal) unless `filter_no_signal` is set."""
    if mode != "opd" or advantage.filter_no_signal is not None:
        return advantage
    return advantage.model_copy(update={"filter_no_signal": False})


class Distiller:
    """Scores a step's samples (with their images) with the teacher and sets their per-token advantages."""

    def __init__(self, teacher: Teacher, config: OPDConfig) -> None:
        self.teacher, self.config = teacher, config

    async def __call__(self, samples: list[Sample]) -> tuple[list[Sample], dict[str, float]]:
        """The samples with per-token advantages, and the step's KL figures (`opd/...`)."""
        started = time.monotonic()
        gate = asyncio.Semaphore(self.config.concurrency)

        async def score(sample: Sample) -> list[float]:
            async with gate:
                return await self.teacher.logprobs(sample.token_ids, sample.images)

        teachers = await asyncio.gather(*(score(s) for s in samples))
        figures = kl_metrics(samples, teachers)
        baseline = -figures.get("opd/kl", 0.0) if self.config.baseline == "step_mean" else 0.0
        out = [distilled(s, t, self.config, baseline) for s, t in zip(samples, teachers, strict=True)]
        return out, {**figures, "opd/score_s": time.monotonic() - started}

    async def aclose(self) -> None:
        await self.teacher.aclose()


class StepImages:
    """The images of the step being scored, by sha256 (an `ImageSource`): the teacher's, since the run folder's
    `images/` gets them only when the step's traces are written, after the teacher has scored its samples."""

    def __init__(self) -> None:
        self.images: dict[str, bytes] = {}

    def keep(self, groups: Sequence[Group]) -> None:
        """Hold the images of `groups`' traces (inline ones: the token client's), in place of the last step's."""
        self.images = {}
        for trace in (t for group in groups for episode in group for t in episode.traces.values()):
            for part in message_images(node.message for node in trace.graph.nodes):
                try:
                    data = image_bytes(part)
                except ModelError:  # not inline: no sample carries its run (`image_run` refuses such runs)
                    continue
                self.images[image_hash(data)] = data

    def __call__(self, sha256: str) -> bytes:
        if sha256 not in self.images:
            raise ValueError(f"image {sha256} is in none of the step's traces")
        return self.images[sha256]


@dataclass
class OPDSignal(RLSignal):
    """An `opd` run's signal (`train.signal`): RL's samples of the student's own rollouts (their reward advantage
    weighted by `reward_weight`), each token's advantage then set from the teacher's logprob of it (with the
    images of the step's traces, held in `pictures`)."""

    distiller: Distiller | None = None
    pictures: StepImages = field(default_factory=StepImages)

    async def samples(self, step: StepGroups, version: int) -> tuple[list[Sample], Metrics]:
        self.pictures.keep(step.groups)
        return await super().samples(step, version)

    async def finish(self, samples: list[Sample]) -> tuple[list[Sample], dict[str, float]]:
        if self.distiller is None or not samples:
            return samples, {}
        return await self.distiller(samples)

    async def aclose(self) -> None:
        if self.distiller is not None:
            await self.distiller.aclose()
