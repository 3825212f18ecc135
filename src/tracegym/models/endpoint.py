"""Endpoint: where and how to reach an OpenAI-compatible model, as plain data that can cross a wire.

The API key itself is never stored: `api_key_env` names the environment variable to read it from where the
live client is built, so configs and run folders can be shared without leaking secrets.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

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
    replicas: tuple[HttpUrl, ...] = ()
    """Further servers of the same model (API roots like `base_url`): with any, the live client is a router
    (`models.router`) that keeps each session on one server, sends new ones to the least loaded, and takes a
    server that fails out until it answers again."""
    health_every: float = Field(default=2.0, gt=0)
    """With replicas: seconds between the router's probes of a server taken out (to put it back) and of a server
    with requests in flight (to take it out when it stops answering)."""
    probe_timeout: float = Field(default=10.0, gt=0)
    """With replicas: seconds a probe (`GET /models`) may take before its server counts as not answering."""

    @field_validator("replicas")
    @classmethod
    def _distinct(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        """Each server once, `base_url` not again (a duplicate would only skew the load counts)."""
        seen = {_root(info.data.get("base_url", ""))}
        kept = []
        for url in value:
            if _root(url) not in seen:
                seen.add(_root(url))
                kept.append(url)
        return tuple(kept)

    def servers(self) -> list[str]:
        """Every server's API root: `base_url`, then the replicas."""
        return [self.base_url, *self.replicas]

    def api_key(self) -> str | None:
        """The key from the environment, if the variable is named and set."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None


def _root(url: str) -> str:
    return url.rstrip("/")
