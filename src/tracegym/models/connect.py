"""Connect: builds the live model client an Endpoint describes."""

from __future__ import annotations

from collections.abc import Callable

from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelClient
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import load_renderer
from tracegym.models.router import Router
from tracegym.models.token_client import TokenClient


def make_client(endpoint: Endpoint) -> ModelClient:
    """A ChatClient, or a TokenClient with the renderer for `endpoint.tokenizer` (else `endpoint.model`); over
    several servers (`endpoint.replicas`), a Router holding one of those per server (sharing one renderer)."""
    one = _one_server(endpoint)
    return Router(endpoint, one) if endpoint.replicas else one(endpoint)


def _one_server(endpoint: Endpoint) -> Callable[[Endpoint], ModelClient]:
    if endpoint.client == "tokens":
        renderer = load_renderer(endpoint.tokenizer or endpoint.model, endpoint.renderer)
        return lambda e: TokenClient(e, renderer)
    return ChatClient
