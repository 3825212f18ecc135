"""reverse-text's train/held-out split: disjoint by construction, near-duplicates on one side, every seed."""

import pytest

import tracegym as tg
from tracegym.tasksets.reverse_text import WORDS, phrase_split


def _prompts(options: dict) -> list[str]:
    return [row.prompt for row in tg.load_taskset("reverse-text", options)]


def _word_sets(prompts: list[str]) -> set[tuple[str, ...]]:
    return {tuple(sorted(p.split())) for p in prompts}


def test_train_and_held_out_phrases_never_overlap_across_seeds():
    train = _prompts({"seed": 0, "split": "train", "num_tasks": 2000})
    held_out = _prompts({"seed": 12345, "split": "held_out", "num_tasks": 500})
    assert not set(train) & set(held_out)


def test_no_held_out_phrase_is_a_reordering_of_a_training_phrase():
    train = _prompts({"seed": 0, "split": "train", "num_tasks": 2000})
    held_out = _prompts({"seed": 12345, "split": "held_out", "num_tasks": 500})
    assert not _word_sets(train) & _word_sets(held_out)


def test_every_word_of_a_held_out_phrase_is_taught_in_training_phrases():
    train_words = {w for p in _prompts({"seed": 0, "split": "train", "num_tasks": 2000}) for w in p.split()}
    assert train_words == set(WORDS)


def test_a_phrase_and_its_reordering_fall_on_the_same_side():
    assert phrase_split("apple river stone", 20) == phrase_split("stone apple river", 20)


def test_the_held_out_side_is_about_its_percent_of_word_combinations():
    combos = [f"{a} {b}" for a in WORDS for b in WORDS if a <= b]
    share = sum(phrase_split(c, 20) == "held_out" for c in combos) / len(combos)
    assert 0.15 < share < 0.25


def test_a_split_keeps_its_task_count_and_answers():
    rows = list(tg.load_taskset("reverse-text", {"seed": 3, "split": "held_out", "num_tasks": 50}))
    assert len(rows) == 50 and all(r.answer == r.prompt[::-1] for r in rows)
    assert all(phrase_split(r.prompt, 20) == "held_out" for r in rows)


def test_the_unsplit_taskset_is_unchanged_by_the_option():
    assert _prompts({"seed": 0, "num_tasks": 20}) == _prompts({"seed": 0, "split": "all", "num_tasks": 20})


def test_a_bad_split_names_the_field():
    with pytest.raises(tg.UsageError, match="split"):
        tg.load_taskset("reverse-text", {"split": "test"})
