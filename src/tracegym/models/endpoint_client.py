"""Endpoint client: what every model client bound to one Endpoint shares (its name, closing with `async with`)."""

from __future__ import annotations

from typing import Self

from tracegym.models.endpoint import Endpoint


class EndpointClient:
    """A model client for one Endpoint: traces name the endpoint's model, and `async with` closes the client
    (`aclose`, which each client defines for what it holds) on the way out."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    @property
    def name(self) -> str:
        return self.endpoint.model

    async def aclose(self) -> None:
        """Release what the client holds (connections; a router, its servers' clients): each client's own."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
