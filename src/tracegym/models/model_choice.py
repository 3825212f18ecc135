"""Model choice: the `[model]` section every command shares (`eval`, `rl`, `inference`): which model, where it
runs, and how the client reaches it (its `ClientSettings`); plain data, turned into an `Endpoint` by
`ModelChoice.endpoint` (which `models.launch.serve` calls with the endpoint it started or reached).

>>> ModelChoice(name="Qwen/Qwen3-8B", base_url="http://host:8000/v1").display_name()
'Qwen3-8B'
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AliasChoices, ConfigDict, Field, field_validator

from tracegym.models.client_settings import ClientSettings
from tracegym.models.embedded import SERVED_MODEL_NAME
from tracegym.models.endpoint import Endpoint, HttpUrl


class ModelChoice(ClientSettings):
    """The model to use and how to reach it (`--model.name` or `-m`, `--model.base-url`, `--model.client`, ...).
    Its client and network fields are `ClientSettings`'. A command that needs other defaults, or starts
    the server itself, subclasses it (redeclaring just those fields; setting `served_by`)."""

    model_config = ConfigDict(protected_namespaces=())
    name: Annotated[str | None, Field(validation_alias=AliasChoices("name", "m"))] = None
    """Model name at `base_url`, or a Hugging Face model directory or hub id to serve with vLLM; unset: the
    embedded SmolLM2-135M-Instruct on vLLM (at `base_url`: the one model the endpoint serves)."""
    base_url: HttpUrl | None = None
    """An OpenAI-compatible endpoint already running (e.g. `http://host:8000/v1`); unset: start vLLM here."""
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
        settings = self.model_dump(include=set(ClientSettings.model_fields))
        settings.update(tokenizer=self.tokenizer or (weights if own else model))
        if own:
            settings.update(api_key_env=None)
        return Endpoint(base_url=base_url, model=model, **settings)


MOVED_KEYS = {"model": "name", "base_url": "base_url", "api_key_env": "api_key_env", "client": "client",
              "tokenizer": "tokenizer", "renderer": "renderer", "max_model_len": "max_model_len",
              "vllm_args": "vllm_args"}
"""Top-level keys of the `eval` and `inference` configs that moved into this section: old key -> field."""
