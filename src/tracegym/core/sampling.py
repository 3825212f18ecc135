"""Sampling: the generation parameters of a model call, plain data that crosses the wire and lands on traces.

The one `[sampling]` section of every command: `tracegym eval` has it, and each phase of `tracegym rl`
(`[orchestrator.train.sampling]`, `[orchestrator.eval.sampling]`), with the same keys.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Sampling(BaseModel):
    """Sampling parameters; `extra` passes anything else through to the endpoint untouched."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature (0: greedy)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    max_tokens: int | None = Field(default=256, gt=0)
    """Most tokens to generate per model call; unset: what the context leaves."""
    seed: int | None = None
    """Seed for the endpoint's sampler, when it honours one; rollout i of a task uses seed + i (the trace records
    the seed it used), so the rollouts of a group differ and each one can be reproduced."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end generation."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Endpoint-specific request fields (e.g. vLLM's `top_k`)."""
