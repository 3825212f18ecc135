"""Judgment: the record of one judge reward's call on a trace (what it asked, what its model said, the score read)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Judgment(BaseModel):
    """One judge call made to score a trace (`envs.judge`), kept on the trace beside the rewards it decided."""

    model_config = ConfigDict(frozen=True)
    judge: str
    """The judge reward's name (its key in the trace's rewards)."""
    model: str
    """The judge's model, as its endpoint names it."""
    prompt: str
    """The judge prompt rendered for this trace (the template filled with the task's question, the reference
    answer and the rollout's response)."""
    reply: str | None = None
    """The judge model's reply; None when the call failed (the error is on the trace, kind `judge`)."""
    score: float | None = None
    """The score read from the reply; None when the call failed or the reply did not parse."""
    cached: bool = False
    """True when the verdict was not asked for this trace: it came from the judge's cache or from a call another
    trace made with the same prompt at the same time."""
    seconds: float = 0.0
    """How long the call took (0 for a cached verdict)."""
