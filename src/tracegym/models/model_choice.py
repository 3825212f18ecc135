"""Model choice: the `[model]` section every command shares (`eval`, `rl`, `inference`): which model, where it
runs, and how the client reaches it; plain data, turned into an `Endpoint` by `models.launch.serve`.

>>> ModelChoice(name="Qwen/Qwen3-8B", base_url="http://host:8000/v1").display_name()
'Qwen3-8B'
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from tracegym.models.embedded import SERVED_MODEL_NAME
from tracegym.models.endpoint import Endpoint, HttpUrl

ClientKind = Literal["chat", "tokens"]
"""Which model client a rollout uses (see `ModelChoice.client`)."""


class ModelChoice(BaseModel):
    """The model to use and how to reach it (`--model.name` or `-m`, `--model.base-url`, ...). A command that needs
    other defaults, or starts the server itself, subclasses it (redeclaring just those fields; setting
    `served_by`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())
    name: Annotated[str | None, Field(validation_alias=AliasChoices("name", "m"))] = None
    """Model name at `base_url`, or a Hugging Face model directory or hub id to serve with vLLM; unset: the
    embedded SmolLM2-135M-Instruct on vLLM (at `base_url`: the one model the endpoint serves)."""
    base_url: HttpUrl | None = None
    """An OpenAI-compatible endpoint already running (e.g. `http://host:8000/v1`); unset: start vLLM here."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the API key of the endpoint at `base_url`."""
    client: ClientKind = "chat"
    """`chat`: chat completions (any endpoint); `tokens`: render locally and send token ids to vLLM, so
    multi-turn prompts extend the exact sampled tokens (the model's chat template must be covered by a renderer)."""
    tokenizer: str | None = None
    """Tokenizer directory or hub id for `client = "tokens"` (default: the served model's)."""
    renderer: str = "auto"
    """Chat template renderer for `client = "tokens"`: `auto` (the `renderers` package by hub id, else ours for
    ChatML templates), `chatml`, or a `renderers` package name such as `qwen3` (a local copy or fine-tune of a
    known model needs it named)."""
    timeout: float = Field(default=300.0, gt=0)
    """Seconds one HTTP attempt of a model call may take (`tracegym eval` caps it at `timeouts.model`)."""
    max_retries: int = Field(default=3, ge=0)
    """Retries of a model call after a connection error, a timeout, HTTP 429 or 5xx."""
    backoff: float = Field(default=0.5, ge=0)
    """First retry delay in seconds; doubles each retry, with jitter."""
    max_model_len: int = 2048
    """Context length (prompt + completion) of a vLLM server started here."""
    vllm_args: list[str] = Field(default_factory=list)
    """Extra flags for a vLLM server started here, passed as given."""

    served_by: ClassVar[str | None] = None
    """The command that always starts the server itself (`tracegym rl`), in a subclass for it: `base_url` must then
    stay unset."""

    @field_validator("base_url")
    @classmethod
    def _no_endpoint_elsewhere(cls, value: str | None) -> str | None:
        if value is not None and cls.served_by is not None:
            raise ValueError(f"`{cls.served_by}` starts the vLLM server itself; leave it unset")
        return value

    def display_name(self) -> str:
        """A short name for run folders and tables (the last path part of a model directory)."""
        if self.name is None:
            return SERVED_MODEL_NAME
        return self.name.rstrip("/").rsplit("/", 1)[-1]

    def endpoint(self, base_url: str, model: str, *, weights: str | None = None) -> Endpoint:
        """The Endpoint for `model` at `base_url` with this section's client and network policy. `weights`: the
        model directory of a server started here (it takes no API key; its weights hold the tokenizer unless
        `tokenizer` names one); None: the endpoint at `base_url`, reached with `api_key_env`."""
        own = weights is not None
        return Endpoint(base_url=base_url, model=model, api_key_env=None if own else self.api_key_env,
                        tokenizer=self.tokenizer or (weights if own else model), client=self.client,
                        renderer=self.renderer, timeout=self.timeout, max_retries=self.max_retries,
                        backoff=self.backoff)


MOVED_KEYS = {"model": "name", "base_url": "base_url", "api_key_env": "api_key_env", "client": "client",
              "tokenizer": "tokenizer", "renderer": "renderer", "max_model_len": "max_model_len",
              "vllm_args": "vllm_args"}
"""Top-level keys of the `eval` and `inference` configs that moved into this section: old key -> field."""
