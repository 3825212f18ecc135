"""`tracegym inference`: serve a model (the embedded one by default) with vLLM in the foreground."""

from __future__ import annotations

import signal
import sys
import time
from typing import ClassVar

from pydantic import ConfigDict, field_validator, model_validator
from pydantic_config import BaseConfig

from tracegym.cli.interrupt import sigterm_unwinds
from tracegym.config.command_line import parse_command
from tracegym.config.renames import moved_into
from tracegym.models.embedded_vlm import vlm_choice
from tracegym.models.launch import server_config, server_record_path
from tracegym.models.model_choice import MOVED_KEYS, ModelChoice
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig


class ServedModel(ModelChoice):
    """The model to serve (its `name`, `max_model_len` and `vllm_args` apply here)."""

    served_by: ClassVar[str | None] = "tracegym inference"

    @field_validator("servers")
    @classmethod
    def _one_server(cls, value: int) -> int:
        if value != 1:
            raise ValueError("`tracegym inference` runs one server: run it once per server (each with its own "
                             "--port) and give `eval` their URLs in --model.base-url, or use `eval --model.servers`")
        return value


class InferenceConfig(BaseConfig):
    """Serve a model with vLLM on this machine until Ctrl-C."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model: ServedModel = ServedModel()
    host: str = "127.0.0.1"
    """Interface to bind (loopback by default)."""
    port: int = 8000
    """Port to bind; 0 picks a free one."""
    vlm: bool = False
    """Serve the embedded VLM (SmolLM2-135M with a small vision tower, built once into the model cache) instead of
    `model.name`: prompts may carry images, through the chat client or the token client."""

    @model_validator(mode="after")
    def _vlm_or_name(self) -> InferenceConfig:
        if self.vlm and self.model.name is not None:
            raise ValueError("--vlm serves the embedded VLM: leave --model.name unset")
        return self


RENAMES = moved_into("model", MOVED_KEYS)
"""Keys that moved into the `[model]` section: each still works, with a warning naming its new place."""


def run(args: list[str]) -> int:
    """Start the server, print its endpoint, and wait for Ctrl-C or SIGTERM; then stop it and its children.

    The server is recorded (see `server_record_path`) so that `tracegym eval` with the same model and settings
    uses it instead of starting its own. Ctrl-C or SIGTERM also stop a server that is still starting.
    """
    cfg, warnings = parse_command(InferenceConfig, args, prog="tracegym inference", renames=RENAMES)
    for warning in warnings:
        print(f"tracegym inference: warning: {warning}", file=sys.stderr)
    config = server_config(vlm_choice(cfg.model) if cfg.vlm else cfg.model)
    config = config.model_copy(update={"host": cfg.host, "port": cfg.port, "state_path": server_record_path(config)})
    print(f"starting vLLM on {config.model} (log: see below if it fails) ...", flush=True)
    started = time.monotonic()
    sigterm_unwinds(once=True)  # and a second signal cannot cut the stop short
    try:
        with VLLMServer(config) as server:
            try:
                _announce(server, config, time.monotonic() - started)
                while True:
                    signal.pause()
            except KeyboardInterrupt:
                print("stopping vLLM ...", flush=True)
    except KeyboardInterrupt:
        print("interrupted before vLLM was ready; stopped it", flush=True)
        return 130
    return 0


def _announce(server: VLLMServer, config: VLLMServerConfig, seconds: float) -> None:
    """Print where the server answers (the `endpoint:` line is what scripts read)."""
    if server.owned:
        print(f"ready in {seconds:.1f}s", flush=True)
    else:
        print("reusing the server another `tracegym inference` runs with the same settings", flush=True)
    print(f"endpoint: {server.base_url}\nmodel:    {config.name}", flush=True)
    if server.owned:
        print(f"log:      {server.log_path}", flush=True)
    print("Ctrl-C to stop", flush=True)
