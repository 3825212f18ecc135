"""Kuhn poker's referee: showdowns, folds, retries and forfeits, payoffs in chips (the known game value), its
scripted players, over scripted models."""

import itertools
from fractions import Fraction

from tracegym.core.episode import Outcome
from tracegym.envs.evaluate import run_episode
from tracegym.envs.registry import load_taskset
from tracegym.tasksets.kuhn_poker import CARDS, GAME_VALUE, NASH
from tracegym.testing import ScriptedModel


def players(p0: list[str], p1: list[str]) -> ScriptedModel:
    """Each player replies from its own list, in turn."""
    said = {"player_0": iter(p0), "player_1": iter(p1)}
    return ScriptedModel(rule=lambda r: next(said[r.messages[0].text.split()[2].rstrip(".")]))


async def hand(cards: dict[str, str], p0: list[str], p1: list[str]):
    taskset = load_taskset("kuhn-poker")
    row = taskset.as_data({"prompt": "A new hand begins.", "cards": cards, "id": "h"})
    return await run_episode(taskset, row, players(p0, p1))


async def test_check_check_goes_to_showdown_and_the_higher_card_wins():
    episode = await hand({"player_0": "J", "player_1": "K"}, ["I check"], ["check"])
    assert episode.outcomes == {"player_0": Outcome.LOSS, "player_1": Outcome.WIN}
    assert episode.rewards == {"player_0": -1.0, "player_1": 1.0}  # the antes


async def test_a_called_bet_pays_two_chips_and_a_fold_loses_what_the_folder_put_in():
    called = await hand({"player_0": "K", "player_1": "Q"}, ["<think>I have K</think>bet"], ["call"])
    assert called.rewards == {"player_0": 2.0, "player_1": -2.0}
    assert called.member_metrics["player_0"]["won"] == 1.0
    folded = await hand({"player_0": "J", "player_1": "Q"}, ["check", "fold"], ["bet"])
    assert folded.outcomes["player_1"] == Outcome.WIN and folded.metrics["slots"] == 3
    assert folded.rewards == {"player_0": -1.0, "player_1": 1.0}
    p0 = folded.traces["player_0"].messages
    assert "Your card: J. So far: player_0 checks; player_1 bets. Your move: call or fold?" in [m.text for m in p0]
    assert not any("Your card: Q" in m.text for m in p0)  # the other's card is never shown


async def test_illegal_replies_are_retried_then_the_player_forfeits():
    episode = await hand({"player_0": "Q", "player_1": "K"}, ["raise", "all in", "call"], [])
    assert episode.outcomes == {"player_0": Outcome.FORFEIT, "player_1": Outcome.WIN}
    assert episode.rewards == {"player_0": -1.0, "player_1": 1.0}  # what a fold would lose: its ante
    assert episode.member_metrics["player_0"]["invalid_moves"] == 3 and episode.metrics["forfeits"] == 1


async def test_deals_are_seeded_and_distinct_cards():
    first, again = list(load_taskset("kuhn-poker", {"num_tasks": 20})), list(load_taskset("kuhn-poker",
                                                                                            {"num_tasks": 20}))
    assert first == again and all(len(set(d.cards.values())) == 2 for d in first)


async def test_a_forfeit_facing_a_bet_loses_the_chips_put_in_and_the_bettor_takes_them():
    episode = await hand({"player_0": "K", "player_1": "J"}, ["check", "raise", "raise", "raise"], ["bet"])
    assert episode.outcomes == {"player_0": Outcome.FORFEIT, "player_1": Outcome.WIN}
    assert episode.rewards == {"player_0": -1.0, "player_1": 1.0}


def betting_lines() -> list[tuple[list[str], list[str]]]:
    """Every way a hand can be bet: (player_0's actions, player_1's)."""
    return [(["bet"], ["call"]), (["bet"], ["fold"]), (["check"], ["check"]), (["check", "call"], ["bet"]),
            (["check", "fold"], ["bet"])]


def chance(strategy, cards: dict[str, str], p0: list[str], p1: list[str]) -> Fraction:
    """The chance both players following `strategy` bet a hand this way."""
    order = [("player_0", p0[0]), ("player_1", p1[0]), *(("player_0", a) for a in p0[1:])]
    p, history = Fraction(1), []
    for player, action in order:
        bold = strategy[(" ".join(history), cards[player])]
        p *= bold if action in ("bet", "call") else 1 - bold
        history.append(action)
    return p


async def test_nash_play_is_worth_the_known_game_value_minus_one_eighteenth_to_player_0():
    """Every deal and betting line played by the referee, weighted by its chance under NASH: an exact expectation."""
    value = Fraction(0)
    for first, second in itertools.permutations(CARDS, 2):
        cards = {"player_0": first, "player_1": second}
        for p0, p1 in betting_lines():
            weight = chance(NASH, cards, p0, p1)
            if weight:
                episode = await hand(cards, p0, p1)
                assert episode.rewards["player_0"] == -episode.rewards["player_1"]  # zero-sum
                value += weight * Fraction(episode.rewards["player_0"]) / 6
    assert value == GAME_VALUE == Fraction(-1, 18)
