"""Run directory: made once under --output-dir, written whole, read back with errors that name the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracegym.config.run_dir import make_run_dir, read_toml, write_atomic, write_toml
from tracegym.core.errors import UsageError


def test_an_existing_run_folder_is_refused_naming_run_id_and_resume(tmp_path: Path):
    make_run_dir(tmp_path, "run")
    with pytest.raises(UsageError, match="already exists; pick another --run-id or --resume it"):
        make_run_dir(tmp_path, "run")


def test_an_output_dir_that_cannot_hold_a_folder_is_named_as_the_flag(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match=r"^--output-dir '.*file': cannot create a run folder there"):
        make_run_dir(blocker, "run")


def test_a_written_config_reads_back_and_leaves_no_temporary_file(tmp_path: Path):
    write_toml(tmp_path / "config.toml", {"model": {"name": "m"}, "steps": 3})
    assert read_toml(tmp_path / "config.toml") == {"model": {"name": "m"}, "steps": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]


def test_an_unparsable_config_is_named_in_one_line(tmp_path: Path):
    write_atomic(tmp_path / "config.toml", "steps = = 3")
    with pytest.raises(UsageError, match=r"config\.toml' is not valid TOML"):
        read_toml(tmp_path / "config.toml")
