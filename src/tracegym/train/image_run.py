"""Image run: the checks `tracegym rl` makes, before anything starts, of a run whose tasksets show images: every piece
that meets the images must take them, and the one that cannot is named with the taskset, never left to drop them.

A run on an image taskset needs: a student that takes images (a VLM's folder), the token client in `rl` (the chat
client records no image runs, so its samples would train on placeholders without the pictures; `sft` re-renders
the teacher's traces and finds the runs itself), weight sync that reaches
what the trainer trains (vLLM loads no adapter on the connector: `lora_projector` needs merged weights), in `sft`
and `opd` a teacher that takes images, and in `opd` the teacher scored in process (`[opd] scorer = "transformers"`:
vLLM's completions API, through which the `vllm` scorer sends token ids, takes no images).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tracegym.core.errors import UsageError
from tracegym.envs.image_input import check_images_taken, first_image
from tracegym.envs.registry import load_taskset
from tracegym.models.launch import choice_takes_images
from tracegym.models.model_choice import ModelChoice
from tracegym.train.rl_config import EnvChoice


@dataclass(frozen=True)
class ImageRun:
    """The parts of a run's config that meet its images."""

    model: ModelChoice
    mode: str = "rl"
    teacher: ModelChoice | None = None
    lora_projector: bool = False
    weight_sync: str = "lora"
    scorer: str = "vllm"
    """`[opd] scorer`."""

    def problem(self) -> str | None:
        """Which piece of the run cannot take images, if one cannot."""
        if self.model.client == "chat" and self.mode != "sft":  # sft trains on the teacher's traces, re-rendered
            return ("[model] client = 'chat' records no image runs in the traces (the trainer would see "
                    "placeholders without the pictures); use client = 'tokens'")
        if self.mode == "opd" and self.scorer != "transformers":
            return (f"mode = 'opd' with [opd] scorer = {self.scorer!r} cannot score them: the teacher would score the "
                    "student's token ids through vLLM's completions API, which takes no images; set [opd] scorer = "
                    "'transformers' (the teacher's folder loaded in process)")
        if self.mode in ("sft", "opd") and self.teacher is not None and choice_takes_images(self.teacher) is False:
            return f"the [teacher] {self.teacher.display_name()!r} takes text only; give a vision-language teacher"
        if self.lora_projector and self.weight_sync == "lora":
            return ("trainer.lora_projector = true trains an adapter on the connector, which vLLM does not load as an "
                    "adapter; use weight_sync = 'merged'")
        return None


def check_image_run(envs: Iterable[EnvChoice], run: ImageRun) -> None:
    """A UsageError naming the taskset (and where it shows an image) and the piece that cannot take its images;
    nothing for a run whose tasksets (those of `envs` started here, whose code imports here) show none. The images
    of a taskset not looked at here are refused per rollout (`models.image_support`)."""
    for env in envs:
        if env.address is not None:  # an env server elsewhere: its taskset is not here to look at
            continue
        try:
            taskset = load_taskset(env.id, env.options)
        except UsageError:  # its code imports only where its env server runs: that server says what is wrong
            continue
        where = first_image(taskset)
        if where is None:
            continue
        check_images_taken(taskset, choice_takes_images(run.model), run.model.display_name())
        problem = run.problem()
        if problem is not None:
            raise UsageError(f"taskset {taskset.id!r}, {where}: the taskset shows images and {problem}")
