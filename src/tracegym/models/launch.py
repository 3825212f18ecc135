"""Launch: turns a user's model choice into a live endpoint: an existing URL, or vLLM serving a model we start.

Three choices, checked in this order: `base_url` set -> use that endpoint (fail fast if it does not answer);
`name` names a Hugging Face directory or hub id -> start vLLM on it; neither -> start vLLM on the embedded
SmolLM2-135M-Instruct (converted once into the cache). A started server is stopped, with every process it
spawned, when the context exits. A server that `tracegym inference` runs with the same model and settings is
reused instead of starting another (it records itself in `server_record_path`). Either way the endpoint is
asked once whether it serves the model; `ModelChoice.endpoint` maps the choice onto the `Endpoint` a server
started elsewhere (the RL launcher's) is reached through.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from tracegym.core.errors import UsageError
from tracegym.models import transport
from tracegym.models.embedded import SERVED_MODEL_NAME, cache_root, embedded_model_dir
from tracegym.models.endpoint import Endpoint
from tracegym.models.model_choice import ModelChoice
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig, recorded_server


@contextlib.contextmanager
def serve(choice: ModelChoice, *, log_path: Path | None = None) -> Iterator[Endpoint]:
    """The endpoint for `choice`: the one at `base_url` (see `reach`), else a vLLM server serving `choice.name`,
    started here (and afterwards stopped) unless `tracegym inference` runs one with the same settings."""
    if choice.base_url is not None:
        yield reach(choice)
        return
    config = server_config(choice, log_path)
    running = recorded_server(config.model_copy(update={"state_path": server_record_path(config)}))
    if running is not None:  # checked live by `recorded_server`: a VLLMServer would only ask again
        yield choice.endpoint(running, config.name, weights=config.model)
        return
    with VLLMServer(config) as server:
        yield choice.endpoint(server.base_url, config.name, weights=config.model)


def reach(choice: ModelChoice) -> Endpoint:
    """The endpoint at `choice.base_url`, asked once for its models: it must answer and serve `choice.name`
    (unset: serve exactly one model, which is used); fails fast, before any task runs."""
    assert choice.base_url is not None, "reach() is for an endpoint that runs already"
    if choice.name is None:
        name = only_served_model(choice.base_url, choice.api_key_env)
    else:
        name = choice.name
        check_reachable(choice.base_url, name, choice.api_key_env)
    return choice.endpoint(choice.base_url, name)


def server_config(choice: ModelChoice, log_path: Path | None = None) -> VLLMServerConfig:
    """The vLLM config that serves `choice.name` (the embedded model when unset)."""
    if choice.name is None:
        path, name = str(embedded_model_dir()), SERVED_MODEL_NAME
    else:
        local = Path(choice.name).expanduser()
        path = str(local.resolve()) if local.exists() else choice.name
        name = choice.display_name()
    return VLLMServerConfig(model=path, served_model_name=name, max_model_len=choice.max_model_len,
                            extra_args=list(choice.vllm_args), log_path=log_path)


def server_record_path(config: VLLMServerConfig) -> Path:
    """Where `tracegym inference` records the server it runs for `config`'s launch settings (model, context
    length, flags; not host or port), so that commands wanting the same server reuse it."""
    return cache_root() / "servers" / f"{config.launch_key()}.json"


def only_served_model(base_url: str, api_key_env: str | None = None) -> str:
    """The single model an endpoint serves; a UsageError when it serves several (pass `-m`)."""
    models = [str(m.get("id")) for m in transport.served_models(base_url, _api_key(api_key_env))]
    if len(models) != 1:
        raise UsageError(f"{base_url} serves {len(models)} models ({', '.join(models)}); choose one with -m")
    return models[0]


def check_reachable(base_url: str, model: str | None, api_key_env: str | None = None) -> None:
    """Fail fast, before any task runs, when the endpoint does not answer or does not serve `model`."""
    served = [m.get("id") for m in transport.served_models(base_url, _api_key(api_key_env))]
    if model is not None and served and model not in served:
        raise UsageError(f"{base_url} does not serve model {model!r} (it serves: {', '.join(map(str, served))})")


def _api_key(api_key_env: str | None) -> str | None:
    return os.environ.get(api_key_env) if api_key_env else None
