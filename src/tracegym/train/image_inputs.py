"""Image inputs: what the trainer needs to train a vision-language model on samples with images: the images'
pixel values (read by content hash from the run folder's `images/`, through the model's own image processor, as
vLLM's processing of the same bytes gives them), and the input embeddings with the images' features (the vision
tower and connector, as the model's own forward computes them) at the `<image>` tokens of their placeholder runs.

The trainer trains Idefics3-style models (`TRAINABLE_VLMS`: the embedded VLM, SmolVLM): their features fill the
`<image>` tokens in order, one image's `image_seq_len` tokens after another, and their logits are the text tower's
head on its last hidden state. A LoRA adapter goes on the text tower only (`lora_targets`: the vision tower has
layers of the same names), and on the connector's projection with `TrainerConfig.lora_projector`.

>>> inputs = ImageInputs.load(model_dir, folder_source(run_folder / "images"))  # doctest: +SKIP
>>> embeds = inputs.embedded(model, input_ids, batch.images)  # doctest: +SKIP
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracegym.core.errors import UsageError
from tracegym.core.graph import ImageSpan
from tracegym.core.messages import Message
from tracegym.models.image_prompt import image_bytes, image_hash, message_images
from tracegym.models.image_support import takes_images

if TYPE_CHECKING:
    import torch

TRAINABLE_VLMS = {"idefics3", "smolvlm"}
"""Model types (config.json's `model_type`) whose images the trainer puts in as described above."""
TEXT_TOWER = r"model\.text_model\..*"
"""Where an Idefics3 model keeps its text tower's modules (named as peft sees them)."""
PROJECTOR = r"model\.connector\.modality_projection\.proj"
"""The connector's projection from the vision tower's (pixel-shuffled) features into the text tower's embeddings."""

ImageSource = Callable[[str], bytes]
"""The bytes of an image by the sha256 of its bytes (a ValueError when there is none)."""


def folder_source(images: Path) -> ImageSource:
    """Images from a run folder's `images/` (`config.image_store`: `<sha256>.<ext>`)."""

    def read(sha256: str) -> bytes:
        found = sorted(images.glob(f"{sha256}.*")) if re.fullmatch(r"[0-9a-f]{64}", sha256) else []
        if not found:
            raise ValueError(f"image {sha256} is not in {images}")
        return found[0].read_bytes()

    return read


def is_vlm(model: str | Path) -> bool:
    """Whether the model folder holds a vision-language model (decided by `models.image_support.takes_images`)."""
    return takes_images(model) is True


def check_trainable(config: Any) -> None:
    """A UsageError when the trainer cannot put images into a model of this (transformers) config."""
    kind = getattr(config, "model_type", None)
    if kind not in TRAINABLE_VLMS:
        raise UsageError(f"the trainer trains on images with Idefics3-style models ({', '.join(sorted(TRAINABLE_VLMS))}"
                         f"); this model is {kind!r}")


def lora_targets(model: Any, names: Sequence[str], projector: bool) -> list[str] | str:
    """The modules a LoRA adapter goes on: `names` (suffixes, as peft matches them) on a text model; on a VLM those
    of its text tower only, plus the connector's projection with `projector` (a regex, which peft matches whole)."""
    if getattr(getattr(model, "config", None), "vision_config", None) is None:
        if projector:
            raise UsageError("trainer.lora_projector = true needs a vision-language model (this one takes text only)")
        return list(names)
    check_trainable(model.config)
    suffixes = "|".join(re.escape(name) for name in names)
    pattern = rf"{TEXT_TOWER}\.(?:{suffixes})"
    return f"(?:{pattern}|{PROJECTOR})" if projector else pattern


def rendered_images(token_ids: list[int], messages: Sequence[Message], renderer: Any) -> list[ImageSpan]:
    """The runs of the messages' images in `token_ids` (rendered from the first of them by `renderer`), in order,
    up to the first image not rendered there (a later message's); none when the renderer renders no images. What a
    sample re-rendered from a trace (`sft`) carries, as the token client records them."""
    tokens = getattr(renderer, "images", None)
    if tokens is None:
        return []
    out: list[ImageSpan] = []
    start = 0
    for part in message_images(messages):
        data = image_bytes(part)
        run = tokens.run(data)
        at = next((i for i in range(start, len(token_ids) - len(run) + 1) if token_ids[i:i + len(run)] == run), -1)
        if at < 0:
            break
        out.append(ImageSpan(offset=at, length=len(run), sha256=image_hash(data)))
        start = at + len(run)
    return out


class ImageInputs:
    """A VLM's image processor and where its images come from; pixel values are made once per image."""

    def __init__(self, processor: Any, source: ImageSource) -> None:
        self.processor = processor
        self.source = source
        self._pixels: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def load(cls, model_dir: str | Path, source: ImageSource) -> ImageInputs:
        """The image processor saved with the model in `model_dir`."""
        from transformers import AutoImageProcessor

        try:
            return cls(AutoImageProcessor.from_pretrained(str(model_dir)), source)
        except (OSError, ValueError) as exc:
            raise UsageError(f"model {str(model_dir)!r}: cannot load its image processor: {exc}") from None

    def pixels(self, images: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The pixel values [1, N, 3, H, W] and pixel mask [1, N, H, W] of the images named by hash, in order."""
        import torch

        made = [self._image(sha256) for sha256 in images]
        return torch.cat([p for p, _ in made], dim=1), torch.cat([m for _, m in made], dim=1)

    def _image(self, sha256: str) -> tuple[torch.Tensor, torch.Tensor]:
        if sha256 not in self._pixels:
            from PIL import Image

            with Image.open(io.BytesIO(self.source(sha256))) as image:
                out = self.processor([[image.convert("RGB")]], return_tensors="pt")
            values, mask = out["pixel_values"], out["pixel_attention_mask"]
            if values.shape[1] != 1:
                raise UsageError(f"image {sha256}: the processor split it into {values.shape[1]} tiles; the trainer "
                                 "takes one view per image (do_image_splitting = false)")
            self._pixels[sha256] = values, mask
        return self._pixels[sha256]

    def features(self, model: Any, images: Sequence[str]) -> torch.Tensor:
        """[N, image_seq_len, hidden] the images' features: the vision tower, then the connector."""
        values, mask = self.pixels(images)
        embedding = model.get_input_embeddings().weight  # the vision tower's weights are stored like it
        return model.model.get_image_features(values.to(embedding.device, embedding.dtype), mask.to(embedding.device),
                                              return_dict=True).pooler_output

    def embedded(self, model: Any, input_ids: torch.Tensor, images: Sequence[str]) -> torch.Tensor:
        """[B, T, hidden] the input embeddings of `input_ids`, each `<image>` token's replaced by its image's
        feature (the images named in the order of their runs, row by row); a ValueError when the runs do not
        hold one image's worth of `<image>` tokens each."""
        embeds = model.get_input_embeddings()(input_ids)
        slots = input_ids == model.config.image_token_id
        features = self.features(model, images)
        if int(slots.sum()) != features.shape[0] * features.shape[1]:
            raise ValueError(f"the batch holds {int(slots.sum())} <image> tokens for {len(images)} images of "
                             f"{features.shape[1]} tokens each")
        return embeds.masked_scatter(slots[..., None], features.to(embeds.dtype))
