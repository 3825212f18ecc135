"""The Kuhn poker policy a model plays, read from its logprobs of each legal action at each information set.

`infoset_prompts()` renders, by playing the hand up to it through the episode engine with scripted seats, the
exact conversation the kuhn-poker taskset shows a seat at each of the 12 information sets (its system prompt, the
deal's prompt, the referee's `observe` lines, its own earlier action as its assistant turn, the bare word).
A scorer (outside, it runs the model) gives the summed logprob of each completion text in `action_texts` after
that prompt; `read_policy` sums each legal action's texts' probabilities, renormalises over the two legal actions
(the bolder one's share is the strategy `kuhn_exploitability` takes) and keeps the legal mass, so the mass on
anything else (illegal or other replies) is reported, not dropped. `observed_moves` reads, from a played
trace, the move a seat made at each information set it met (the referee's rule, `kuhn_poker.read_move`: the last
legal action word of its first reply that has one; None when it forfeited), for a policy estimated from sampled
play. `sampled_policy` reads the policy from replies sampled at each information set the same way: a model that
answers in sentences ("I'll bet, then") puts little logprob on the bare words, though the referee reads a move in
most of its replies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from tracegym.core.messages import Message
from tracegym.core.trace import Trace
from tracegym.envs.evaluate import ModelArg, run_episode
from tracegym.envs.registry import load_taskset
from tracegym.envs.seats import Seat
from tracegym.tasksets.kuhn_exploitability import PASSIVE_BOLD, actor, infosets
from tracegym.tasksets.kuhn_poker import CARDS, read_move

SEAT_IDS = ("player_0", "player_1")
OBSERVE = re.compile(r"Your card: ([JQK])\. So far: (.*)\. Your move: (\w+) or (\w+)\?")
"""What the referee tells a seat before it acts (`KuhnPokerTask.observe`)."""


def action_texts(action: str) -> tuple[str, ...]:
    """The completion texts that count as `action`: the word as the referee lists it and capitalised."""
    return (action, action.capitalize())


def other_card(card: str) -> str:
    """A card the other seat may hold (the prompt must not depend on which)."""
    return next(c for c in CARDS if c != card)


REACH = {"": ("always-check", "always-bet"), "check": ("always-check", "always-bet"),
         "check bet": ("always-check", "always-bet"), "bet": ("always-bet", "always-check")}
"""Per history, the scripts of (player_0, player_1) whose hand passes through it."""


async def infoset_prompt(history: str, card: str, other: str | None = None) -> list[Message]:
    """The messages the seat to act after `history` is shown holding `card` (the other seat holds `other`): the
    hand played by scripted seats up to there, the seat's trace cut after the referee's line for that decision."""
    seat = SEAT_IDS[actor(history)]
    cards = {seat: card, SEAT_IDS[1 - actor(history)]: other or other_card(card)}
    seats = {member: Seat(script=script) for member, script in zip(SEAT_IDS, REACH[history], strict=True)}
    taskset = load_taskset("kuhn-poker")
    row = taskset.as_data({"prompt": "A new hand begins.", "cards": cards, "id": "infoset"})
    episode = await run_episode(taskset, row, cast("ModelArg", None), seats=seats)  # every seat is scripted
    messages = episode.traces[seat].messages
    decisions = [i for i, m in enumerate(messages) if m.role == "user" and OBSERVE.search(m.text)]
    return list(messages[:decisions[len(history.split()) // 2] + 1])


async def infoset_prompts() -> dict[tuple[str, str], list[Message]]:
    """The prompt at each of the 12 information sets, (history, card) -> messages."""
    return {key: await infoset_prompt(*key) for key in infosets()}


@dataclass(frozen=True)
class ReadPolicy:
    """A policy read from logprobs: the strategy over legal actions and, per information set, the legal mass."""

    strategy: dict[tuple[str, str], float]
    """(history, card) -> the bolder action's share of the legal actions' probability."""
    legal_mass: dict[tuple[str, str], float]
    """(history, card) -> the probability of the legal actions' texts together (1 - this: anything else)."""

    @property
    def other_mass(self) -> float:
        """The mean, over the 12 information sets, of the probability on anything but a legal action's texts."""
        return sum(1 - m for m in self.legal_mass.values()) / len(self.legal_mass)


def read_policy(logprobs: Mapping[tuple[str, str], Mapping[str, float]]) -> ReadPolicy:
    """The policy from each information set's summed logprobs of the completion texts of `action_texts`."""
    strategy, legal = {}, {}
    for key in infosets():
        passive, bold = (action_probability(logprobs[key], a) for a in PASSIVE_BOLD[key[0]])
        if passive + bold <= 0:
            raise ValueError(f"information set {key}: no probability on either legal action")
        strategy[key], legal[key] = bold / (passive + bold), passive + bold
    return ReadPolicy(strategy, legal)


def action_probability(logprobs: Mapping[str, float], action: str) -> float:
    """The probability of `action`: the sum over its completion texts."""
    texts: Sequence[str] = action_texts(action)
    missing = [t for t in texts if t not in logprobs]
    if missing:
        raise ValueError(f"no logprob for completion {missing[0]!r}")
    return sum(math.exp(logprobs[t]) for t in texts)


def history_of(so_far: str) -> str:
    """The actions in an `observe` line's "So far" text (`player_0 checks; player_1 bets` -> `check bet`)."""
    if so_far == "nobody has acted yet":
        return ""
    return " ".join(part.split()[1].removesuffix("s") for part in so_far.split("; "))


def observed_moves(trace: Trace) -> list[tuple[tuple[str, str], str | None]]:
    """(information set, move) for each decision in a played trace; move None for a forfeit."""
    out: list[tuple[tuple[str, str], str | None]] = []
    key: tuple[str, str] | None = None
    legal: tuple[str, ...] = ()
    for message in trace.messages:
        seen = OBSERVE.search(message.text) if message.role == "user" else None
        if seen:
            if key is not None:
                out.append((key, None))  # never settled: cannot happen in a finished hand; kept as a forfeit
            key, legal = (history_of(seen.group(2)), seen.group(1)), (seen.group(3), seen.group(4))
        elif message.role == "assistant" and key is not None:
            chosen = read_move(message.text, legal)
            if chosen is not None:
                out.append((key, chosen))
                key = None
    if key is not None:
        out.append((key, None))
    return out


def sampled_policy(replies: Mapping[tuple[str, str], Sequence[str]], unnamed: float | None = None) -> ReadPolicy:
    """The policy from replies sampled at each information set, each read as the referee reads it (`read_move`):
    the bolder action's share of the replies that name a legal action; the legal mass is the share that do. (The
    referee asks again after a reply without one, so a seat forfeits less often than 1 - legal mass.) An
    information set none of whose replies names a legal action is an error, or reads as the bolder action's chance
    `unnamed` where given (its legal mass 0)."""
    strategy, legal = {}, {}
    for key in infosets():
        passive, bold = PASSIVE_BOLD[key[0]]
        moves = [read_move(reply, (passive, bold)) for reply in replies[key]]
        named = [move for move in moves if move is not None]
        if not named and unnamed is None:
            raise ValueError(f"information set {key}: none of its {len(moves)} replies names a legal action")
        strategy[key] = named.count(bold) / len(named) if named else float(unnamed or 0.0)
        legal[key] = len(named) / len(moves)
    return ReadPolicy(strategy, legal)
