"""Timing: spans of a rollout's stages, in seconds from the rollout's start."""

from __future__ import annotations

from pydantic import ConfigDict

from tracegym.core.record import Record


class Span(Record):
    """One timed stage: `setup`, then per turn `model`, `tool:<name>` or `env_response`, and `stop:<name>`;
    then `scoring` (all rewards and metrics) and `total`. `turn` is set on the per-turn stages."""

    model_config = ConfigDict(frozen=True)
    name: str
    start: float
    end: float
    turn: int | None = None

    @property
    def duration(self) -> float:
        """Seconds the stage took."""
        return self.end - self.start
