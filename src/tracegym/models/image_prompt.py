"""Image prompt: a vision-language model's image placeholders in prompt token ids, expanded as its processor expands
them, and where each image's run lies.

A renderer writes one image token (`<image>` for Idefics3) where a message carries an image; `ImageTokens.expand`
replaces each with the run the model's own processor makes of that image (for Idefics3: the image token repeated
`image_seq_len` times per tile, framed by its tile and global-image tokens), found by running the processor on
the image token and the image alone (kept by the image's hash: a conversation's images are processed once per
process). Special tokens split the text around them, so the text between images tokenizes as in the processor's
own render of the whole prompt. `spans` locates each image's run in a finished prompt; `collapse` turns the runs
back into one image token each, the prompt vLLM expands itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

from tracegym.core.errors import ModelError, UsageError
from tracegym.core.graph import ImageSpan
from tracegym.core.messages import ImagePart, Message

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
"""A model folder with one of these has an image processor (a VLM)."""


def image_bytes(part: ImagePart) -> bytes:
    """The bytes of an image part's `data:` URI (base64 or percent-encoded); a ModelError for any other URL (the
    token path sends the image itself, so it must be inline)."""
    url = part.image_url.get("url", "")
    if not url.startswith("data:") or "," not in url:
        raise ModelError(f"image {url[:60]!r} is not a data: URI; the token client sends images inline only")
    header, payload = url[5:].split(",", 1)
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ModelError(f"image data: URI ({header}) is not valid base64: {exc}") from None
    return unquote_to_bytes(payload)


def image_hash(data: bytes) -> str:
    """An image's content hash: the sha256 of its bytes, in hex."""
    return hashlib.sha256(data).hexdigest()


def message_images(messages: Iterable[Message]) -> list[ImagePart]:
    """The image parts of `messages`, in order."""
    return [p for m in messages if isinstance(m.content, list) for p in m.content if isinstance(p, ImagePart)]


class ImageTokens:
    """One VLM's image placeholders: `ImageTokens(processor)` for a Hugging Face processor with an image token."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.image_token: str = processor.image_token
        self.image_token_id: int = int(processor.tokenizer.convert_tokens_to_ids(self.image_token))
        self._runs: dict[str, list[int]] = {}

    def run(self, data: bytes) -> list[int]:
        """The ids the processor expands one image token into for this image."""
        key = image_hash(data)
        if key not in self._runs:
            self._runs[key] = self._processed_run(data)
        return self._runs[key]

    def _processed_run(self, data: bytes) -> list[int]:
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except (UnidentifiedImageError, OSError) as exc:
            raise ModelError(f"image {image_hash(data)[:12]} cannot be read: {exc}") from None
        ids = self.processor(text=self.image_token, images=[image.convert("RGB")])["input_ids"][0]
        return [int(t) for t in ids]

    def expand(self, ids: list[int], images: Sequence[ImagePart]) -> list[int]:
        """`ids` with its image tokens (one per image in `images`, in order) replaced by each image's run."""
        marks = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(marks) != len(images):
            raise ModelError(f"the rendered prompt has {len(marks)} {self.image_token} tokens for {len(images)} "
                             f"images (does a message's text spell {self.image_token}?)")
        out: list[int] = []
        start = 0
        for mark, part in zip(marks, images, strict=True):
            out += ids[start:mark]
            out += self.run(image_bytes(part))
            start = mark + 1
        return out + ids[start:]

    def spans(self, prompt_ids: list[int], images: Sequence[ImagePart]) -> list[ImageSpan]:
        """Each image's run in `prompt_ids` (found in order), with its hash; a ModelError when one is missing."""
        found: list[ImageSpan] = []
        start = 0
        for number, part in enumerate(images):
            data = image_bytes(part)
            run = self.run(data)
            at = _find(prompt_ids, run, start)
            if at < 0:
                raise ModelError(f"image {number} ({image_hash(data)[:12]}) has no placeholder run in the prompt")
            found.append(ImageSpan(offset=at, length=len(run), sha256=image_hash(data)))
            start = at + len(run)
        return found


    def collapse(self, prompt_ids: list[int], spans: Sequence[ImageSpan]) -> list[int]:
        """`prompt_ids` with each image's run (`spans`, in order) back to one image token: the prompt vLLM takes
        with the images, which it expands itself (its processor's runs; it answers with the ids it made)."""
        out: list[int] = []
        start = 0
        for span in spans:
            out += prompt_ids[start:span.offset]
            out.append(self.image_token_id)
            start = span.offset + span.length
        return out + prompt_ids[start:]


def _find(ids: list[int], run: list[int], start: int) -> int:
    """The first index >= `start` where `run` occurs in `ids`, else -1."""
    first, n = run[0], len(run)
    for at in range(start, len(ids) - n + 1):
        if ids[at] == first and ids[at:at + n] == run:
            return at
    return -1


def load_image_tokens(name_or_path: str) -> ImageTokens | None:
    """The image placeholders of the model folder `name_or_path` when it has an image processor, else None (a
    text-only model, or a hub id: only local folders are asked)."""
    folder = Path(name_or_path).expanduser()
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        return None
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(folder)
    except Exception as exc:  # transformers raises many kinds; the folder is at fault either way
        raise UsageError(f"--model.tokenizer {name_or_path!r}: cannot load its image processor ({exc})") from None
    if not isinstance(getattr(processor, "image_token", None), str):
        return None
    return ImageTokens(processor)
