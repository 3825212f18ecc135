"""OpenEnv server settings: how many sessions it holds, how long one may idle, the largest frame or body it answers,
how long a client may take to send its headers, and where and how it listens (plain data, importable without the
`openenv` package: `tracegym serve` parses it)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracegym.models.endpoint import Endpoint


class OpenEnvSettings(BaseModel):
    """Settings of `tracegym serve ID --protocol openenv` (`--openenv.NAME VALUE`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str = "127.0.0.1"
    """Interface to listen on; anything but loopback needs TRACEGYM_ENV_SECRET (clients send it as a bearer token)
    and TLS (`tls_certfile`, `tls_keyfile`), so the secret never crosses the network in clear."""
    max_concurrent_envs: int = Field(default=64, ge=1)
    """Sessions (WebSockets) at once; one more is refused with CAPACITY_REACHED, unless a session has been idle for
    `reap_idle_after` seconds: that one is closed (SESSION_ERROR) and the newcomer takes its place."""
    session_timeout: float | None = Field(default=300.0, gt=0)
    """Seconds a session may wait for its client's next message before it is closed (SESSION_ERROR); unset: never."""
    reap_idle_after: float | None = Field(default=30.0, gt=0)
    """When the server is full, a session idle this many seconds gives its place to a new one; unset: never."""
    max_frame_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest WebSocket frame or HTTP body answered: a larger frame gets VALIDATION_ERROR (past 4x this, or 16 MiB,
    the socket closes); a larger body gets HTTP 413 without being read."""
    header_timeout: float = Field(default=10.0, gt=0)
    """Seconds a connection may take to send a request's headers (a WebSocket's handshake included); then it is
    closed, so slow or silent clients cannot hold the server's sockets."""
    workers: int = Field(default=1, ge=0)
    """Worker processes holding the sessions (the server passes each session's frames to its worker), so task code
    that ends its process costs only its own session: the other sessions there are replayed into the worker that
    replaces it; 0: sessions live in the server's process (not isolated)."""
    seat: str | None = None
    """With a multi-agent taskset: the member the OpenEnv agent plays (the others are `opponent`'s)."""
    opponent: Endpoint | None = None
    """With a multi-agent taskset: the model endpoint playing every other seat (`--openenv.opponent.base-url URL
    --openenv.opponent.model NAME`; a scripted policy is an endpoint too, e.g. `tracegym.testing`'s fake server)."""
    tls_certfile: Path | None = None
    """PEM certificate: serve HTTPS and WSS (needs `tls_keyfile`)."""
    tls_keyfile: Path | None = None
    """PEM private key of `tls_certfile`."""

    @model_validator(mode="after")
    def _tls_pair(self) -> OpenEnvSettings:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("give both tls_certfile and tls_keyfile, or neither")
        return self
