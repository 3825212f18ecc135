"""Renamed config keys keep working for a release, with a warning naming the new key."""

import pytest

import tracegym as tg
from tracegym.config.error_report import one_line
from tracegym.config.renames import Rename, migrate, migrate_flags

RENAMES = [Rename("sampling", "orchestrator.train.sampling"),
           Rename("orchestrator.train.sampling.max_completion_tokens", "orchestrator.train.sampling.max_tokens")]


def test_a_moved_section_lands_in_its_new_place_with_a_warning():
    data, warnings = migrate({"sampling": {"temperature": 0.5}}, RENAMES)
    assert data == {"orchestrator": {"train": {"sampling": {"temperature": 0.5}}}}
    assert "'orchestrator.train.sampling'" in warnings[0]


def test_a_moved_then_renamed_key_ends_at_its_newest_name():
    data, warnings = migrate({"sampling": {"max_completion_tokens": 32}}, RENAMES)
    assert data == {"orchestrator": {"train": {"sampling": {"max_tokens": 32}}}}
    assert len(warnings) == 2


def test_new_names_pass_untouched_and_silently():
    data = {"orchestrator": {"train": {"sampling": {"max_tokens": 8}}}}
    assert migrate(data, RENAMES) == (data, [])


def test_a_key_given_under_both_names_is_an_error():
    with pytest.raises(tg.UsageError, match="keep only"):
        migrate({"orchestrator": {"train": {"sampling": {"max_tokens": 1, "max_completion_tokens": 2}}}}, RENAMES)


def test_old_cli_flags_are_rewritten_kebab_case():
    args, warnings = migrate_flags(["--sampling.max-completion-tokens", "12", "--steps=3"], RENAMES)
    assert args == ["--orchestrator.train.sampling.max-tokens", "12", "--steps=3"]
    assert len(warnings) == 2


def test_a_validation_report_becomes_one_line_per_flag():
    report = ("Failed to validate config: 1 validation error for X\n--num-tasks\n"
              "  Input should be a valid integer (got 'x')")
    assert one_line(report) == "--num-tasks: Input should be a valid integer (got 'x')"


INTO_ITSELF = [Rename("model", "model.name"), Rename("base_url", "model.base_url")]


def test_a_key_moved_into_a_section_of_its_own_name_moves_only_as_a_value():
    data, _ = migrate({"model": "Qwen/Qwen3-8B", "base_url": "http://h/v1"}, INTO_ITSELF)
    assert data == {"model": {"name": "Qwen/Qwen3-8B", "base_url": "http://h/v1"}}
    table = {"model": {"name": "m", "client": "tokens"}}
    assert migrate(table, INTO_ITSELF) == (table, [])


def test_a_flag_moved_into_a_section_of_its_own_name_moves_only_alone():
    args, _ = migrate_flags(["--model", "m", "--model.client", "tokens", "--base-url=http://h/v1"], INTO_ITSELF)
    assert args == ["--model.name", "m", "--model.client", "tokens", "--model.base-url=http://h/v1"]


def test_a_key_moved_into_a_section_of_its_own_name_is_a_shorthand_without_a_warning():
    _, warnings = migrate({"model": "Qwen/Qwen3-8B", "base_url": "http://h/v1"}, INTO_ITSELF)
    _, flag_warnings = migrate_flags(["--model", "m", "--base-url=http://h/v1"], INTO_ITSELF)
    assert warnings == flag_warnings == ["config key 'base_url' was renamed 'model.base_url' (in 0.1); please update "
                                         "your config"]
