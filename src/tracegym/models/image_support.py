"""Image support: whether a model takes images (decided here, in one place: its Hugging Face `config.json` has a
`vision_config`), which images it may be given (readable, of a format its processor takes, within the size
limits), and the gate that refuses any other by name before the model call.

The rollout loop asks `refused_image` before every model call, with the `ImagePolicy` of its client (`policy_of`:
an endpoint's settings, or the defaults for a client of another kind): a request whose messages carry an image the
model cannot be given ends that rollout with ImageRefused naming the taskset, the task, the message and the image
(failure kind `image_refused`), and its siblings go on. Only base64 `data:` URIs are read; an image URL elsewhere
is the server's to fetch (or refuse).
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tracegym.core.image_ref import FORMATS, decoded, sniffed_format
from tracegym.core.messages import ImagePart, Message
from tracegym.models.client import ModelClient
from tracegym.models.client_settings import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from tracegym.models.endpoint_client import EndpointClient

VISION_KEY = "vision_config"
"""The key of a Hugging Face config that says the model has a vision tower (Idefics3, SmolVLM, Qwen-VL, LLaVA...)."""


def takes_images(model: str | Path | None) -> bool | None:
    """Whether the model in directory `model` takes images: its `config.json` has a `vision_config`; None when
    there is no such file here to read (a hub id, an endpoint's model name)."""
    if model is None:
        return None
    config = Path(model) / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    return isinstance(data, dict) and VISION_KEY in data


def why_text_only(model: str) -> str:
    """The reason a model counts as taking text only, as a refusal says it."""
    return f"model {model!r} takes text only (its config.json has no {VISION_KEY})"


def image_problem(url: str, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS) -> str | None:
    """Why an image cannot be given to a model (unreadable, oversized, a format the processor does not take), or
    None when it can (and for a URL elsewhere, which is not read here)."""
    try:
        found = decoded(url)
    except ValueError as exc:
        return f"unreadable: {exc}"
    if found is None:
        return None
    data = found[1]
    if len(data) > max_bytes:
        return f"oversized: {len(data):,} bytes, more than max_image_bytes = {max_bytes:,}"
    kind = sniffed_format(data)
    if kind is None:
        return (f"a format the model's processor does not take (declared {found[0]}; it takes "
                f"{', '.join(FORMATS)})")
    return _pixels_problem(data, kind, max_pixels)


def _pixels_problem(data: bytes, kind: str, max_pixels: int) -> str | None:
    from PIL import Image  # imported here: only checking an image needs Pillow

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                if width * height > max_pixels:
                    return f"oversized: {width}x{height} pixels, more than max_image_pixels = {max_pixels:,}"
                image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return f"unreadable {kind}: {exc}"
    return None


@dataclass(frozen=True)
class ImagePolicy:
    """What images a model may be given: whether it takes any (None: not known, so only the images themselves are
    checked), and the size limits."""

    model: str
    takes: bool | None = None
    max_bytes: int = MAX_IMAGE_BYTES
    max_pixels: int = MAX_IMAGE_PIXELS


def policy_of(client: ModelClient) -> ImagePolicy:
    """The image policy of a live client: its endpoint's (`ClientSettings.images` and the limits), else the
    defaults (a client of another kind: a scripted one, a user's own)."""
    if isinstance(client, EndpointClient):
        e = client.endpoint
        return ImagePolicy(e.model, e.images, e.max_image_bytes, e.max_image_pixels)
    return ImagePolicy(client.name)


def refused_image(messages: Sequence[Message], policy: ImagePolicy, checked: set[str] | None = None) -> str | None:
    """Why the first image of `messages` the model cannot be given is refused (`message 2 (tool), image 1: ...`);
    None when every one can. `checked`: URLs found good before (skipped), to which those found good now are
    added."""
    for i, message in enumerate(messages):
        for k, part in enumerate(images_of(message), start=1):
            where = f"message {i} ({message.role}), image {k}"
            if policy.takes is False:
                return f"{where}: {why_text_only(policy.model)}"
            url = part.image_url.get("url", "")
            if checked is not None and url in checked:
                continue
            problem = image_problem(url, policy.max_bytes, policy.max_pixels)
            if problem is not None:
                return f"{where}: {problem}"
            if checked is not None:
                checked.add(url)
    return None


def images_of(message: Message) -> list[ImagePart]:
    """The image parts of a message, in order."""
    return [p for p in message.content if isinstance(p, ImagePart)] if isinstance(message.content, list) else []
