"""arithmetic's `difficulty` option: presets of operand digits and operation count; explicit options win."""

import pytest

import tracegym as tg


def shape(options: dict) -> tuple[int, int]:
    """(operations, longest operand) over the first 50 expressions."""
    rows = list(tg.load_taskset("arithmetic", options).head(50))
    tokens = [d.expression.split() for d in rows]
    assert len({len(t) for t in tokens}) == 1
    return len(tokens[0]) // 2, max(len(t) for ts in tokens for t in ts[::2])


@pytest.mark.parametrize(("difficulty", "expected"), [("easy", (1, 1)), ("medium", (2, 2)), ("hard", (3, 3))])
def test_difficulty_presets_the_operations_and_operand_digits(difficulty, expected):
    assert shape({"difficulty": difficulty}) == expected


def test_an_explicit_option_wins_over_the_preset():
    assert shape({"difficulty": "hard", "num_ops": 1}) == (1, 3)


def test_an_unknown_difficulty_is_a_usage_error_naming_the_field():
    with pytest.raises(tg.UsageError, match="difficulty"):
        tg.load_taskset("arithmetic", {"difficulty": "impossible"})
