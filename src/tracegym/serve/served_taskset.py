"""Served taskset: what an env server says of the taskset it runs (id, resolved options, size, seats), so a
client can draw, seat and run its tasks without importing the taskset's code (`env_client.describe` asks a
server; the rows themselves come by position, `EnvClient.rows`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import UsageError


class ServedTaskset(BaseModel):
    """One env server's taskset as plain data (from its `info`)."""

    model_config = ConfigDict(frozen=True)
    id: str
    spec: str = ""
    """What the server was started with (`reverse-text`, `pkg.module:Name`, `path/to/file.py:Name`)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The taskset's resolved options."""
    size: int | None = None
    """How many rows it has; None: it never ends."""
    members: list[str] = Field(default_factory=list)
    """A multi-agent taskset's member ids in seat order; empty for a single-agent one."""
    capacity: int | None = None
    """The most rollouts its tasks can run at once (an OpenEnv server's sessions: `Taskset.capacity`); None: no limit
    of its own known."""
    rows_error: str | None = None
    """Why the server cannot give the taskset's rows (it runs only rows its clients send); None: it can."""

    @classmethod
    def from_info(cls, info: dict[str, Any], address: str = "the env server") -> ServedTaskset:
        """The taskset an `info` reply describes; a server too old to say its size and seats is a UsageError."""
        if "size" not in info or "members" not in info:
            raise UsageError(f"{address} does not say how many tasks it has or who sits where (an older tracegym?); "
                             "restart it with this version")
        return cls(id=info["taskset"], spec=info.get("spec") or info["taskset"], config=info.get("config") or {},
                   size=info["size"], members=info["members"], rows_error=info.get("rows_error"),
                   capacity=info.get("capacity"))

    def named(self, name: str) -> bool:
        """Whether `name` (a config's environment id) names this taskset: its id, or the spec it was served by."""
        return name in (self.id, self.spec)

    @property
    def multi_agent(self) -> bool:
        """True when the taskset's tasks are episodes of several members."""
        return bool(self.members)
