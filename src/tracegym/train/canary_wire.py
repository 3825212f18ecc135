"""Canary wire: `tracegym validate`'s checks (the gold agent passes, the no-op agent earns nothing) re-run on a few
training tasks during an RL run, through the run's own env servers; a task whose checks held at the first run and
fail now fires the tripwire `canary`.

The policy's reward comes from the same servers, sandboxes and judges as the canaries', so a task that starts paying
an empty reply (or stops paying its gold answer) mid-run says the reward itself changed under the run: a grader the
policy can write to, state leaking from one rollout into the next, a judge that drifts. The first run (before step
0's batch) is the baseline: a task whose checks fail already then is a taskset problem, said once (run `tracegym
validate`) and not watched. Single-agent environments only (a canary agent plays a rollout, not a seat)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.canary import GOLD, NOOP, CanaryAgent
from tracegym.models.endpoint import Endpoint
from tracegym.serve.env_client import EnvClient
from tracegym.train.tripwire import Trip


@dataclass(frozen=True)
class CanaryEnv:
    """A training environment the canaries run on: its id, its env server and the tasks they check there."""

    id: str
    client: EnvClient
    rows: list[TaskData]


@dataclass(frozen=True)
class CanaryCheck:
    """One task's two canary rollouts, by their rewards (None: no gold reply, a failed rollout or no reward)."""

    env: str
    key: str
    gold: float | None
    noop: float | None
    has_gold: bool

    def gold_fails(self, pass_threshold: float) -> bool:
        return self.has_gold and (self.gold is None or self.gold < pass_threshold)

    def noop_pays(self, noop_max: float) -> bool:
        return self.noop is not None and self.noop > noop_max


class CanaryWire:
    """The canary checks of one run: every `every` steps (0: off) on the first `tasks` tasks of each environment,
    judged as `tracegym validate` judges them (`pass_threshold`, `noop_max`)."""

    def __init__(self, envs: list[CanaryEnv], every: int, *, pass_threshold: float = 1.0,
                 noop_max: float = 0.0) -> None:
        self.envs, self.every = envs, every
        self.pass_threshold, self.noop_max = pass_threshold, noop_max
        self.baseline: dict[tuple[str, str], CanaryCheck] | None = None

    def due(self, step: int) -> bool:
        """Whether the canaries run at `step` (the baseline runs at the first step the run makes)."""
        return bool(self.every and self.envs) and (self.baseline is None or step % self.every == 0)

    async def check(self, step: int, endpoint: Endpoint) -> list[Trip]:
        """Run the canaries (the baseline the first time) and the trips of tasks whose checks no longer hold."""
        checks = [c for env in self.envs for c in await run_canaries(env, endpoint)]
        if self.baseline is None:
            self.baseline = {(c.env, c.key): c for c in checks}
            self._say_baseline(checks)
            return []
        return self.trips(step, checks)

    def trips(self, step: int, checks: list[CanaryCheck]) -> list[Trip]:
        """A trip per task whose gold passed (or whose no-op earned nothing) at the baseline and does not now."""
        assert self.baseline is not None
        out = []
        for c in checks:
            before = self.baseline.get((c.env, c.key))
            if before is None:
                continue
            if c.gold_fails(self.pass_threshold) and not before.gold_fails(self.pass_threshold):
                out.append(Trip("canary", step, f"{c.env} task {c.key}: the gold reply now earns {_said(c.gold)} "
                                                f"(it earned {_said(before.gold)}; pass threshold "
                                                f"{self.pass_threshold:g})"))
            if c.noop_pays(self.noop_max) and not before.noop_pays(self.noop_max):
                out.append(Trip("canary", step, f"{c.env} task {c.key}: an empty reply now earns {_said(c.noop)} "
                                                f"(it earned {_said(before.noop)}; at most {self.noop_max:g})"))
        return out

    def _say_baseline(self, checks: list[CanaryCheck]) -> None:
        bad = [c for c in checks if c.gold_fails(self.pass_threshold) or c.noop_pays(self.noop_max)]
        line = f"tracegym rl: canary baseline: {len(checks)} tasks checked"
        if bad:
            line += (f"; {len(bad)} fail already and are not watched (run `tracegym validate` on "
                     f"{', '.join(sorted({c.env for c in bad}))})")
        print(line, file=sys.stderr)


async def run_canaries(env: CanaryEnv, endpoint: Endpoint) -> list[CanaryCheck]:
    """Both canary agents on each of the environment's canary tasks, on its env server, all at once."""

    async def agent(row: TaskData, name: CanaryAgent) -> Trace | None:
        try:
            traces = await env.client.run(row, endpoint, agent=name, group=False, infra_retries=0)
        except Exception as exc:  # the server did not answer: this check says nothing this time (never a trip)
            print(f"tracegym rl: canary {name} on {env.id} task {row.key} not run: {exc}", file=sys.stderr)
            return None
        return traces[0] if traces else None

    async def one(row: TaskData) -> CanaryCheck:
        gold, noop = await asyncio.gather(agent(row, GOLD), agent(row, NOOP))
        return CanaryCheck(env.id, row.key, _reward(gold), _reward(noop), gold is not None)

    return list(await asyncio.gather(*(one(row) for row in env.rows)))


def _reward(trace: Trace | None) -> float | None:
    return None if trace is None or trace.failure is not None else trace.reward


def _said(reward: float | None) -> str:
    return "nothing (failed or unscored)" if reward is None else f"{reward:g}"
