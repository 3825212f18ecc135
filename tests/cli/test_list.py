"""`tracegym list` marks each multi-agent taskset with its seats."""

from tracegym.cli.list import SINGLE_AGENT, taskset_rows


def test_a_multi_agent_taskset_is_listed_with_its_seats_and_a_single_agent_one_with_none():
    rows = {name: seats for name, seats, _ in taskset_rows(["kuhn-poker", "debate", "reverse-text"])}
    assert rows["kuhn-poker"] == "player_0, player_1" and rows["debate"] == "debater_a, debater_b, judge"
    assert rows["reverse-text"] == SINGLE_AGENT

