"""Kuhn poker: two players, a three-card deck (J < Q < K), one card each, one betting round; a worked example of
a multi-agent taskset.

Each player antes 1 chip. `player_0` acts first: `check` or `bet` (1 chip). After a check, `player_1` may check
(showdown) or bet, and then `player_0` must `call` or `fold`; after a bet, `player_1` must call or fold. At a
showdown the higher card takes the pot. The referee (this module's code) deals, tells each player only its own
card and the betting so far (`observe`), reads the last legal action word in a reply's public text (`move`;
anything in `<think>...</think>` is private), and asks again on an illegal reply: after `move_retries` retries
the player forfeits, which costs it what a fold would (the chips it put in; the other takes the pot). Reward:
`payoff`, the net chips a player won (+1 or +2 for a win, -1 or -2 for a loss or forfeit), so figures compare with
the game's known value: at a Nash equilibrium `player_0` wins -1/18 chips a hand. Metric: `won`.

Scripted players (a seat's `script`): `random` (a uniformly random legal action), `nash` (the equilibrium with
alpha = 1/3, `NASH`), `always-bet` (bets, or calls a bet) and `always-check` (checks, or folds to a bet).

How it is written, as a template for your own game: `KuhnPokerTask(MultiAgentTask[KuhnDeal])` lists its two
`seats`, yields whoever acts next from `schedule()` until `over`, keeps the game on the instance (one per episode),
ends it with `win()` and pays `payoff()` in chips; `KuhnPoker(Taskset[KuhnConfig])` deals seeded rows. Run it:
`tracegym eval kuhn-poker -n 200`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import cast

from pydantic import Field

from tracegym.core.episode import Outcome
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.multi_agent import InvalidMove, MultiAgentTask
from tracegym.envs.schedule import Member, Slot
from tracegym.envs.scorers import metric, reward
from tracegym.envs.taskset import Taskset, TasksetConfig

CARDS = ("J", "Q", "K")
RULES = (
    "We play Kuhn poker. The deck has three cards: J, Q and K (K is highest). Each player antes 1 chip and gets "
    "one card. Players act in turn: check or bet 1 chip; facing a bet, call or fold. The higher card wins the pot "
    "at showdown. Reply with exactly one action word: check, bet, call or fold."
)
SEATS = (Member(id="player_0", system_prompt=f"You are player_0. {RULES}"),
         Member(id="player_1", system_prompt=f"You are player_1. {RULES}"))
GAME_VALUE = Fraction(-1, 18)
"""`player_0`'s expected chips a hand when both play a Nash equilibrium."""
NASH: dict[tuple[str, str], Fraction] = {
    # (actions so far, card) -> chance of the bolder action: bet, or call a bet; alpha = 1/3
    ("", "J"): Fraction(1, 3), ("", "Q"): Fraction(0), ("", "K"): Fraction(1),
    ("check bet", "J"): Fraction(0), ("check bet", "Q"): Fraction(2, 3), ("check bet", "K"): Fraction(1),
    ("bet", "J"): Fraction(0), ("bet", "Q"): Fraction(1, 3), ("bet", "K"): Fraction(1),
    ("check", "J"): Fraction(1, 3), ("check", "Q"): Fraction(0), ("check", "K"): Fraction(1),
}
"""A Nash equilibrium of Kuhn poker (alpha = 1/3): per (actions so far, card), the chance of the bolder action."""


class KuhnConfig(TasksetConfig):
    """Options of kuhn-poker."""

    num_tasks: int = Field(default=1000, ge=1)
    """How many deals to generate."""


class KuhnDeal(TaskData):
    """One deal: each player's card."""

    cards: dict[str, str]


def read_move(text: str, legal: Sequence[str]) -> str | None:
    """The move the referee reads in a reply's public text: its last legal action word; None when it has none."""
    chosen = [word for word in re.findall(r"[a-z]+", text.lower()) if word in legal]
    return chosen[-1] if chosen else None


def nash(task: MultiAgentTask, member: str, rng: random.Random) -> str:
    """A Nash-equilibrium player (`NASH`)."""
    return bold_or_not(task, member, rng.random() < cast("KuhnPokerTask", task).bold_chance(member, NASH))


def always_bet(task: MultiAgentTask, member: str, rng: random.Random) -> str:
    """Bets, or calls a bet."""
    return bold_or_not(task, member, True)


def always_check(task: MultiAgentTask, member: str, rng: random.Random) -> str:
    """Checks, or folds to a bet."""
    return bold_or_not(task, member, False)


