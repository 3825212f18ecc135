"""Every config under `configs/` dry-runs as a fresh clone would: from an empty working directory, nothing
written, exit 0 (a config whose inputs come from another run, such as OPD's teacher, says so in a warning)."""

from pathlib import Path

import pytest

from tracegym.cli.main import main

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*/*.toml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shipped_config_dry_runs_from_an_empty_folder(config, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    command = "eval" if config.parent.name == "eval" else "rl"
    assert main([command, "@", str(config), "--dry-run"]) == 0, capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_every_kind_of_shipped_config_is_covered():
    assert {p.parent.name for p in CONFIGS} == {"eval", "opd", "rl", "sft"}
