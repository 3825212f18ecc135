"""Connect: builds the live model client an Endpoint describes."""

from __future__ import annotations

from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelClient
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import load_renderer
from tracegym.models.token_client import TokenClient


def make_client(endpoint: Endpoint) -> ModelClient:
    """A ChatClient, or a TokenClient with the renderer for `endpoint.tokenizer` (else `endpoint.model`)."""
    if endpoint.client == "tokens":
        return TokenClient(endpoint, load_renderer(endpoint.tokenizer or endpoint.model, endpoint.renderer))
    return ChatClient(endpoint)
