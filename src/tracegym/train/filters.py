"""Filters: checks on a scored rollout's sampled tokens (gibberish, repetition) that count what they catch
(`detect`) or also keep it out of training (`enforce`), as prime-rl's rollout filters do.

A filter reads the exact tokens and logprobs on the trace's model turns (never re-tokenized text), one turn at a
time: a turn whose tokens or logprobs the client did not return has nothing to check. Every configured filter
checks every rollout, so each rate is its own (prime-rl stops at the first filter that catches a rollout). A
caught rollout is marked on its trace (`metrics["filter/<name>"] = 1.0`, and `metrics["filter/dropped"] = 1.0`
when an enforcing filter caught it): it is still written to `traces/step-N.jsonl`, scored, and its reward still
counts in its group's advantage statistics (as prime-rl keeps it for the baseline); only its samples are not
trained. In an episode, a filter checks each trainable member's own trace, and enforcing drops that member's
unit alone: the other members keep theirs (their payoff is what the game against that play was worth).

>>> from tracegym.testing.traces import make_trace
>>> trace = make_trace()  # no tokens: nothing to check
>>> screening = screen([Gibberish(mode="enforce")], [("reverse-text", trace)])
>>> screening.metrics()["filters/reverse-text/gibberish"], screening.dropped
(0.0, set())
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.trace import Trace

Mode = Literal["off", "detect", "enforce"]
"""`detect`: count what the filter catches; `enforce`: also leave it out of training; `off`: do not run it."""

ALL = "all"
"""The environment name of the rates over every environment (`filters/all/<filter>`)."""
DROPPED = "dropped"
"""The rate (`filters/<env>/dropped`) and trace mark (`filter/dropped`) of rollouts an enforcing filter caught."""
CHECKED = "checked"
"""The count of rollouts each environment's rates are over (`filters/<env>/checked`)."""


def turns(trace: Trace) -> Iterator[tuple[list[int], list[float] | None]]:
    """Each model turn's sampled token ids with their logprobs (None where the client returned none); turns
    without token ids are left out."""
    for node in trace.graph.nodes:
        if not node.sampled or not node.token_ids or node.mask is None:
            continue
        logprobs = None if node.logprobs is None else list(compress(node.logprobs, node.mask))
        yield list(compress(node.token_ids, node.mask)), logprobs


