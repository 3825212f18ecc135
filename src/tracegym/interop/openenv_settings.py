"""OpenEnv server settings: how many sessions it holds, how long one may idle, the largest frame it answers, and
where it listens (plain data, importable without the `openenv` package: `tracegym serve` parses it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class OpenEnvSettings(BaseModel):
    """Settings of `tracegym serve ID --protocol openenv` (`--openenv.NAME VALUE`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str = "127.0.0.1"
    """Interface to listen on; anything but loopback needs TRACEGYM_ENV_SECRET (clients send it as a bearer token)."""
    max_concurrent_envs: int = Field(default=64, ge=1)
    """Sessions (WebSockets) at once; one more is refused with CAPACITY_REACHED."""
    session_timeout: float | None = Field(default=300.0, gt=0)
    """Seconds a session may wait for its client's next message before it is closed (SESSION_ERROR); unset: never."""
    max_frame_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest frame answered; a larger one gets VALIDATION_ERROR (past 4x this, or 16 MiB, the socket closes)."""
