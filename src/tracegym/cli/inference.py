"""`tracegym inference`: serve a model (the embedded one by default) with vLLM in the foreground."""

from __future__ import annotations

import signal
import threading
import time

from pydantic_config import BaseConfig, cli

from tracegym.models.launch import ModelChoice, server_config
from tracegym.models.vllm_server import VLLMServer


class InferenceConfig(BaseConfig):
    """Serve a model with vLLM on this machine until Ctrl-C."""

    model: str | None = None
    """Hugging Face model directory or hub id; unset: the embedded SmolLM2-135M-Instruct."""
    host: str = "127.0.0.1"
    """Interface to bind (loopback by default)."""
    port: int = 8000
    """Port to bind; 0 picks a free one."""
    max_model_len: int = 2048
    """Context length in tokens."""
    vllm_args: list[str] = []
    """Extra vLLM server flags, passed as given."""


def run(args: list[str]) -> int:
    """Start the server, print its endpoint, and wait for Ctrl-C or SIGTERM; then stop it and its children."""
    cfg = cli(InferenceConfig, args=args, prog="tracegym inference")
    choice = ModelChoice(model=cfg.model, max_model_len=cfg.max_model_len, vllm_args=cfg.vllm_args)
    config = server_config(choice).model_copy(update={"host": cfg.host, "port": cfg.port})
    print(f"starting vLLM on {config.model} (log: see below if it fails) ...", flush=True)
    started = time.monotonic()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with VLLMServer(config) as server:
        print(f"ready in {time.monotonic() - started:.1f}s", flush=True)
        print(f"endpoint: {server.base_url}\nmodel:    {config.name}\nlog:      {server.log_path}", flush=True)
        print("Ctrl-C to stop", flush=True)
        try:
            while not done.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
        print("stopping vLLM ...", flush=True)
    return 0
