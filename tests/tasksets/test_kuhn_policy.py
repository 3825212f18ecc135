"""Reading a Kuhn poker policy from logprobs: the prompts at the 12 information sets and the renormalisation."""

import math

import pytest

from tracegym.envs.evaluate import run_episode
from tracegym.envs.registry import load_taskset
from tracegym.tasksets.kuhn_exploitability import exploitability, infosets
from tracegym.tasksets.kuhn_poker import NASH
from tracegym.tasksets.kuhn_policy import (
    infoset_prompt,
    infoset_prompts,
    observed_moves,
    read_policy,
    sampled_policy,
)
from tracegym.testing import ScriptedModel


async def test_the_prompt_at_an_information_set_does_not_depend_on_the_other_card():
    assert await infoset_prompt("bet", "Q", other="J") == await infoset_prompt("bet", "Q", other="K")


async def test_each_information_set_ends_with_what_the_referee_tells_that_seat():
    prompts = await infoset_prompts()
    assert len(prompts) == 12
    assert prompts[("check bet", "K")][-1].text == ("Your card: K. So far: player_0 checks; player_1 bets. Your move: "
                                                    "call or fold?")
    assert prompts[("check bet", "K")][0].text.startswith("You are player_0.")
    assert prompts[("check", "J")][0].text.startswith("You are player_1.")
    assert [m.text for m in prompts[("check bet", "K")] if m.role == "assistant"] == ["check"]


def table(bold: dict[tuple[str, str], float], legal: float) -> dict[tuple[str, str], dict[str, float]]:
    """Logprobs giving each information set's bolder action `bold` of `legal` mass, split over both spellings."""
    words = {"": ("check", "bet"), "check": ("check", "bet"), "bet": ("fold", "call"), "check bet": ("fold", "call")}
    out = {}
    for (history, card), chance in bold.items():
        passive, aggressive = words[history]
        half = {passive: legal * (1 - chance) / 2, aggressive: legal * chance / 2}
        out[(history, card)] = {t: math.log(p) if p else -math.inf for w, p in half.items()
                                for t in (w, w.capitalize())}
    return out


def test_read_policy_renormalises_over_legal_actions_and_reports_the_rest():
    read = read_policy(table({k: float(v) if 0 < v < 1 else (0.999 if v else 0.001) for k, v in NASH.items()},
                             legal=0.2))
    assert read.strategy[("check bet", "Q")] == pytest.approx(2 / 3)
    assert read.other_mass == pytest.approx(0.8)
    assert exploitability(read.strategy) < 0.01


def test_a_missing_completion_is_named():
    logprobs = {key: {"check": -1.0, "bet": -1.0, "call": -1.0, "fold": -1.0} for key in infosets()}
    with pytest.raises(ValueError, match="no logprob for completion 'Check'"):
        read_policy(logprobs)


def test_sampled_replies_are_read_as_the_referee_reads_them():
    replies = {key: ["I will check, no wait: bet!", "Check.", "hmm", "bet"] if key[0] in ("", "check")
               else ["I fold", "call it", "CALL", "no idea"] for key in infosets()}
    read = sampled_policy(replies)
    assert read.strategy[("", "K")] == pytest.approx(2 / 3)  # the last legal word: bet, check, bet
    assert read.strategy[("bet", "J")] == pytest.approx(2 / 3)  # fold, call, call
    assert read.other_mass == pytest.approx(0.25)


def test_an_information_set_without_a_legal_reply_is_named():
    with pytest.raises(ValueError, match=r"information set \('', 'J'\): none of its 2 replies"):
        sampled_policy({key: ["hello", "there"] for key in infosets()})


def test_an_information_set_without_a_legal_reply_reads_as_the_chance_given():
    replies = {key: ["bet"] if key[0] in ("", "check") else ["call"] for key in infosets()}
    replies[("", "J")] = ["hello", "there"]
    read = sampled_policy(replies, unnamed=0.5)
    assert read.strategy[("", "J")] == 0.5 and read.legal_mass[("", "J")] == 0.0
    assert read.strategy[("", "K")] == 1.0


async def hand_trace(cards: dict[str, str], p0: list[str], p1: list[str]):
    said = {"player_0": iter(p0), "player_1": iter(p1)}
    model = ScriptedModel(rule=lambda r: next(said[r.messages[0].text.split()[2].rstrip(".")]))
    taskset = load_taskset("kuhn-poker")
    return await run_episode(taskset, taskset.as_data({"prompt": "A new hand begins.", "cards": cards, "id": "h"}),
                             model)


async def test_observed_moves_reads_each_decision_as_the_referee_did():
    episode = await hand_trace({"player_0": "Q", "player_1": "K"}, ["I will check", "hmm", "call it"], ["Bet."])
    assert observed_moves(episode.traces["player_0"]) == [(("", "Q"), "check"), (("check bet", "Q"), "call")]
    assert observed_moves(episode.traces["player_1"]) == [(("check", "K"), "bet")]


async def test_a_forfeit_is_an_observed_move_of_none():
    episode = await hand_trace({"player_0": "J", "player_1": "K"}, ["raise", "all in", "no"], [])
    assert observed_moves(episode.traces["player_0"]) == [(("", "J"), None)]


async def test_the_prompt_is_what_a_model_in_that_seat_is_shown():
    replies = {"player_0": iter(["check", "fold"]), "player_1": iter(["bet"])}
    episode_model = ScriptedModel(rule=lambda r: next(replies[r.messages[0].text.split()[2].rstrip(".")]))
    taskset = load_taskset("kuhn-poker")
    row = taskset.as_data({"prompt": "A new hand begins.", "cards": {"player_0": "Q", "player_1": "J"}, "id": "h"})
    await run_episode(taskset, row, episode_model)
    shown = [list(r.messages) for r in episode_model.requests]  # player_0 at "", player_1 at "check", player_0 again
    assert shown == [await infoset_prompt("", "Q"), await infoset_prompt("check", "J"),
                     await infoset_prompt("check bet", "Q")]
