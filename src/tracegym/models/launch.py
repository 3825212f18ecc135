"""Launch: turns a user's model choice into a live endpoint: an existing URL, or vLLM serving a model we start.

Three choices, checked in this order: `base_url` set -> use that endpoint, or those endpoints (fail fast if none
answers); `name` names a Hugging Face directory or hub id -> start vLLM on it (`servers` of them); neither -> start
vLLM on the embedded SmolLM2-135M-Instruct (converted once into the cache). A started server is stopped, with every
process it spawned, when the context exits. A server that `tracegym inference` runs with the same model and
settings is reused instead of starting another (it records itself in `server_record_path`). Either way the endpoint
is asked once whether it serves the model; `ModelChoice.endpoint` maps the choice onto the `Endpoint` a server
started elsewhere (the RL launcher's) is reached through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from tracegym.core.errors import TracegymError, UsageError
from tracegym.models import transport
from tracegym.models.embedded import SERVED_MODEL_NAME, cache_root, embedded_model_dir
from tracegym.models.embedded_vlm import SCALE_OUT_FLAG
from tracegym.models.endpoint import Endpoint
from tracegym.models.image_support import takes_images
from tracegym.models.model_choice import ModelChoice
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig, recorded_server
from tracegym.models.vllm_servers import VLLMServers

log = logging.getLogger(__name__)


@contextlib.contextmanager
def serve(choice: ModelChoice, *, log_path: Path | None = None) -> Iterator[Endpoint]:
    """The endpoint for `choice`: the one(s) at `base_url` (see `reach`), else `choice.servers` vLLM servers of
    `choice.name`, started here (and afterwards stopped); a single one is not started when `tracegym inference`
    runs one with the same settings."""
    if choice.base_url is not None:
        yield reach(choice)
        return
    config = server_config(choice, log_path)
    if choice.servers > 1:
        with VLLMServers(config, choice.servers) as started:
            first, *rest = started.base_urls
            yield choice.endpoint(first, config.name, weights=config.model, replicas=rest)
        return
    running = recorded_server(config.model_copy(update={"state_path": server_record_path(config)}))
    if running is not None:  # checked live by `recorded_server`: a VLLMServer would only ask again
        yield choice.endpoint(running, config.name, weights=config.model)
        return
    with VLLMServer(config) as server:
        yield choice.endpoint(server.base_url, config.name, weights=config.model)


def reach(choice: ModelChoice) -> Endpoint:
    """The endpoint at `choice.base_url`, each server asked once for its models before any task runs: it must
    answer and serve `choice.name` (unset: the first answering server must serve exactly one model, which is
    used). Of several, a duplicate or a server that does not answer or serves another model is left out with a
    warning; a UsageError when none is left."""
    assert choice.base_url is not None, "reach() is for an endpoint that runs already"
    urls = distinct(choice.base_urls())
    name, answering, failures = choice.name, [], []
    for url in urls:
        try:
            if name is None:
                name = only_served_model(url, choice.api_key_env)
            else:
                check_reachable(url, name, choice.api_key_env)
        except TracegymError as exc:
            if len(urls) == 1:
                raise
            failures.append(f"{url}: {exc}")
            log.warning("--model.base-url %s left out: %s", url, exc)
            continue
        answering.append(url)
    if not answering:
        raise UsageError("no server in --model.base-url answers: " + "; ".join(failures))
    assert name is not None
    return choice.endpoint(answering[0], name, replicas=answering[1:])


def distinct(urls: list[str]) -> list[str]:
    """`urls` without repeats (a trailing slash does not make another), with a warning for each repeat."""
    kept: dict[str, str] = {}
    for url in urls:
        if url.rstrip("/") in kept:
            log.warning("--model.base-url lists %s twice; using it once", url)
            continue
        kept[url.rstrip("/")] = url
    return list(kept.values())


def server_config(choice: ModelChoice, log_path: Path | None = None) -> VLLMServerConfig:
    """The vLLM config that serves `choice.name` (the embedded model when unset); a model that takes images gets
    the endpoint image prompts go to (`embedded_vlm.SCALE_OUT_FLAG`)."""
    if choice.name is None:
        path, name = str(embedded_model_dir()), SERVED_MODEL_NAME
    else:
        local = Path(choice.name).expanduser()
        path = str(local.resolve()) if local.exists() else choice.name
        name = choice.display_name()
    args = list(choice.vllm_args)
    if choice_takes_images(choice) and SCALE_OUT_FLAG not in args:
        args.append(SCALE_OUT_FLAG)  # the token-in/token-out endpoint image prompts go to
    return VLLMServerConfig(model=path, served_model_name=name, max_model_len=choice.max_model_len,
                            data_parallel=choice.data_parallel, extra_args=args,
                            startup_timeout_s=choice.startup_timeout, log_path=log_path)


def choice_takes_images(choice: ModelChoice) -> bool | None:
    """Whether the chosen model takes images, known before any server starts: `choice.images` when set, else
    from the config of the model directory it names or serves (the embedded model's too); None when no such
    directory is here (a hub id, an endpoint's model name)."""
    if choice.images is not None:
        return choice.images
    if choice.name is None:
        return None if choice.base_url is not None else takes_images(embedded_model_dir())
    return takes_images(Path(choice.name).expanduser())


def server_record_path(config: VLLMServerConfig) -> Path:
    """Where `tracegym inference` records the server it runs for `config`'s launch settings (model, context
    length, flags; not host or port), so that commands wanting the same server reuse it."""
    return cache_root() / "servers" / f"{config.launch_key()}.json"


def only_served_model(base_url: str, api_key_env: str | None = None) -> str:
    """The single model an endpoint serves; a UsageError when it serves several (pass `-m`)."""
    models = [str(m.get("id")) for m in served_models(base_url, api_key_env)]
    if len(models) != 1:
        raise UsageError(f"{base_url} serves {len(models)} models ({', '.join(models)}); choose one with -m")
    return models[0]


def check_reachable(base_url: str, model: str | None, api_key_env: str | None = None) -> None:
    """Fail fast, before any task runs, when the endpoint does not answer or does not serve `model`."""
    served = [m.get("id") for m in served_models(base_url, api_key_env)]
    if model is not None and served and model not in served:
        raise UsageError(f"{base_url} does not serve model {model!r} (it serves: {', '.join(map(str, served))})")


def served_models(base_url: str, api_key_env: str | None) -> list[dict[str, object]]:
    """The endpoint's model list; a host that does not resolve is a UsageError naming it (not a retry)."""
    check_resolves(base_url)
    return transport.served_models(base_url, os.environ.get(api_key_env) if api_key_env else None)


def check_resolves(base_url: str) -> None:
    """A UsageError naming the host of `base_url` when it does not resolve to an address."""
    host = urlsplit(base_url).hostname or ""
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"the host {host!r} of {base_url} does not resolve ({exc}); check the name") from None
