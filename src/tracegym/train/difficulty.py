"""Online difficulty: which tasks of an environment are worth a group now, judged by each task's recent pass rate
per seat, and extra tasks in place of a step's groups that carry no signal.

A task's pass rate is, per seat, the mean of its last `window` groups' passes: a rollout's reward (the share that
passed, with 0/1 rewards), a game seat's wins (1 a win, 0.5 a draw, 0 a loss or forfeit: the orchestrator's
`group_passes`). A game is judged per seat because a zero-sum game's payoffs average to 0 over its seats whatever
happens, so a group's mean payoff would call every task too hard. A seat at or below `low` finds the task too hard,
at or above `high` too easy: neither teaches (every rollout of that seat scores the same). A task is in the band
when one of its seats is; out of it when every seat is: `too_easy` or `too_hard` when all agree, `decided` when some
seats always win and others always lose (a deal whose result never changes). Drawing walks the environment's task
stream as before, but a task the stream comes to that is out of the band is taken only with probability
`out_of_band_weight` (so it is re-checked now and then: the group it gets renews its pass rate) and otherwise passed
over for the next one. Unseen tasks are always taken, so an endless taskset is filtered by what has been seen of
it. After a step's groups ran, each one's passes update its task's pass rates, and while the step has fewer than
`tasks_per_step` groups with signal (some seat's rewards not all equal: advantages compare a seat with itself),
each group without signal is replaced by the next task of its environment, up to `refills` extra tasks per
environment and step (SkyRL's and DAPO's dynamic sampling, bounded).

>>> d = TaskDifficulty(DifficultyConfig(), seed=0)
>>> d.observe("7", [1.0, 1.0, 1.0]); d.verdict("7"), d.verdict("8")
('too_easy', 'unseen')
>>> d.observe("9", {"player_0": [1.0, 1.0], "player_1": [0.0, 0.0]}); d.verdict("9")
'decided'
>>> d.draw(iter([TaskData(prompt="easy", id="7"), TaskData(prompt="new", id="8")]).__next__).key
'8'
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracegym.core.episode import SOLO
from tracegym.core.errors import UsageError
from tracegym.core.task_data import TaskData
from tracegym.train.advantages import has_signal

Verdict = Literal["unseen", "in_band", "too_easy", "too_hard", "decided"]
SeatVerdict = Literal["in_band", "too_easy", "too_hard"]
G = TypeVar("G")
"""A group: whatever the orchestrator runs per task (its episodes)."""
BySeat = Mapping[str, Sequence[float]] | Sequence[float]
"""A group's values per seat (member id); a plain sequence is one seat's (a single-agent task's, `SOLO`)."""


def by_seat(values: BySeat) -> dict[str, list[float]]:
    """`values` per seat, a plain sequence as the one seat `SOLO`'s."""
    if isinstance(values, Mapping):
        return {seat: list(v) for seat, v in values.items()}
    return {SOLO: list(values)}


class DifficultyConfig(BaseModel):
    """Online difficulty of one training environment (`difficulty = { ... }` on its `[[orchestrator.train.envs]]`
    entry; `difficulty = {}` takes every default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    low: float = 0.0
    """A seat whose recent pass rate on a task (mean reward; a game's: win rate) is at or below this finds it too
    hard."""
    high: float = 1.0
    """A seat whose recent pass rate on a task is at or above this finds it too easy."""
    window: int = Field(default=2, gt=0)
    """How many of a task's most recent groups its pass rates are the means of."""
    out_of_band_weight: float = Field(default=0.1, gt=0.0, le=1.0)
    """Chance that a too-easy or too-hard task the stream comes to is drawn anyway (a re-check); else it is passed
    over. Relative to an in-band or unseen task, which is always drawn."""
    max_skips: int = Field(default=64, ge=0)
    """Most tasks passed over for one draw (an environment whose every task is out of band is still drawn from)."""
    refills: int = Field(default=0, ge=0)
    """Per step, most extra tasks drawn from this environment in place of its groups without signal (all rewards
    equal) while the step has fewer than `tasks_per_step` groups with signal; 0: no refills."""
    capacity: int = Field(default=100_000, gt=0)
    """Most tasks whose pass rates are kept (the least recently seen forgotten first), which bounds the state of
    an endless taskset."""

    @model_validator(mode="after")
    def _band(self) -> DifficultyConfig:
        if self.low >= self.high:
            raise ValueError(f"difficulty: low ({self.low}) must be below high ({self.high})")
        return self


class TaskDifficulty:
    """One environment's online difficulty: its tasks' recent pass rates per seat, the draws they steer, and this
    step's counts (tasks passed over, refills, groups without signal)."""

    def __init__(self, config: DifficultyConfig, seed: int) -> None:
        self.config = config
        self.rng = random.Random(seed)
        """Decides which out-of-band tasks are re-checked (its own, so turning difficulty on leaves the
        orchestrator's draws alone)."""
        self.rates: OrderedDict[str, dict[str, list[float]]] = OrderedDict()
        """Task key -> seat -> mean passes of its last `window` groups, oldest first; least recently seen task
        first."""
        self.step = Counter[str]()
        """This step's counts: `skipped`, `refills`, `no_signal`."""

    def verdict(self, key: str) -> Verdict:
        """Where a task stands: unseen, in the band (for some seat), or out of it for every seat: too easy, too
        hard, or decided (some seats always win, others always lose)."""
        seats = {self.seat_verdict(means) for means in self.rates.get(key, {}).values() if means}
        if not seats:
            return "unseen"
        if "in_band" in seats:
            return "in_band"
        return seats.pop() if len(seats) == 1 else "decided"

    def seat_verdict(self, means: list[float]) -> SeatVerdict:
        """Where a task stands for one seat whose recent mean passes are `means`."""
        rate = sum(means) / len(means)
        if rate >= self.config.high:
            return "too_easy"
        return "too_hard" if rate <= self.config.low else "in_band"

    def draw(self, next_task: Callable[[], TaskData]) -> TaskData:
        """The next task of the stream worth a group: out-of-band ones are passed over (and counted) unless the
        rng re-checks them, at most `max_skips` in a row."""
        for _ in range(self.config.max_skips):
            data = next_task()
            if self.verdict(data.key) in ("unseen", "in_band") or self.rng.random() < self.config.out_of_band_weight:
                return data
            self.step["skipped"] += 1
        return next_task()

    def observe(self, key: str, passes: BySeat) -> None:
        """A group of task `key` scored `passes` per seat (its trainable rollouts'; a seat with none: nothing
        learnt about it)."""
        seen = {seat: values for seat, values in by_seat(passes).items() if values}
        if not seen:
            return
        rates = self.rates.pop(key, {})
        for seat, values in seen.items():
            rates[seat] = [*rates.get(seat, []), sum(values) / len(values)][-self.config.window:]
        self.rates[key] = rates  # now the most recently seen
        while len(self.rates) > self.config.capacity:
            self.rates.popitem(last=False)

    def metrics(self) -> dict[str, int]:
        """The tasks known in and out of the band, and this step's counts (which start again from zero)."""
        verdicts = Counter(self.verdict(key) for key in self.rates)
        counts = {"in_band": verdicts["in_band"], "too_easy": verdicts["too_easy"],
                  "too_hard": verdicts["too_hard"], "decided": verdicts["decided"],
                  **{k: self.step[k] for k in ("skipped", "refills", "no_signal")}}
        self.step.clear()
        return counts

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss],
                "rates": [[k, {seat: list(m) for seat, m in v.items()}] for k, v in self.rates.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state `state_dict` saved; a checkpoint from before rates were kept per seat holds one list per task:
        its group means, taken as one seat's."""
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.rates = OrderedDict((str(k), {seat: [float(m) for m in means][-self.config.window:]
                                           for seat, means in by_seat(v).items()}) for k, v in state["rates"])


class OnlineDifficulty(Generic[G]):
    """The run's online difficulty: one TaskDifficulty per environment that has it (none: every method leaves the
    step as it was). `rewards(group)` gives a group's trainable rewards per seat (what its advantages compare),
    `key(group)` its task key and `passes(group)` its passes per seat (default: its rewards)."""

    def __init__(self, envs: dict[str, TaskDifficulty], rewards: Callable[[G], BySeat], key: Callable[[G], str],
                 passes: Callable[[G], BySeat] | None = None) -> None:
        self.envs, self.rewards, self.key = envs, rewards, key
        self.passes = passes or rewards

    def draw(self, env_id: str, next_task: Callable[[], TaskData]) -> TaskData:
        """The next task of environment `env_id` worth a group."""
        env = self.envs.get(env_id)
        return env.draw(next_task) if env else next_task()

    def signal(self, group: G) -> bool:
        """Whether some seat's rewards in the group differ (advantages compare each seat with itself)."""
        return any(has_signal(rewards) for rewards in by_seat(self.rewards(group)).values())

    async def complete(self, groups: list[G], env_ids: list[str], wanted: int,
                       run: Callable[[list[str]], Awaitable[list[G]]]) -> tuple[list[G], list[str]]:
        """The step's groups (`groups[i]` drawn from `env_ids[i]`), with the extra ones run in place of those
        without signal until `wanted` have signal or the environments' `refills` are spent, and the environment of
        each; every group updates its task's pass rates. `run(ids)` draws the next task of each environment in
        `ids` and runs its group."""
        groups, env_ids = list(groups), list(env_ids)
        latest = list(zip(env_ids, groups, strict=True))
        while latest:
            self.observe(latest)
            again = self.refill_envs(latest, wanted - sum(map(self.signal, groups)))
            more = await run(again) if again else []
            groups, env_ids = groups + more, env_ids + again
            latest = list(zip(again, more, strict=True))
        return groups, env_ids

    def observe(self, pairs: list[tuple[str, G]]) -> None:
        for env_id, group in pairs:
            if (env := self.envs.get(env_id)) is not None:
                env.observe(self.key(group), self.passes(group))
                env.step["no_signal"] += not self.signal(group)

    def refill_envs(self, latest: list[tuple[str, G]], short: int) -> list[str]:
        """The environments to draw one more task from, one per group of `latest` without signal, while the step is
        `short` of groups with signal and the environment has refills left this step."""
        again: list[str] = []
        for env_id, group in latest:
            env = self.envs.get(env_id)
            if len(again) < short and env and not self.signal(group) and env.step["refills"] < env.config.refills:
                env.step["refills"] += 1
                again.append(env_id)
        return again

    def metrics(self) -> dict[str, int]:
        """`difficulty/<env>/<count>` for each environment: tasks in band, too easy, too hard, decided; this step's
        tasks passed over, refills and groups without signal."""
        return {f"difficulty/{env_id}/{name}": n for env_id, env in self.envs.items()
                for name, n in env.metrics().items()}

    def state_dict(self) -> dict[str, Any]:
        return {env_id: env.state_dict() for env_id, env in self.envs.items()}

    def load_state_dict(self, state: dict[str, Any], took_part: Sequence[str]) -> None:
        """The pass rates of each environment that has online difficulty; one that drew tasks before the
        checkpoint (`took_part`) but has no state in it (difficulty was off then) is an error: a silent cold start
        would change the run."""
        for env_id, env in self.envs.items():
            if env_id in state:
                env.load_state_dict(state[env_id])
            elif env_id in took_part:
                raise UsageError(f"the checkpoint holds no online difficulty state of environment {env_id!r} (its "
                                 "`difficulty` was off then); resume without it, or start a new run")
