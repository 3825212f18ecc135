"""Kuhn poker's referee: showdowns, folds, retries and forfeits, payoffs, over scripted players."""

from tracegym.core.episode import Outcome
from tracegym.envs.evaluate import run_episode
from tracegym.envs.registry import load_taskset
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
    assert episode.rewards == {"player_0": -1.0, "player_1": 1.0}
    assert episode.member_metrics["player_1"]["chips"] == 1.0


async def test_bet_call_and_check_bet_fold():
    called = await hand({"player_0": "K", "player_1": "Q"}, ["<think>I have K</think>bet"], ["call"])
    assert called.rewards == {"player_0": 1.0, "player_1": -1.0} and called.member_metrics["player_0"]["chips"] == 2
    folded = await hand({"player_0": "J", "player_1": "Q"}, ["check", "fold"], ["bet"])
    assert folded.outcomes["player_1"] == Outcome.WIN and folded.metrics["slots"] == 3
    p0 = folded.traces["player_0"].messages
    assert "Your card: J. So far: player_0 checks; player_1 bets. Your move: call or fold?" in [m.text for m in p0]
    assert not any("Your card: Q" in m.text for m in p0)  # the other's card is never shown


async def test_illegal_replies_are_retried_then_the_player_forfeits():
    episode = await hand({"player_0": "Q", "player_1": "K"}, ["raise", "all in", "call"], [])
    assert episode.outcomes == {"player_0": Outcome.FORFEIT, "player_1": Outcome.WIN}
    assert episode.rewards == {"player_0": -1.0, "player_1": 1.0}
    assert episode.member_metrics["player_0"]["invalid_moves"] == 3 and episode.metrics["forfeits"] == 1


async def test_deals_are_seeded_and_distinct_cards():
    first, again = list(load_taskset("kuhn-poker", {"num_tasks": 20})), list(load_taskset("kuhn-poker",
                                                                                            {"num_tasks": 20}))
    assert first == again and all(len(set(d.cards.values())) == 2 for d in first)
