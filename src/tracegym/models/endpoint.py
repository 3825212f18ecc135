"""Endpoint: where and how to reach an OpenAI-compatible model, as plain data that can cross a wire.

The API key itself is never stored: `api_key_env` names the environment variable to read it from where the
live client is built, so configs and run folders can be shared without leaking secrets.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def http_url(value: str) -> str:
    """`value` when it is an http(s) URL with a host; else a ValueError saying what one looks like."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("not an http(s) URL; give one like http://127.0.0.1:8000/v1")
    return value


HttpUrl = Annotated[str, AfterValidator(http_url)]
"""A model endpoint's URL, checked when a config or Endpoint is made (not at the first request)."""


class Endpoint(BaseModel):
    """An OpenAI-compatible chat endpoint and the client's network policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    base_url: HttpUrl
    """The API root, e.g. `http://127.0.0.1:8000/v1`."""
    model: str
    """The model name the endpoint serves."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the API key; None (or unset) sends no key."""
    timeout: float = 300.0
    """Seconds one HTTP attempt may take; a slower one is retried like a connection error. In a rollout the
    model stage (`Timeouts.model`, also 300 s by default) bounds the whole call, every attempt and backoff
    included, and cancels it at its deadline whatever this says, so an attempt never outlives what is left of
    the stage and a hung endpoint holds a rollout's slot no longer than the stage. Keep this at most the
    stage's timeout (`tracegym eval` sets it equal); lower, a hung attempt is retried within the stage."""
    max_retries: int = Field(default=3, ge=0)
    """Retries after a connection error, a timeout, HTTP 429 or 5xx; never after another 4xx."""
    backoff: float = Field(default=0.5, ge=0)
    """First retry delay in seconds; doubles each retry, with jitter."""
    max_connections: int = Field(default=1024, ge=1)
    """Most simultaneous HTTP connections of one client."""
    tokens: Literal["auto", "on", "off"] = "auto"
    """Ask for token ids and logprobs (vLLM's `return_token_ids`, `logprobs`). `auto` asks and stops asking
    when the endpoint rejects the fields; `on` makes their absence an error; `off` never asks."""
    client: Literal["chat", "tokens"] = "chat"
    """`chat`: the chat-completions client (any endpoint). `tokens`: render locally and send token ids to vLLM's
    completions endpoint, so multi-turn prompts extend the exact sampled tokens (needs `tokenizer`)."""
    tokenizer: str | None = None
    """Hugging Face directory or hub id of the model's tokenizer, for `client="tokens"` (default: `model`)."""
    renderer: str = "auto"
    """Chat template renderer for `client="tokens"`: `auto` (by hub id, else ours for ChatML), `chatml`, or a
    `renderers` package name such as `qwen3` (needed for a local copy or fine-tune of a known model)."""

    def api_key(self) -> str | None:
        """The key from the environment, if the variable is named and set."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None
