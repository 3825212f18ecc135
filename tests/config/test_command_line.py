"""Command line: `@` files and flags parsed into a config; each error names the flag or the file and TOML key."""

import pytest
from pydantic import BaseModel, ConfigDict
from pydantic_config import BaseConfig

import tracegym as tg
from tracegym.config.command_line import parse_command
from tracegym.config.error_report import toml_key
from tracegym.config.renames import Rename


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = 1


class Outer(BaseConfig):
    model_config = ConfigDict(extra="forbid")
    inner: Inner = Inner()
    items: list[Inner] = []


def test_a_file_after_a_flag_is_nested_under_it(tmp_path):
    (tmp_path / "inner.toml").write_text("size = 3\n")
    config, _ = parse_command(Outer, ["--inner", "@", str(tmp_path / "inner.toml")], prog="t")
    assert config.inner.size == 3


def test_an_error_in_a_file_nested_under_a_flag_names_the_file_and_full_key(tmp_path):
    (tmp_path / "inner.toml").write_text("size = 'big'\n")
    with pytest.raises(tg.UsageError, match=r"inner\.toml: \[inner\] size: Input should be a valid integer"):
        parse_command(Outer, ["--inner", "@", str(tmp_path / "inner.toml")], prog="t")


def test_an_error_in_a_list_of_tables_names_the_item(tmp_path):
    (tmp_path / "items.toml").write_text("[[items]]\nsize = 1\n[[items]]\nsiz = 2\n")
    with pytest.raises(tg.UsageError, match=r"items\.toml: \[items\[1\]\] siz: unknown key"):
        parse_command(Outer, ["@", str(tmp_path / "items.toml")], prog="t")


def test_a_renamed_key_is_migrated_in_files_and_flags_with_warnings(tmp_path):
    (tmp_path / "old.toml").write_text("[old]\nsize = 4\n")
    renames = [Rename("old", "inner")]
    config, warnings = parse_command(Outer, ["@", str(tmp_path / "old.toml")], prog="t", renames=renames)
    assert config.inner.size == 4 and "'inner'" in warnings[0]
    config, _ = parse_command(Outer, ["--old.size", "5"], prog="t", renames=renames)
    assert config.inner.size == 5


def test_toml_keys_read_as_a_toml_reader_finds_them():
    assert toml_key("steps") == "steps"
    assert toml_key("orchestrator.train.sampling.temperature") == "[orchestrator.train.sampling] temperature"
    assert toml_key("orchestrator.train.envs.0.id") == "[orchestrator.train.envs[0]] id"