def bold_or_not(task: MultiAgentTask, member: str, bold: bool) -> str:
    """The bolder legal action (bet, call) or the other (check, fold)."""
    passive, aggressive = sorted(cast("KuhnPokerTask", task).legal(), key=("check", "fold", "bet", "call").index)
    return aggressive if bold else passive


class KuhnPokerTask(MultiAgentTask[KuhnDeal, KuhnConfig]):
    """One hand of Kuhn poker between `player_0` and `player_1`."""

    seats = SEATS
    public_outputs = False  # the referee narrates each action; a player's words beyond it are not the game
    move_retries = 2
    scripts = {"nash": nash, "always-bet": always_bet, "always-check": always_check}

    def __init__(self, data: KuhnDeal, **options: object) -> None:
        super().__init__(data, **options)
        self.history: list[tuple[str, str]] = []
        """(player, action) so far."""
        self.chips = {"player_0": 1, "player_1": 1}
        """Chips each player has put in the pot."""

    def schedule(self) -> Iterator[Slot]:
        """Whoever acts next, until the hand is over (at most three actions)."""
        order = ["player_0", "player_1", "player_0"]
        for player in order:
            if self.over:
                return
            yield Slot(player)

    def legal(self) -> list[str]:
        """The actions open to the player to act."""
        facing_bet = bool(self.history) and self.history[-1][1] == "bet"
        return ["call", "fold"] if facing_bet else ["check", "bet"]

    def legal_moves(self, member: str) -> Sequence[str]:
        return self.legal()

    def observe(self, member: str) -> str:
        done = "; ".join(f"{p} {a}s" for p, a in self.history) or "nobody has acted yet"
        return (f"Your card: {self.data.cards[member]}. So far: {done}. Your move: "
                f"{' or '.join(self.legal())}?")

    def move(self, member: str, text: str) -> str:
        legal = self.legal()
        chosen = read_move(text, legal)
        if chosen is None:
            raise InvalidMove(f"reply with one of: {', '.join(legal)}.")
        return chosen

    def act(self, member: str, move: str) -> None:
        self.history.append((member, move))
        if move in ("bet", "call"):
            self.chips[member] += 1
        actions = [a for _, a in self.history]
        other = next(m for m in self.members if m != member)
        if move == "fold":
            self.win(other)
        elif actions in (["check", "check"], ["bet", "call"], ["check", "bet", "call"]):
            cards = self.data.cards
            self.win(max(self.members, key=lambda m: CARDS.index(cards[m])))

    def payoff(self, member: str | None) -> float:
        """Net chips `member` won: the other's chips in the pot for a win, minus its own for a loss or a forfeit
        (a forfeit costs what a fold would), 0 for an unfinished hand."""
        outcome, mine = self.outcomes.get(str(member)), self.chips.get(str(member), 0)
        if outcome == Outcome.WIN:
            return float(sum(self.chips.values()) - mine)
        return -float(mine) if outcome in (Outcome.LOSS, Outcome.FORFEIT) else 0.0

    def bold_chance(self, member: str, strategy: dict[tuple[str, str], Fraction]) -> Fraction:
        """The chance `strategy` gives `member` of the bolder action now (bet, or call a bet)."""
        return strategy[(" ".join(a for _, a in self.history), self.data.cards[member])]

    @reward(name="payoff")
    def reward_payoff(self, trace: Trace) -> float:
        """Net chips won: +1 or +2 for a win, -1 or -2 for a loss or a forfeit, 0 for an unfinished hand."""
        return self.payoff(trace.member)

    @metric
    def won(self, trace: Trace) -> float:
        return float(self.outcomes.get(str(trace.member)) == Outcome.WIN)


def deal(rng: random.Random, cfg: KuhnConfig, index: int) -> KuhnDeal:
    """Two distinct cards, one per player."""
    first, second = rng.sample(CARDS, 2)
    return KuhnDeal(id=f"kuhn-{cfg.seed}-{index}", prompt="A new hand begins.", cards={"player_0": first,
                                                                                       "player_1": second})


class KuhnPoker(Taskset[KuhnConfig]):
    """Kuhn poker self-play (two seats); reward: net chips won (a forfeit loses what a fold would)."""

    id = "kuhn-poker"
    description = "Two-player Kuhn poker (J/Q/K, one betting round); reward: net chips won (+-1 or +-2)."
    task_class = KuhnPokerTask
    row_maker = deal
