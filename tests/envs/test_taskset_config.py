"""Taskset configs: a wrong field is a UsageError that names it, suggests the closest one and lists the rest."""

import pytest

import tracegym as tg


class Opts(tg.TasksetConfig):
    """Options of the test taskset."""

    max_words: int = 3
    """Most words."""
    min_words: int = 1
    """Fewest words."""


class Words(tg.Taskset):
    id = "words"
    Config = Opts

    def load(self):
        return [{"prompt": "x"}]


def test_misspelt_field_suggests_the_closest_known_one():
    with pytest.raises(tg.UsageError, match=r"field 'max_wrods': Extra inputs.*did you mean 'max_words'\?"):
        Words({"max_wrods": 3})


def test_unknown_field_lists_the_known_fields():
    with pytest.raises(tg.UsageError, match=r"Known fields: max_words, min_words, seed$"):
        Words({"colour": "red"})


def test_unknown_field_with_no_close_match_makes_no_suggestion():
    with pytest.raises(tg.UsageError) as info:
        Words({"colour": "red"})
    assert "did you mean" not in str(info.value)


def test_wrong_type_names_the_field_without_a_field_list():
    with pytest.raises(tg.UsageError, match=r"field 'max_words'") as info:
        Words({"max_words": "many"})
    assert "Known fields" not in str(info.value)


def test_builtin_taskset_suggests_the_closest_field():
    with pytest.raises(tg.UsageError, match=r"did you mean 'max_words'\?"):
        tg.load_taskset("reverse-text", {"max_wrods": 3})
