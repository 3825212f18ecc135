"""Training sample: one branch of a trace flattened into what the trainer consumes (pure data)."""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from tracegym.core.graph import ImageSpan, RoutedExperts
from tracegym.core.record import Record


class Sample(Record):
    """Token ids of one branch with the loss mask, the sampler's logprobs and the advantage.

    `loss_mask[i]` is True only for tokens the policy sampled (and that no earlier sample of the same trace
    already trains); `logprobs[i]` is the sampler's logprob of token i where the mask is True, 0.0 elsewhere.
    """

    model_config = ConfigDict(frozen=True)
    token_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    advantage: float = 0.0
    """Set by the orchestrator from the group's rewards."""
    token_advantages: list[float] | None = None
    """One advantage per token (aligned with `token_ids`; read where the mask is True), in place of `advantage`:
    set by on-policy distillation (the teacher's logprob minus the sampler's, per token)."""
    temperature: float = 1.0
    """Sampling temperature of the branch's sampled tokens (the trainer divides its logits by it)."""
    reward: float | None = None
    policy_version: int | None = None
    """The weights that sampled these tokens; the trainer's current version minus this is the staleness."""
    trace_id: str = ""
    branch: int = 0
    """Index of the branch within its trace."""
    task_key: str = ""
    meta: dict[str, float] = Field(default_factory=dict)
    routed_experts: RoutedExperts | None = None
    """On an MoE model: the sampler's experts per token (aligned with `token_ids`; `[]` where unknown), which the
    trainer's forward replays (`models.expert_routing`)."""
    images: list[ImageSpan] = Field(default_factory=list, exclude_if=lambda spans: not spans)
    """The placeholder runs of the images among `token_ids` (offsets into them), in order, each naming its image by
    the sha256 of its bytes (kept once in the run folder's `images/`); the trainer puts the image's features there."""

    @model_validator(mode="after")
    def _aligned(self) -> Sample:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"token_ids ({n}), loss_mask ({len(self.loss_mask)}) and logprobs "
                             f"({len(self.logprobs)}) must have the same length")
        if self.token_advantages is not None and len(self.token_advantages) != n:
            raise ValueError(f"token_advantages ({len(self.token_advantages)}) must have one value per token ({n})")
        if self.routed_experts is not None and len(self.routed_experts) != n:
            raise ValueError(f"routed_experts ({len(self.routed_experts)}) must have one entry per token ({n})")
        if any(span.offset < 0 or span.offset + span.length > n for span in self.images):
            raise ValueError(f"an image run lies outside the sample's {n} tokens")
        return self

    @property
    def num_trained(self) -> int:
        """Tokens that carry loss."""
        return sum(self.loss_mask)

    def __len__(self) -> int:
        return len(self.token_ids)