class Gibberish(BaseModel):
    """Catches a rollout with a run of `run` consecutive sampled tokens each less likely than `logprob_below`
    (and, optionally, rare: id at least `min_token_id`): what a policy emits when it starts to produce garbage."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: ClassVar[str] = "gibberish"
    mode: Mode = "detect"
    """`detect` (counted), `enforce` (counted and left out of training) or `off`."""
    logprob_below: float = -12.8
    """A sampled token with a lower logprob is unlikely. -12.8 = -ln(49152) - 2: e^2 times less likely than a
    uniform draw over SmolLM2's vocabulary, prime-rl's rule (`-ln(vocab) - logprob_offset`, offset 2); for a
    152k vocabulary (Qwen) that is -13.9."""
    min_token_id: int = Field(default=0, ge=0)
    """Only tokens with at least this id count (prime-rl: above 100000, the late, rare BPE merges of a 152k
    vocabulary); 0: any token."""
    run: int = Field(default=1, ge=1)
    """Consecutive unlikely tokens in one turn that make a catch (1, prime-rl's: any one)."""

    def catches(self, trace: Trace) -> bool:
        """True when some turn has the run (logprobs are those vLLM sampled from)."""
        for ids, logprobs in turns(trace):
            if not logprobs or min(logprobs) >= self.logprob_below:  # the usual case, decided in C
                continue
            streak = 0
            for token, logprob in zip(ids, logprobs, strict=True):
                streak = streak + 1 if logprob < self.logprob_below and token >= self.min_token_id else 0
                if streak >= self.run:
                    return True
        return False


class Repetition(BaseModel):
    """Catches a rollout stuck in a loop: in one turn, a unit of at most `max_period` tokens repeated back to
    back at least `min_repeats` times over at least `min_tokens` tokens (`the the the ...`, a sentence again
    and again), wherever it starts (a loop usually runs to the end of the turn)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: ClassVar[str] = "repetition"
    mode: Mode = "detect"
    """`detect` (counted), `enforce` (counted and left out of training) or `off`."""
    max_period: int = Field(default=50, ge=1)
    """The longest repeated unit looked for, in tokens."""
    min_repeats: int = Field(default=4, ge=2)
    """How many times in a row the unit must appear."""
    min_tokens: int = Field(default=12, ge=1)
    """How many tokens the repeated stretch must cover (so `0000` in a number is not a loop)."""

    def catches(self, trace: Trace) -> bool:
        """True when some turn holds such a loop."""
        return any(self.loop_length(ids) >= 0 for ids, _ in turns(trace))

    def loop_length(self, ids: Sequence[int]) -> int:
        """The length of the first loop in `ids` (the shortest period first), end to end; -1: none.

        A loop of period p is a run of at least `need` positions i with ids[i] == ids[i - p]. Every such run
        holds a position of `anchors` (one in every `need`), so only those are compared, and a run is measured
        only from one that matches: ~1.6 comparisons per token over all periods (defaults), not 50."""
        n = len(ids)
        for period in range(1, min(self.max_period, n // self.min_repeats) + 1):
            need = max(self.min_tokens, period * self.min_repeats) - period
            for anchor in range(period + need - 1, n, need):
                if ids[anchor] != ids[anchor - period]:
                    continue
                start, end = anchor, anchor + 1
                while start > period and ids[start - 1] == ids[start - 1 - period]:
                    start -= 1
                while end < n and ids[end] == ids[end - period]:
                    end += 1
                if end - start >= need:
                    return end - start + period
        return -1


RolloutFilter = Gibberish | Repetition


class Filters(BaseModel):
    """The rollout filters of a run, one section each (`[orchestrator.filters.gibberish] mode = "enforce"`); by
    default both run, counting only (as prime-rl registers its filters)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gibberish: Gibberish = Gibberish()
    repetition: Repetition = Repetition()

    def active(self) -> list[RolloutFilter]:
        """The filters that run (mode not `off`)."""
        return [f for f in (self.gibberish, self.repetition) if f.mode != "off"]


@dataclass
class Screening:
    """What the filters made of one step's rollouts: per environment, how many were checked, caught by each
    filter and dropped; and the ids of the dropped traces."""

    names: list[str]
    checked: Counter[str] = field(default_factory=Counter)
    caught: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(environment, filter name) -> rollouts caught."""
    dropped: set[str] = field(default_factory=set)
    """Ids of the traces an enforcing filter caught: left out of training."""
    dropped_per_env: Counter[str] = field(default_factory=Counter)

    def keeps(self, trace: Trace) -> bool:
        """False for a trace an enforcing filter caught."""
        return trace.id not in self.dropped

    def metrics(self) -> dict[str, Any]:
        """`filters/<env>/<filter>` and `filters/all/<filter>`: the share of rollouts each filter caught;
        `filters/<env>/dropped`: the share left out of training; `filters/<env>/checked`: how many were checked;
        `rollouts_filtered`: how many were left out, in all."""
        out: dict[str, Any] = {"rollouts_filtered": len(self.dropped)}
        if not self.names:
            return out
        envs = sorted(self.checked)
        for env in [*envs, ALL]:
            checked = self.checked.total() if env == ALL else self.checked[env]
            counts = {name: self._count(env, name) for name in self.names}
            counts[DROPPED] = len(self.dropped) if env == ALL else self.dropped_per_env[env]
            out.update({f"filters/{env}/{name}": n / checked if checked else 0.0 for name, n in counts.items()})
            out[f"filters/{env}/{CHECKED}"] = checked
        return out

    def _count(self, env: str, name: str) -> int:
        return sum(n for (e, f), n in self.caught.items() if f == name and env in (e, ALL))


def screen(filters: Sequence[RolloutFilter], traces: Iterable[tuple[str, Trace]]) -> Screening:
    """Run every filter on every (environment, trace), mark the caught traces and tally per environment."""
    screening = Screening([f.name for f in filters])
    for env, trace in traces:
        screening.checked[env] += 1
        caught = [f for f in filters if f.catches(trace)]
        for f in caught:
            screening.caught[env, f.name] += 1
            trace.metrics[f"filter/{f.name}"] = 1.0
        if any(f.mode == "enforce" for f in caught):
            screening.dropped.add(trace.id)
            screening.dropped_per_env[env] += 1
            trace.metrics[f"filter/{DROPPED}"] = 1.0
    return screening


def drops_by_env(records: Iterable[dict[str, Any]]) -> str:
    """What enforcing filters left out, per environment, summed over steps' (or attempts') metrics, e.g.
    `reverse-text: 16 of 16, caught by gibberish 16 and repetition 3`; '' when they left nothing out."""
    checked, counts = Counter[str](), Counter[tuple[str, str]]()
    for record in records:
        for key, value in record.items():
            env, _, name = key.removeprefix("filters/").rpartition("/")  # an env id may hold '/'
            if not key.startswith("filters/") or env == ALL:
                continue
            if name == CHECKED:
                checked[env] += value
            else:  # a rate: back to a count
                counts[env, name] += round(value * record[f"filters/{env}/{CHECKED}"])
    parts = []
    for env in sorted(checked):
        if counts[env, DROPPED]:
            caught = " and ".join(f"{name} {n}" for (e, name), n in sorted(counts.items())
                                  if e == env and name != DROPPED)
            parts.append(f"{env}: {counts[env, DROPPED]} of {checked[env]}, caught by {caught}")
    return "; ".join(parts)
