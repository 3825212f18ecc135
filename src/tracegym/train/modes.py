"""Modes: the one place below the command line that reads a run's `mode` (rl, sft, opd): it picks the signal the
orchestrator hands each step's groups to (`train.signal`), and whom that signal learns from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracegym.core.cut_policy import KEEP, CutPolicy
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import load_renderer
from tracegym.train.advantages import AdvantageConfig, build_advantages
from tracegym.train.distillation import Distiller, OPDConfig, OPDSignal, StepImages, reward_advantage
from tracegym.train.rl_config import Mode, TeacherModel
from tracegym.train.rl_folder import Endpoints
from tracegym.train.sft import SFTConfig, SFTSignal
from tracegym.train.signal import RLSignal, Signal
from tracegym.train.teacher import build_teacher, reach_teacher


def build_signal(mode: Mode, advantage: AdvantageConfig, *, student: Endpoint, endpoints: Endpoints,
                 teacher: TeacherModel | None = None, sft: SFTConfig | None = None, opd: OPDConfig | None = None,
                 truncated_reward: float | None = None, cuts: CutPolicy | None = None,
                 log: Callable[[dict[str, Any]], None] = lambda record: None) -> Signal:
    """The signal of a run in `mode`: `rl` advantages from `advantage`; `opd` those (a group with equal rewards
    kept unless `filter_no_signal` says otherwise) plus the `teacher`'s logprobs (with the samples' images, from
    the step's traces); `sft` the `teacher`'s rollouts, filtered by `sft` and rendered with the `student`'s
    renderer."""
    if mode == "sft":
        if teacher is None:
            raise ValueError("mode = 'sft' needs a [teacher]")
        renderer = load_renderer(student.tokenizer or student.model, student.renderer)
        return SFTSignal(reach_teacher(teacher, endpoints), renderer, sft or SFTConfig())
    advantages = build_advantages(reward_advantage(advantage, mode))
    parts: dict[str, Any] = {"baseline_per_task": advantage.baseline_per == "task",
                             "truncated_reward": truncated_reward, "cuts": cuts or KEEP, "log": log,
                             "per_episode": advantage.per_episode}
    if mode == "opd":
        if teacher is None:
            raise ValueError("mode = 'opd' needs a [teacher]")
        opd = opd or OPDConfig()
        pictures = StepImages()
        distiller = Distiller(build_teacher(teacher, opd.scorer, endpoints, pictures), opd)
        return OPDSignal(advantages, distiller=distiller, pictures=pictures, **parts)
    return RLSignal(advantages, **parts)
