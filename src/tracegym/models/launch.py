"""Launch: turns a user's model choice into a live endpoint: an existing URL, or vLLM serving a model we start.

Three choices, checked in this order: `base_url` set -> use that endpoint (fail fast if it does not answer);
`model` names a Hugging Face directory or hub id -> start vLLM on it; neither -> start vLLM on the embedded
SmolLM2-135M-Instruct (converted once into the cache). A started server is stopped, with every process it
spawned, when the context exits. A server that `tracegym inference` runs with the same model and settings is
reused instead of starting another (it records itself in `server_record_path`).
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import InfrastructureError, UsageError
from tracegym.models.embedded import SERVED_MODEL_NAME, cache_root, embedded_model_dir
from tracegym.models.endpoint import Endpoint
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig, recorded_server


class ModelChoice(BaseModel):
    """Which model to use and how to reach it; the `--model`/`--base-url` options of every command."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())
    model: str | None = None
    """Model name at `base_url`, or a Hugging Face model directory to serve with vLLM; unset: the embedded
    SmolLM2-135M-Instruct."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint already running (e.g. `http://host:8000/v1`); unset: start vLLM here."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the endpoint's API key."""
    max_model_len: int = 2048
    """Context length of a vLLM server we start."""
    vllm_args: list[str] = Field(default_factory=list)
    """Extra flags for a vLLM server we start."""
    timeout: float = 300.0
    """Seconds one HTTP attempt of a model call may take (`Endpoint.timeout`)."""
    max_retries: int = 3
    """Retries of a model call after a connection error, 429 or 5xx."""
    client: Literal["chat", "tokens"] = "chat"
    """`chat`: chat completions (any endpoint); `tokens`: render locally and send token ids to vLLM, so
    multi-turn prompts extend the exact sampled tokens."""
    tokenizer: str | None = None
    """Tokenizer directory or hub id for `client = "tokens"` with `base_url` (default: `model`)."""
    renderer: str = "auto"
    """Renderer for `client = "tokens"`: `auto`, `chatml`, or a `renderers` package name (e.g. `qwen3`)."""

    def display_name(self) -> str:
        """A short name for run folders and tables (the last path part of a model directory)."""
        if self.model is None:
            return SERVED_MODEL_NAME
        return self.model.rstrip("/").rsplit("/", 1)[-1]


@contextlib.contextmanager
def serve(choice: ModelChoice, *, log_path: Path | None = None) -> Iterator[Endpoint]:
    """The endpoint for `choice`, starting (and afterwards stopping) vLLM when no `base_url` is given."""
    options: dict[str, Any] = {"timeout": choice.timeout, "max_retries": choice.max_retries, "client": choice.client,
                               "renderer": choice.renderer}
    if choice.base_url is not None:
        name = choice.model or only_served_model(choice.base_url, choice.api_key_env)
        check_reachable(choice.base_url, name, choice.api_key_env)
        yield Endpoint(base_url=choice.base_url, model=name, api_key_env=choice.api_key_env,
                       tokenizer=choice.tokenizer or name, **options)
        return
    config = server_config(choice, log_path)
    running = recorded_server(config.model_copy(update={"state_path": server_record_path(config)}))
    with VLLMServer(config.model_copy(update={"reuse_url": running})) as server:
        yield Endpoint(base_url=server.base_url, model=config.name, api_key_env=None, tokenizer=config.model,
                       **options)


def server_config(choice: ModelChoice, log_path: Path | None = None) -> VLLMServerConfig:
    """The vLLM config that serves `choice.model` (the embedded model when unset)."""
    if choice.model is None:
        path, name = str(embedded_model_dir()), SERVED_MODEL_NAME
    else:
        local = Path(choice.model).expanduser()
        path = str(local.resolve()) if local.exists() else choice.model
        name = choice.display_name()
    return VLLMServerConfig(model=path, served_model_name=name, max_model_len=choice.max_model_len,
                            extra_args=list(choice.vllm_args), log_path=log_path)


def server_record_path(config: VLLMServerConfig) -> Path:
    """Where `tracegym inference` records the server it runs for `config`'s launch settings (model, context
    length, flags; not host or port), so that commands wanting the same server reuse it."""
    return cache_root() / "servers" / f"{config.launch_key()}.json"


def only_served_model(base_url: str, api_key_env: str | None = None) -> str:
    """The single model an endpoint serves; a UsageError when it serves several (pass `--model`)."""
    models = [m["id"] for m in _get_json(base_url.rstrip("/") + "/models", api_key_env).get("data", [])]
    if len(models) != 1:
        raise UsageError(f"{base_url} serves {len(models)} models ({', '.join(models)}); choose one with --model")
    return models[0]


def check_reachable(base_url: str, model: str | None, api_key_env: str | None = None) -> None:
    """Fail fast, before any task runs, when the endpoint does not answer or does not serve `model`."""
    data = _get_json(base_url.rstrip("/") + "/models", api_key_env)
    served = [m.get("id") for m in data.get("data", [])]
    if model is not None and served and model not in served:
        raise UsageError(f"{base_url} does not serve model {model!r} (it serves: {', '.join(map(str, served))})")


def _get_json(url: str, api_key_env: str | None) -> dict[str, Any]:
    request = urllib.request.Request(url)
    if api_key_env and os.environ.get(api_key_env):
        request.add_header("Authorization", f"Bearer {os.environ[api_key_env]}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InfrastructureError(f"model endpoint {url} is unreachable: {reason}") from None
