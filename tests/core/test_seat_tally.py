"""Seat tally: the one count of a seat's rewards, outcomes, turns and metrics that eval and training read."""

import doctest

from tracegym.core import seat_tally
from tracegym.core.episode import Outcome
from tracegym.core.seat_tally import FORFEITS, PARSE_ERRORS, SeatTally
from tracegym.eval.episode_summary import summarize_episodes
from tracegym.testing import make_episode
from tracegym.train.seat_metrics import seat_metrics


def test_its_doctest():
    assert doctest.testmod(seat_tally).failed == 0


def test_a_tally_counts_decided_rewards_outcomes_turns_and_member_metrics():
    episodes = [make_episode({"p0": 1.0, "p1": -1.0}),
                make_episode({"p0": 1.0, "p1": -1.0}, outcomes={"p0": Outcome.WIN, "p1": Outcome.FORFEIT},
                             member_metrics={"p1": {PARSE_ERRORS: 2.0, FORFEITS: 1.0}}),
                make_episode({"p0": None, "p1": None})]
    tally = SeatTally.of((e, "p1") for e in episodes)
    assert (tally.episodes, tally.rewards, tally.decided) == (3, [-1.0, -1.0], 2)
    assert tally.outcomes == {Outcome.LOSS: 1, Outcome.FORFEIT: 1}
    assert tally.outcome_rates()[Outcome.FORFEIT] == 0.5 and tally.outcome_rates(over=4)[Outcome.LOSS] == 0.25
    assert tally.turns == 3 and tally.per_turn(PARSE_ERRORS) == 2 / 3 and tally.per_episode(FORFEITS) == 1 / 3
    assert SeatTally().outcome_rates() == {} and SeatTally().per_turn(PARSE_ERRORS) == 0.0


def test_eval_and_training_report_the_same_seat_from_one_tally():
    episodes = [make_episode({"p0": 1.0, "p1": -1.0}), make_episode({"p0": -1.0, "p1": 1.0}),
                make_episode({"p0": 1.0, "p1": -1.0}, member_metrics={"p0": {PARSE_ERRORS: 1.0}})]
    summary, step = summarize_episodes(episodes).seats["p0"], seat_metrics(episodes, [])
    assert summary.reward == step["seat/p0/reward"] == 1 / 3
    assert summary.outcomes["win"] == step["seat/p0/win_rate"] == 2 / 3
    assert summary.parse_error_rate == step["seat/p0/parse_errors"] / 3
