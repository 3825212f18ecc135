"""Client settings: which model client a rollout uses and its network policy, the fields an `Endpoint` and the
`[model]` section (`ModelChoice`) share, declared once with their defaults.

>>> ClientSettings().max_retries, ClientSettings(client="tokens").renderer
(3, 'auto')
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_IMAGE_BYTES = 8 << 20
"""The default most bytes one image given to a model may hold (`--model.max-image-bytes`)."""
MAX_IMAGE_PIXELS = 4096 * 4096
"""The default most pixels (width x height) of one image given to a model (`--model.max-image-pixels`)."""
ClientKind = Literal["chat", "tokens"]
"""Which model client a rollout uses (see `ClientSettings.client`)."""


class ClientSettings(BaseModel):
    """The client kind, its tokenizer and renderer, the API key's variable, and the retry policy. Plain fields, so
    both users keep them flat: an Endpoint's wire keys and the `[model]` section's TOML keys and flags."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the endpoint's API key; None (or unset) sends no key."""
    client: ClientKind = "chat"
    """`chat`: chat completions (any endpoint); `tokens`: render locally and send token ids to vLLM's completions
    endpoint, so multi-turn prompts extend the exact sampled tokens (the model's chat template must be covered by a
    renderer)."""
    tokenizer: str | None = None
    """Tokenizer directory or hub id for `client = "tokens"` (default: the served model's)."""
    renderer: str = "auto"
    """Chat template renderer for `client = "tokens"`: `auto` (the `renderers` package by hub id, else ours for
    ChatML templates), `chatml`, or a `renderers` package name such as `qwen3` (a local copy or fine-tune of a
    known model needs it named)."""
    timeout: float = Field(default=300.0, gt=0)
    """Seconds one HTTP attempt of a model call may take; a slower one is retried like a connection error. In a
    rollout the model stage (`Timeouts.model`, also 300 s by default) bounds the whole call, every attempt and
    backoff included, and cancels it at its deadline whatever this says, so a hung endpoint holds a rollout's slot
    no longer than the stage. Keep this at most the stage's timeout (`tracegym eval` caps it there); lower, a hung
    attempt is retried within the stage."""
    max_retries: int = Field(default=3, ge=0)
    """Retries of a model call after a connection error, a timeout, HTTP 429 or 5xx; never after another 4xx."""
    backoff: float = Field(default=0.5, ge=0)
    """First retry delay in seconds; doubles each retry, with jitter."""
    images: bool | None = None
    """Whether the model takes images; unset: decided from its `config.json` where its weights are on this machine
    (a `vision_config`: `models.image_support`), else not known (an endpoint elsewhere refuses what it cannot take).
    A model that takes text only is refused an image by name: before any rollout where the taskset shows it up
    front, else before the model call (the rollout fails as `image_refused`; the others go on)."""
    max_image_bytes: int = Field(default=MAX_IMAGE_BYTES, ge=1)
    """Most bytes one image given to the model may hold; a bigger one is refused by name before the model call."""
    max_image_pixels: int = Field(default=MAX_IMAGE_PIXELS, ge=1)
    """Most pixels (width x height) one image given to the model may have (`MAX_IMAGE_PIXELS`)."""
