"""`tracegym image`: the container runtime's image, found at once when the engine's store has it, and a build that
cannot happen here failing with one line naming what is missing."""

import os
from pathlib import Path

import pytest

from tracegym.cli.main import main


def fake_podman(folder: Path, status: int) -> None:
    """A podman whose every command exits `status` (0: its store has any image asked for)."""
    (folder / "podman").write_text(f"#!/bin/sh\nexit {status}\n")
    (folder / "podman").chmod(0o755)


def test_an_image_already_in_the_store_is_not_built_again(tmp_path, monkeypatch, capsys):
    fake_podman(tmp_path, 0)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["image", "--engine", "podman"]) == 0
    assert capsys.readouterr().out == "tracegym-sandbox:bookworm in podman's store: 0 MB, already there\n"


def test_a_build_that_cannot_happen_says_what_is_missing(tmp_path, monkeypatch, capsys):
    fake_podman(tmp_path, 1)
    monkeypatch.setenv("PATH", str(tmp_path))  # no debootstrap on it either
    assert main(["image", "--engine", "podman", "--mirror", "http://127.0.0.1:9/debian"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("tracegym image: infrastructure error: building the container image needs ")
    assert ("root" in said) if os.geteuid() != 0 else ("debootstrap" in said)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_its_help_is_its_docstring(flag, capsys):
    assert main(["image", flag]) == 0
    assert "tracegym image [--engine podman|docker]" in capsys.readouterr().out
