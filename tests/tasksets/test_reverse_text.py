"""reverse-text: generated data, the LCS reward, lookup by id."""

import tracegym as tg
from tracegym.tasksets.reverse_text import lcs_length, lcs_ratio
from tracegym.testing import ScriptedModel


def _brute_lcs(a: str, b: str) -> int:
    if not a or not b:
        return 0
    if a[0] == b[0]:
        return 1 + _brute_lcs(a[1:], b[1:])
    return max(_brute_lcs(a[1:], b), _brute_lcs(a, b[1:]))


def test_lcs_matches_brute_force():
    for a, b in [("abcde", "ace"), ("", "x"), ("banana", "atana"), ("xyz", "abc")]:
        assert lcs_length(a, b) == _brute_lcs(a, b)


def test_lcs_ratio_bounds():
    assert lcs_ratio("abc", "abc") == 1.0 and lcs_ratio("abc", "xyz") == 0.0


def test_tasks_are_deterministic_for_a_seed():
    first = [d.prompt for d in tg.load_taskset("reverse-text").head(5)]
    assert first == [d.prompt for d in tg.load_taskset("reverse-text").head(5)]
    assert first != [d.prompt for d in tg.load_taskset("reverse-text", {"seed": 1}).head(5)]


async def test_exact_reversal_scores_one():
    model = ScriptedModel(rule=lambda r: r.messages[-1].text[::-1])
    traces = await tg.evaluate("reverse-text", model, num_tasks=3, rollouts=2)
    assert [t.reward for t in traces] == [1.0] * 6


def test_wrong_config_field_names_the_field():
    import pytest

    with pytest.raises(tg.UsageError, match="max_wrods"):
        tg.load_taskset("reverse-text", {"max_wrods": 3})
