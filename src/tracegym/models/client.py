"""Model client: the one interface through which a rollout calls a model, and its request and response."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tracegym.core.graph import ImageSpan, TokenPrefix
from tracegym.core.messages import Message
from tracegym.core.sampling import Sampling
from tracegym.core.tool_spec import ToolSpec


@dataclass(frozen=True)
class ModelRequest:
    """What a rollout asks of the model on one turn."""

    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    sampling: Sampling = field(default_factory=Sampling)
    prefix: TokenPrefix | None = None
    """The exact tokens along the current branch, for clients that extend them instead of re-rendering (the
    token client); None before the model's first sampled turn on the branch."""
    session: str | None = None
    """The affinity key: requests with the same one go to the same server of a several-server endpoint, so its
    prefix cache is reused (the rollout loop sets its trace id; an episode its episode id). None: any server."""
    stream: ReplyStream | None = field(default=None, compare=False, repr=False)
    """Where a client that streams shows the reply while it is sampled (the interception proxy's relay to a
    program that asked for `stream: true`); a client that does not stream ignores it, and the caller shows the
    whole reply once the call returns. What the call records is its returned response either way."""


@dataclass(frozen=True)
class ModelResponse:
    """The model's reply; token ids and logprobs are set when the backend returns them."""

    message: Message
    finish_reason: str | None = None
    """`stop`, `length` (the completion budget ran out) or `tool_calls`, as the endpoint said."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    policy_version: int | None = None
    """The policy version that served this reply, when the endpoint reports it (`models.policy_version`)."""
    prompt_images: list[ImageSpan] = field(default_factory=list)
    """Each image's placeholder run in `prompt_token_ids` and its hash (the token client, on a VLM)."""


class ReplyStream(Protocol):
    """Where a streaming model client shows a reply as it grows (`ModelRequest.stream`)."""

    @property
    def shown(self) -> bool:
        """Whether any of the reply was shown: a failure after that is not retried (`transport.StreamCut`)."""
        ...

    async def update(self, partial: ModelResponse) -> None:
        """The reply so far, parsed as the whole reply will be (the part that may still change, say the start of
        a tool call's markup, is for the stream to hold back)."""
        ...


@runtime_checkable
class ModelClient(Protocol):
    """Anything that answers a ModelRequest. Raise tracegym errors (ModelError, ContextLengthError,
    InfrastructureError) for failures; the rollout loop records them on the trace."""

    @property
    def name(self) -> str:
        """The model name recorded on traces."""
        ...

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one turn."""
        ...

    async def aclose(self) -> None:
        """Release what the client holds (connections); a client without any does nothing."""
        ...
