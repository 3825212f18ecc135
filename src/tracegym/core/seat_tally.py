"""Seat tally: what one seat did over a set of episodes (its decided rewards, outcomes, model turns and the sums
of its counted metrics), the one source of the per-seat figures that eval summaries and training steps report.

A seat here is any set of (episode, member) pairs: one member across episodes, or the learner wherever it sat.

>>> from tracegym.core.task_data import TaskData
>>> hand = Episode(task=TaskData(prompt="deal"), members=["p0", "p1"], rewards={"p0": 1.0, "p1": None},
...                outcomes={"p0": Outcome.WIN})
>>> tally = SeatTally.of([(hand, "p0"), (hand, "p1")])
>>> tally.episodes, tally.rewards, tally.decided, tally.outcome_rates()[Outcome.WIN]
(2, [1.0], 1, 1.0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from tracegym.core.episode import Episode, Outcome

PARSE_ERRORS = "parse_errors"
"""Member metric: turns whose markup did not parse (kept, flagged, masked from training)."""
INVALID_MOVES = "invalid_moves"
"""Member metric: replies the referee refused as a move (the member was asked again)."""
FORFEITS = "forfeits"
"""Member metric: turns the member ran out of retries and forfeited."""
EPISODE_METRICS = (PARSE_ERRORS, INVALID_MOVES, FORFEITS)
"""The counts an episode keeps on every member's trace (and sums into the episode's metrics)."""


@dataclass(frozen=True)
class SeatTally:
    """One seat's counts over the (episode, member) pairs it sat in."""

    episodes: int = 0
    """(episode, member) pairs tallied."""
    rewards: list[float] = field(default_factory=list)
    """The decided rewards (None ones left out)."""
    outcomes: Counter[Outcome] = field(default_factory=Counter)
    """How many times each outcome was reached (episodes without one for the member left out)."""
    turns: int = 0
    """Model turns (sampled nodes of the member's traces)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Each of `EPISODE_METRICS` summed over the member's metrics."""

    @classmethod
    def of(cls, seats: Iterable[tuple[Episode, str]]) -> SeatTally:
        """The tally of member m in episode e, for every (e, m) in `seats`."""
        pairs = list(seats)
        rewards = [r for e, m in pairs if (r := e.rewards.get(m)) is not None]
        outcomes = Counter(o for e, m in pairs if (o := e.outcomes.get(m)) is not None)
        turns = sum(_turns(e, m) for e, m in pairs)
        metrics = {name: float(sum(e.member_metrics.get(m, {}).get(name) or 0 for e, m in pairs))
                   for name in EPISODE_METRICS}
        return cls(len(pairs), rewards, outcomes, turns, metrics)

    @property
    def decided(self) -> int:
        """Pairs with an outcome for the member."""
        return sum(self.outcomes.values())

    def outcome_rates(self, over: int | None = None) -> dict[Outcome, float]:
        """Each outcome's count divided by `over` (default: the decided pairs); empty when none was reached."""
        total = self.decided if over is None else over
        return {o: self.outcomes[o] / total for o in Outcome} if self.outcomes and total else {}

    def per_turn(self, metric: str) -> float:
        """`metric`'s sum per model turn (0 without turns)."""
        return self.metrics[metric] / self.turns if self.turns else 0.0

    def per_episode(self, metric: str) -> float:
        """`metric`'s sum per tallied pair (0 without any)."""
        return self.metrics[metric] / self.episodes if self.episodes else 0.0


def _turns(episode: Episode, member: str) -> int:
    trace = episode.traces.get(member)
    return sum(1 for n in trace.graph.nodes if n.sampled) if trace is not None else 0
