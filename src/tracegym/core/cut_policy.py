"""Cut policy: the reward a cut rollout (`Trace.cut`: overlong, length-truncated, unparsable) counts with, or its
mask, one rule per cut kind: RL's `[orchestrator.cuts]` and eval's `--cuts` are one.

A rule is `keep` (the rollout's scored reward stands: the default for all three), a number (that reward in place
of the scored one, e.g. -1 makes rambling past `max_tokens` as bad as a wrong answer), or `mask` (left out: of its
group's baseline and of the loss in RL, counted as `masked/<kind>`; of every mean of eval's summary, counted as
`masked`). The trace itself keeps its scores either way: the rule is applied where rewards are counted.

>>> policy = CutPolicy(length=-1.0, overlong="mask")
>>> policy.rule(Cut.LENGTH), policy.rule(Cut.OVERLONG), policy.rule(None)
(-1.0, 'mask', 'keep')
>>> policy.reward(Cut.LENGTH, 0.5), policy.reward(Cut.UNPARSABLE, 0.5), policy.reward(Cut.OVERLONG, 0.5) is MASKED
(-1.0, 0.5, True)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from tracegym.core.trace import Cut

Rule = float | Literal["keep", "mask"]
"""`keep` the scored reward, use this number instead, or `mask` the rollout out."""
MASKED: Literal["mask"] = "mask"
"""What `CutPolicy.reward` answers for a rollout its rule masks."""


class CutPolicy(BaseModel):
    """One rule per cut kind (`Cut`): `keep`, a reward, or `mask`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    overlong: Rule = "keep"
    """The prompt no longer fit the model's context (the rollout ended on a context-length error)."""
    length: Rule = "keep"
    """A reply ran into `max_tokens` and the rollout ended there."""
    unparsable: Rule = "keep"
    """A reply did not parse: a tool call that is not a JSON object with a name, a move whose markup is broken."""

    def rule(self, cut: Cut | None) -> Rule:
        """The rule of a rollout cut this way (`keep` for one that was not cut)."""
        return "keep" if cut is None else getattr(self, cut.value)

    def reward(self, cut: Cut | None, scored: float) -> float | Literal["mask"]:
        """The reward a rollout cut this way counts with, given its `scored` reward; `MASKED` when masked."""
        rule = self.rule(cut)
        if isinstance(rule, float | int):
            return float(rule)
        return scored if rule == "keep" else MASKED



KEEP = CutPolicy()
"""The policy that keeps every scored reward (the default everywhere)."""
