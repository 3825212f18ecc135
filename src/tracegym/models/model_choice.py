"""Model choice: the `[model]` section every command shares (`eval`, `rl`, `inference`): which model, where it
runs, and how the client reaches it (its `ClientSettings`); plain data, turned into an `Endpoint` by
`ModelChoice.endpoint` (which `models.launch.serve` calls with the endpoint it started or reached).

>>> ModelChoice(name="Qwen/Qwen3-8B", base_url="http://host:8000/v1").display_name()
'Qwen3-8B'
>>> ModelChoice(base_url="http://host:8000/v1").base_url
['http://host:8000/v1']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from pydantic import AliasChoices, BeforeValidator, ConfigDict, Field, field_validator

from tracegym.models.client_settings import ClientSettings
from tracegym.models.embedded import SERVED_MODEL_NAME
from tracegym.models.endpoint import Endpoint, HttpUrl
from tracegym.models.image_support import takes_images


def _listed(value: Any) -> Any:
    """One URL given alone (`base_url = "http://..."`, one flag value) is a list of one."""
    return [value] if isinstance(value, str) else value


class ModelChoice(ClientSettings):
    """The model to use and how to reach it (`--model.name` or `-m`, `--model.base-url`, `--model.client`, ...).
    Its client and network fields are `ClientSettings`'. A command that needs other defaults, or starts
    the server itself, subclasses it (redeclaring just those fields; setting `served_by`)."""

    model_config = ConfigDict(protected_namespaces=())
    name: Annotated[str | None, Field(validation_alias=AliasChoices("name", "m"))] = None
    """Model name at `base_url`, or a Hugging Face model directory or hub id to serve with vLLM; unset: the
    embedded SmolLM2-135M-Instruct on vLLM (at `base_url`: the one model the endpoint serves)."""
    base_url: Annotated[list[HttpUrl] | None, BeforeValidator(_listed), Field(min_length=1)] = None
    """OpenAI-compatible endpoints already running (e.g. `http://host:8000/v1`); several (`--model.base-url URL
    URL ...`, a TOML list) serve the same model and requests are routed across them, each rollout kept on one
    (a duplicate or an endpoint that does not answer is left out, with a warning); unset: start vLLM here."""
    servers: int = Field(default=1, ge=1)
    """vLLM servers to start here (unless `base_url` is set), each on its own port (and, on the CPU build, its own
    share of the cores), with requests routed across them."""
    data_parallel: int = Field(default=1, ge=1)
    """vLLM's own data parallelism inside each server started here (`--data-parallel-size`: engine replicas
    behind one API server, one GPU each); vLLM's GPU build only."""
    max_model_len: int = 2048
    """Context length (prompt + completion) of a vLLM server started here."""
    vllm_args: list[str] = Field(default_factory=list)
    """Extra flags for a vLLM server started here, passed as given."""
    startup_timeout: float = Field(default=300.0, gt=0)
    """Seconds a vLLM server started here may take to answer `/health` (a loaded machine, a large model or the VLM's
    first start can need more)."""

    vlm: bool = False
    """With `name` unset: the embedded vision-language model (`models.embedded_vlm`: SmolLM2-135M's text tower
    with a small vision tower, built once into the model cache) in place of the embedded text model. A `name`
    (e.g. `--model.name` over a config's `vlm = true`) is the model instead."""

    served_by: ClassVar[str | None] = None
    """The command that always starts the server itself (`tracegym rl`), in a subclass for it: `base_url` must then
    stay unset."""

    @field_validator("base_url")
    @classmethod
    def _no_endpoint_elsewhere(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and cls.served_by is not None:
            raise ValueError(f"`{cls.served_by}` starts the vLLM server itself; leave it unset")
        return value

    def base_urls(self) -> list[str]:
        """The endpoints at `base_url` as a list (empty when unset; also for a single URL set by `model_copy`,
        which skips validation)."""
        return list(_listed(self.base_url) or [])

    def display_name(self) -> str:
        """A short name for run folders and tables (the last path part of a model directory)."""
        if self.name is None:
            return SERVED_MODEL_NAME
        return self.name.rstrip("/").rsplit("/", 1)[-1]

    def endpoint(self, base_url: str, model: str, *, weights: str | None = None,
                 replicas: Sequence[str] = ()) -> Endpoint:
        """The Endpoint for `model` at `base_url` (and `replicas`, further servers of it) with this section's
        client and network policy. `weights`: the model directory of servers started here (they take no API key;
        their weights hold the tokenizer unless `tokenizer` names one); None: endpoints elsewhere, reached with
        `api_key_env`."""
        own = weights is not None
        settings = self.model_dump(include=set(ClientSettings.model_fields))
        settings.update(tokenizer=self.tokenizer or (weights if own else model),
                        images=self.images if self.images is not None else takes_images(weights or model))
        if own:
            settings.update(api_key_env=None)
        return Endpoint(base_url=base_url, model=model, replicas=tuple(replicas), **settings)


MOVED_KEYS = {"model": "name", "base_url": "base_url", "api_key_env": "api_key_env", "client": "client",
              "tokenizer": "tokenizer", "renderer": "renderer", "max_model_len": "max_model_len",
              "vllm_args": "vllm_args"}
"""Top-level keys of the `eval` and `inference` configs that moved into this section: old key -> field."""
