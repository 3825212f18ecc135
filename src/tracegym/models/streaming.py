"""Streamed reply: a model call's server-sent chunks, folded into the body the same call gets unstreamed, and shown,
parsed, to the request's `ReplyStream` as they arrive.

A client that streams hands the transport a `StreamedReply` built from its wire format's fold (`ChatChunks`,
`CompletionChunks`: chunk by chunk, the body an unstreamed call returns) and its own parse. When the stream ends,
the client parses the folded body exactly as it parses an unstreamed reply: what a call records is decided in that
one place, streamed or not. While it streams, after each network read whose chunks added to the reply, the body so
far is parsed the same way and the reply so far goes to the stream (which holds back what may still change).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tracegym.models.client import ModelResponse, ReplyStream


class Fold(Protocol):
    """One wire format's chunks folded into its unstreamed body."""

    def add(self, chunk: dict[str, Any]) -> bool:
        """Fold one chunk in; True when it added to the reply (text, tool calls or sampled ids)."""
        ...

    def body(self) -> dict[str, Any]:
        """The body so far, as the unstreamed call would have answered it."""
        ...


class StreamedReply:
    """The transport's `ChunkReader` for one call: a fresh `fold()` per attempt, and after each chunk that adds
    to the reply, `parse(body so far)` shown to `stream`."""

    def __init__(self, stream: ReplyStream, fold: Callable[[], Fold],
                 parse: Callable[[dict[str, Any]], ModelResponse]) -> None:
        self.stream, self._new, self._parse = stream, fold, parse
        self._fold, self._grew = fold(), False

    @property
    def shown(self) -> bool:
        return self.stream.shown

    def restart(self) -> None:
        self._fold, self._grew = self._new(), False

    def read(self, chunk: dict[str, Any]) -> None:
        self._grew = self._fold.add(chunk) or self._grew

    async def arrived(self) -> None:
        if not self._grew:
            return
        self._grew = False
        try:
            partial = self._parse(self._fold.body())
        except Exception:  # a reply cut mid-markup may not parse yet: the whole reply's parse decides (and raises)
            return
        await self.stream.update(partial)

    def body(self) -> dict[str, Any]:
        return self._fold.body()
