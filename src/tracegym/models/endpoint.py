"""Endpoint: where and how to reach an OpenAI-compatible model, as plain data that can cross a wire.

The API key itself is never stored: `api_key_env` names the environment variable to read it from where the
live client is built, so configs and run folders can be shared without leaking secrets.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

from tracegym.models.client_settings import ClientSettings


def http_url(value: str) -> str:
    """`value` when it is an http(s) URL with a host; else a ValueError saying what one looks like."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("not an http(s) URL; give one like http://127.0.0.1:8000/v1")
    return value


HttpUrl = Annotated[str, AfterValidator(http_url)]
"""A model endpoint's URL, checked when a config or Endpoint is made (not at the first request)."""


class Endpoint(ClientSettings):
    """An OpenAI-compatible chat endpoint, the client that reaches it and its network policy (`ClientSettings`:
    `client`, `tokenizer`, `renderer`, `api_key_env`, `timeout`, `max_retries`, `backoff`)."""

    base_url: HttpUrl
    """The API root, e.g. `http://127.0.0.1:8000/v1`."""
    model: str
    """The model name the endpoint serves."""
    max_connections: int = Field(default=1024, ge=1)
    """Most simultaneous HTTP connections of one client."""
    tokens: Literal["auto", "on", "off"] = "auto"
    """Ask for token ids and logprobs (vLLM's `return_token_ids`, `logprobs`). `auto` asks and stops asking
    when the endpoint rejects the fields; `on` makes their absence an error; `off` never asks."""

    def api_key(self) -> str | None:
        """The key from the environment, if the variable is named and set."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None
