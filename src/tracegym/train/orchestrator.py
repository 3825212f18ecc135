"""Orchestrator: turns rollouts into training batches, one step at a time, never too far ahead of the trainer.

Per step: wait until the trainer's policy is recent enough (`max_async_steps`), draw `tasks_per_step` tasks from
the environments by weight, run a group of `group_size` episodes per task through the env servers against the
currently served policy (a single-agent environment's episodes are its rollouts, `Episode.solo`), compute
advantages per group over the trainable members' traces that ended on the model's own output (a rollout that failed
outside the model, `Trace.failure`, is left out of its group's statistics and of training, and counted by reason),
drop groups with no signal, run the rollout filters (`filters`: an enforcing one keeps
what it catches out of training), turn every branch into training samples stamped with the oldest policy version
that sampled them, drop samples older than `max_async_steps`, and hand the batch to the trainer (a batch left
empty is made again with new tasks, `batch_attempts` times at most, then the run stops saying why: `regeneration`)
with the orchestrator's state (the trainer checkpoints that state with its own, so a resume restores
both from one place). Held-out environments are evaluated before the first step, every `eval.every` steps and
after the last, each time on the policy trained on that many steps (waited for: an asynchronous run pauses there).
Metrics go to the run folder's `metrics.jsonl` (and the trackers `[tracking]` turns on), the step's episodes
to its episode log (`traces/step-N.jsonl`, `episodes/step-N.jsonl`), a held-out evaluation's to `evals/<env>/`.
An environment with online difficulty (`difficulty.py`) passes over tasks outside its pass-rate band when drawing,
and refills the step's groups without signal. Each group is kept in the run folder as it finishes, so a resume
after a kill mid-step runs only the others (`rl_folder.FinishedGroups`, counted as `groups_kept`).

`build_orchestrator` makes one from the `[orchestrator]` section and the parts the orchestrator process
built (`roles.orchestrator_for`: the policy's endpoint, the signal); the class takes only its parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tracegym.core.episode import Episode, Outcome
from tracegym.core.errors import InfrastructureError, UsageError
from tracegym.core.interval import mean_ci
from tracegym.core.sample import Sample
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.seats import Seats
from tracegym.models.endpoint import Endpoint
from tracegym.runtimes.watchdog import Stage, beat, watch
from tracegym.serve.env_client import EnvClient, ask, describe
from tracegym.serve.served_taskset import ServedTaskset
from tracegym.train.canary_wire import CanaryEnv, CanaryWire
from tracegym.train.difficulty import OnlineDifficulty, TaskDifficulty
from tracegym.train.fan_out import unfit
from tracegym.train.filters import RolloutFilter, screen
from tracegym.train.opponent_pool import OpponentPool, lora_loader
from tracegym.train.regeneration import regenerated
from tracegym.train.rl_config import EnvChoice, OrchestratorConfig, env_server_key
from tracegym.train.rl_folder import ENDPOINTS, Endpoints, FinishedGroups, Poll, RLFolder
from tracegym.train.seating import Play, Seating
from tracegym.train.signal import Group, Signal, StepGroups, learner_traces
from tracegym.train.staleness import StalenessControl
from tracegym.train.task_stream import TaskStream
from tracegym.train.tripwire import PAUSED, Trip, TripwireConfig, Tripwires, TripwireStop

POLICY_WAIT_S = 3600.0
T = TypeVar("T")
Request = tuple[list[int], Seats | None]
"""One env-server request of a group: its episode indices, and the seats they are played with (None: every member
plays the policy)."""


@dataclass
class TrainEnv:
    """One environment the policy trains on: its share of each step's tasks, what its env server serves, its tasks,
    that server, and for a multi-agent one who sits where in each episode."""

    id: str
    weight: float
    served: ServedTaskset
    stream: TaskStream
    client: EnvClient
    seating: Seating | None = None


@dataclass
class HeldOutEnv:
    """One held-out environment: what its env server serves, the tasks evaluated, that server, and its seating
    (multi-agent)."""

    id: str
    served: ServedTaskset
    rows: list[TaskData]
    client: EnvClient
    seating: Seating | None = None


@dataclass(frozen=True)
class HeldOut:
    """Held-out evaluation of the first `num_tasks` tasks of each environment: before the first step, every
    `every` steps (0: none in between) and after the last."""

    envs: list[HeldOutEnv]
    sampling: Sampling
    num_tasks: int = 32
    every: int = 0


@dataclass(frozen=True)
class StepPlan:
    """How many steps the run has, and what one step runs."""

    steps: int
    tasks_per_step: int
    group_size: int
    concurrency: int
    """Rollouts in flight at once."""
    batch_attempts: int = 1
    """Attempts at a step's batch before an empty one stops the run (`regeneration`)."""
    sampling: Sampling = field(default_factory=Sampling)
    """Sampling of the training rollouts."""
    seed: int = 0
    """Seed of the environment draw (and of held-out opponents)."""


class Orchestrator:
    """Runs the steps of one RL run; `run()` until `plan.steps` batches are handed over. Every mode runs alike:
    what a step's groups are trained as is the `signal`'s business."""

    def __init__(self, folder: RLFolder, endpoint: Endpoint, envs: list[TrainEnv], signal: Signal,
                 staleness: StalenessControl, plan: StepPlan, *, held_out: HeldOut | None = None,
                 filters: list[RolloutFilter] | None = None, difficulty: OnlineDifficulty[Group] | None = None,
                 pool: OpponentPool | None = None, tripwires: Tripwires | None = None,
                 canary: CanaryWire | None = None) -> None:
        """`endpoint` serves the base model (policy version 0); each step asks it for the policy served then.
        `signal`: what the step's groups become (`train.signal`: rl, sft or opd); `filters`: the rollout filters
        that run on each trainable rollout; `difficulty`: online difficulty of the environments that have it;
        `pool`: the run's past policies, for seats whose opponent comes from it; `tripwires`: the online signs of
        a reward hack watched on each step's trainable rollouts (`train.tripwire`); `canary`: the tripwire that re-runs
        the gold and no-op checks on a few training tasks (`train.canary_wire`)."""
        self.folder, self.endpoint, self.signal, self.plan = folder, endpoint, signal, plan
        self.envs = {env.id: env for env in envs}
        self.staleness, self.pool = staleness, pool
        self.held_out = held_out or HeldOut(envs=[], sampling=plan.sampling)
        self.rng = random.Random(plan.seed)
        self.filters = filters or []
        self.difficulty = difficulty or OnlineDifficulty({}, group_rewards, group_key, group_passes)
        self.tripwires = tripwires or Tripwires(TripwireConfig(enabled=False))
        self.canary = canary
        self.next_step = 0
        """The step whose batch comes next."""

    # --- the loop ----------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Every step from `next_step`, with held-out evaluations; closes the env clients at the end."""
        try:
            print(f"tracegym rl: {self.tripwires.armed_line()}", file=sys.stderr)
            if self.next_step == 0:
                await self.evaluate(0)
            while self.next_step < self.plan.steps:
                await self.step(self.next_step)
            await self.evaluate(self.plan.steps, wait=True)
        finally:
            with watch(Stage.SHUTDOWN, "closing the env clients"):
                await self.aclose()

    async def step(self, step: int) -> None:
        """Make and hand over the batch of `step` once the trainer's policy allows it; evaluate when it is time."""
        version, model = await self.policy_when(lambda v: self.staleness.may_start(step, v),
                                                f"a policy fresh enough for step {step}")
        self.hand_over(step, *await self.make_batch(step, version, model))
        every = self.held_out.every
        if every and self.next_step % every == 0 and self.next_step < self.plan.steps:
            await self.evaluate(self.next_step)

    async def make_batch(self, step: int, version: int, model: str) -> tuple[list[Sample], dict[str, Any]]:
        """The step's samples and metrics, from new tasks again while they come out empty (`regeneration`); each
        empty attempt's metrics go to `metrics.jsonl` as `{"empty_batch": step, "attempt": n, ...}`."""
        return await regenerated(
            lambda attempt: self.collect(step, version, model, attempt), self.plan.batch_attempts,
            self.signal.why_empty,
            lambda attempt, metrics: self.folder.metrics.append({"empty_batch": step, "attempt": attempt, **metrics}),
            what=f"step {step}")

    def hand_over(self, step: int, samples: list[Sample], metrics: dict[str, Any]) -> None:
        """Write the batch of `step` with the state a resume after it needs (the trainer checkpoints that state
        with its own), and log its metrics."""
        self.next_step = step + 1
        self.folder.write_batch(step, samples, metrics, state=self.state_dict())
        self.folder.metrics.append({"step": step, **metrics})
        self.folder.forget_finished(step)
        self.folder.mirror_trainer()

    async def policy_when(self, accept: Callable[[int], bool], what: str) -> tuple[int, str]:
        """The served policy (version, model name to request) once `accept(version)`; until then the trainer
        has not published it, and this waits without blocking the loop."""

        def accepted() -> tuple[int, str] | None:
            version, model = self.folder.policy(self.endpoint.model)
            return (version, model) if accept(version) else None

        return await Poll(what, POLICY_WAIT_S).wait_async(accepted)

    async def collect(self, step: int, version: int, model: str, attempt: int = 0,
                      ) -> tuple[list[Sample], dict[str, Any]]:
        """The samples of one step and its metrics; the traces of a later `attempt` join the step's earlier ones."""
        started = time.monotonic()
        finished = self.folder.finished_groups(step)
        groups, env_ids = await self.run_groups(self.signal.rollout_endpoint(
            self.endpoint.model_copy(update={"model": model})), model, finished, attempt)
        trained = [learner_traces(g) for g in groups]
        check_not_all_failed(step, trained, [e for g in groups for e in g])
        screening = screen(self.filters, ((env_id, t) for env_id, traces in zip(env_ids, trained, strict=True)
                                          for t in traces if trainable(t)))
        samples, signal_metrics = await self.train_on(StepGroups(step, groups, screening.keeps), version)
        self.write(step, groups, keep=attempt > 0)
        metrics = step_metrics(trained, samples, time.monotonic() - started)
        metrics.update({"policy_version": version, "staleness": step - version, **self.counts(),
                        **({"groups_kept": finished.taken} if finished.taken else {}),
                        **screening.metrics(), **signal_metrics, **self.difficulty.metrics()})
        trips = self.tripwires.observe(step, [[t for t in g if trainable(t)] for g in trained])
        if self.canary is not None and self.canary.due(step):
            trips += await self.canary.check(step, self.endpoint)
        metrics.update({f"tripwire/{trip.wire}": 1 for trip in trips})
        await self.trip(trips)
        return samples, metrics

    async def trip(self, trips: list[Trip]) -> None:
        """Record each wire that fired (`tripwires.jsonl`, stderr) and do what the config's action says: go on,
        wait while the run folder's `PAUSED` file exists, or stop the run."""
        if not trips:
            return
        action = self.tripwires.config.action
        for trip in trips:
            self.folder.tripwires.append({**trip.record(), "action": action})
            print(f"tracegym rl: tripwire {trip.wire} at step {trip.step}: {trip.message} ({action})", file=sys.stderr)
        said = "; ".join(f"{t.wire}: {t.message}" for t in trips)
        if action == "stop":
            raise TripwireStop(f"tripwire at step {trips[0].step}: {said}")
        if action == "pause":
            paused = self.folder.path / PAUSED
            paused.write_text(f"{said}\nremove this file to go on\n")
            print(f"tracegym rl: paused: remove {paused} to go on", file=sys.stderr)
            while paused.exists():
                await asyncio.sleep(1.0)

    async def train_on(self, groups: StepGroups, version: int) -> tuple[list[Sample], dict[str, Any]]:
        """What the signal makes of a step's groups (the policy `version` served when the step started), samples
        too old for the step dropped (and counted) before the signal finishes them; with the signal's figures."""
        with watch(Stage.BATCH_ASSEMBLY, f"of step {groups.step}"):
            samples, made = await self.signal.samples(groups, version)
            samples, finished = await self.signal.finish(self.staleness.admit(samples, groups.step))
        return samples, {**made, **finished}

    async def run_groups(self, endpoint: Endpoint, model: str, finished: FinishedGroups | None = None,
                         attempt: int = 0) -> tuple[list[Group], list[str]]:
        """One group per drawn task (refilled where online difficulty asks), run against `endpoint` with the seats
        of the policy `model`; and the environment of each. Each group is kept in `finished` as it finishes (the
        step's `attempt`), and one a killed run finished there already is taken from it instead of run again."""
        gate = asyncio.Semaphore(max(1, self.plan.concurrency // self.plan.group_size))
        if self.pool is not None:
            await asyncio.to_thread(self.pool.refresh)  # the checkpoints the trainer wrote since the last step

        await asyncio.gather(*(env.stream.ahead(self.reads_ahead(env.id)) for env in self.envs.values()))
        # every draw from the run's generator happens here, in order, so a resumed run draws the same
        plans = [(env, data, self.requests(env, model)) for env, data in self.draw()]

        places = itertools.count()  # each group's place in the order the step drew its tasks

        async def group(env: TrainEnv, data: TaskData, requests: list[Request], place: int) -> Group:
            if finished is not None and (kept := finished.take(attempt, place, data.key)) is not None:
                return kept
            async with gate:
                with watch(Stage.ENV_SERVER, f"({env.id} task {data.key})"):
                    played = await asyncio.gather(*(env.client.episodes(
                        env.served, data, endpoint, indices, seats=seats, sampling=self.plan.sampling)
                        for indices, seats in requests))
            done = [e for episodes in played for e in episodes]
            if finished is not None:
                finished.record(attempt, place, done)
            return done

        async def refill(env_ids: list[str]) -> list[Group]:  # draws every task (in order) before any runs
            more = [(self.envs[i], self.difficulty.draw(i, self.envs[i].stream.next)) for i in env_ids]
            return list(await asyncio.gather(*(group(env, data, self.requests(env, model), next(places))
                                               for env, data in more)))

        drawn = await asyncio.gather(*(group(*plan, next(places)) for plan in plans))
        return await self.difficulty.complete(drawn, [env.id for env, _, _ in plans], self.plan.tasks_per_step,
                                              refill)

    def requests(self, env: TrainEnv, model: str) -> list[Request]:
        """The env-server requests of one group of `env`: its `group_size` episodes in one (every member plays the
        policy: a single-agent environment), or each alone with the seats drawn for it while `model` is the policy
        (a multi-agent one)."""
        indices = range(self.plan.group_size)
        if env.seating is None:
            return [(list(indices), None)]
        return [([i], env.seating.next(model, self.rng)) for i in indices]

    def write(self, step: int, groups: list[Group], keep: bool) -> None:
        """The step's episodes into the run folder; `keep`: after those of its earlier attempts."""
        self.folder.write_episodes(step, [e for g in groups for e in g], keep=keep)

    def counts(self) -> dict[str, int]:
        """What the run has left out of training so far, by cause."""
        return {**self.signal.counts(), "samples_dropped_stale": self.staleness.dropped}

    def reads_ahead(self, env_id: str) -> int:
        """The most tasks one step can draw from an environment: each of the step's, each refill, and for each
        the tasks online difficulty may pass over first."""
        difficulty = self.difficulty.envs.get(env_id)
        if difficulty is None:
            return self.plan.tasks_per_step
        return (self.plan.tasks_per_step + difficulty.config.refills) * (difficulty.config.max_skips + 1)

    def draw(self) -> list[tuple[TrainEnv, TaskData]]:
        """The step's tasks: `tasks_per_step` environments drawn by weight, the next task of each."""
        chosen = self.rng.choices(list(self.envs), [e.weight for e in self.envs.values()], k=self.plan.tasks_per_step)
        return [(self.envs[env_id], self.difficulty.draw(env_id, self.envs[env_id].stream.next)) for env_id in chosen]

    # --- state across a resume --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a resume from `next_step` needs to go on as if never stopped: the signal's state (e.g. EMA
        baselines), counts, the environment draw, how far each task stream got, and the online difficulty."""
        version, internal, gauss = self.rng.getstate()
        return {"next_step": self.next_step, **self.signal.state_dict(), "staleness": self.staleness.state_dict(),
                "rng": [version, list(internal), gauss],
                "drawn": {env_id: env.stream.drawn for env_id, env in self.envs.items()},
                "seating": {env_id: env.seating.state_dict() for env_id, env in self.envs.items() if env.seating},
                "difficulty": self.difficulty.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_step = int(state["next_step"])
        self.signal.load_state_dict(state)
        self.staleness.load_state_dict(state["staleness"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        for env_id, drawn in state["drawn"].items():
            if env_id in self.envs:  # an environment the resumed config dropped has nothing to go on with
                self.envs[env_id].stream.skip_to(drawn)
        for env_id, env in self.envs.items():
            if env.seating is not None and env.stream.drawn:  # it took part in the run before the checkpoint
                seating = state.get("seating", {}).get(env_id)
                if seating is None:
                    raise UsageError(f"the checkpoint holds no seating of environment {env_id!r} (it was not "
                                     "multi-agent then); start a new run")
                env.seating.load_state_dict(seating)
        took_part = [env_id for env_id, env in self.envs.items() if env.stream.drawn]
        self.difficulty.load_state_dict(state.get("difficulty", {}), took_part)

    # --- evaluation --------------------------------------------------------------------------------------
    async def evaluate(self, step: int, wait: bool = False) -> None:
        """Mean reward (with a 95% interval) on each held-out environment under policy `step` (the policy trained on
        `step` batches), and a multi-agent one's game figures; each environment's episodes go to its folder under
        `evals/`. It waits for the trainer to publish that policy: the orchestrator hands over batch `step - 1`
        before evaluating, so an asynchronous run's served policy may still be an older one, and "eval step N"
        must be policy N (its record's `policy_version` says so). `wait`: the run's last step, from then on the
        evaluation is the watchdog's eval drain."""
        if not self.held_out.envs:
            return
        version, model = await self.policy_when(lambda v: v >= step, f"policy {step} to evaluate")
        endpoint = self.endpoint.model_copy(update={"model": model})
        with watch(Stage.EVAL_DRAIN, f"after step {step}") if wait else contextlib.nullcontext():
            for env in self.held_out.envs:
                played = await self.held_out_played(env, endpoint)
                self.folder.write_episodes(step, [e for e, _ in played], held_out=env.id)
                record = reward_figures(played) | (game_figures(played) if env.seating is not None else {})
                self.folder.metrics.append({"eval_step": step, "env": env.id, "policy_version": version, **record})

    async def held_out_played(self, env: HeldOutEnv, endpoint: Endpoint) -> list[tuple[Episode, list[str]]]:
        """Every held-out task of `env` played once, with the learner's seats of each episode: a single-agent
        environment's rollouts; a multi-agent one's with the learner in each free seat in turn (all seats at once
        in self-play), against the same opponents every time."""
        if env.seating is None:
            return [(e, e.trainable_members) for e in await self.held_out_episodes(env, endpoint, None)]
        rng = random.Random(self.plan.seed)  # the same opponent draws at every evaluation
        played: list[tuple[Episode, list[str]]] = []
        for seat in env.seating.learner_seats():
            episodes = await self.held_out_episodes(env, endpoint, env.seating.binding(seat, endpoint.model, rng))
            played += [(e, [seat] if seat else e.trainable_members) for e in episodes]
        return played

    async def held_out_episodes(self, env: HeldOutEnv, endpoint: Endpoint, seats: Seats | None) -> list[Episode]:
        """One episode of each held-out task of `env`, seated by `seats`, in task order."""

        async def one(data: TaskData) -> list[Episode]:
            return await env.client.episodes(env.served, data, endpoint, [0], seats=seats,
                                             sampling=self.held_out.sampling)

        return [e for episodes in await self.each_held_out(env, one) for e in episodes]

    async def each_held_out(self, env: HeldOutEnv, run: Callable[[TaskData], Awaitable[T]]) -> list[T]:
        """`run` on each held-out task of `env`, `plan.concurrency` at once, in task order."""
        gate = asyncio.Semaphore(self.plan.concurrency)

        async def one(data: TaskData) -> T:
            async with gate:
                with watch(Stage.ENV_SERVER, f"(held-out {env.id} task {data.key})"):
                    done = await run(data)
            beat(Stage.EVAL_DRAIN, f"held-out task {data.key} of {env.id} evaluated")
            return done

        return list(await asyncio.gather(*(one(data) for data in env.rows)))

    async def aclose(self) -> None:
        """Close every env client (one may serve both training and held-out tasks)."""
        envs: list[TrainEnv | HeldOutEnv] = [*self.envs.values(), *self.held_out.envs]
        clients = {id(e.client): e.client for e in envs}
        for client in clients.values():
            await client.aclose()
        await self.signal.aclose()
        self.folder.close()


def build_orchestrator(orch: OrchestratorConfig, steps: int, folder: RLFolder, endpoints: Endpoints,
                       endpoint: Endpoint, signal: Signal) -> Orchestrator:
    """The orchestrator the `[orchestrator]` section describes for a run of `steps` steps, sampling the policy at
    `endpoint` and training on what `signal` makes of its groups, calling the env servers in `endpoints` (each
    asked what it serves: no taskset's code runs here); resumed from the state the folder holds (`resume_state`),
    if any."""
    uses_pool = any(e.play.opponent == "pool" for e in [*orch.train.envs, *orch.eval.envs])
    pool = OpponentPool(folder, lora_loader(endpoint.servers()), endpoints.base_model) if uses_pool else None
    servers = EnvServers(folder, endpoints)

    def seating(env: EnvChoice, served: ServedTaskset, where: str) -> Seating | None:
        return seating_for(env, served, where, endpoint, endpoints.base_model, pool)

    envs = []
    for i, e in enumerate(orch.train.envs):
        client, served = servers.reach(e, held_out=False)
        rows = servers.rows(e, held_out=False, count=served.size or 0)
        stream = TaskStream(e.id, served.size, orch.seed + i, client.rows, rows)
        envs.append(TrainEnv(e.id, e.weight, served, stream, client,
                             seating(e, served, f"orchestrator.train.envs.{i}")))
    held_out = []
    for i, e in enumerate(orch.eval.envs):
        client, served = servers.reach(e, held_out=True)
        rows = servers.rows(e, held_out=True, count=min(orch.eval.num_tasks, served.size or orch.eval.num_tasks))
        held_out.append(HeldOutEnv(e.id, served, rows, client, seating(e, served, f"orchestrator.eval.envs.{i}")))
    difficulty = OnlineDifficulty({e.id: TaskDifficulty(e.difficulty, orch.seed + i)
                                   for i, e in enumerate(orch.train.envs) if e.difficulty}, group_rewards, group_key,
                                  group_passes)
    concurrency = within_capacity(orch.concurrency, [*envs, *held_out])
    plan = StepPlan(steps, orch.tasks_per_step, orch.group_size, concurrency, orch.batch_attempts,
                    orch.train.sampling, orch.seed)
    orchestrator = Orchestrator(folder, endpoint, envs, signal, StalenessControl(orch.max_async_steps), plan,
                                held_out=HeldOut(held_out, orch.eval.sampling, orch.eval.num_tasks, orch.eval.every),
                                filters=orch.filters.active(), difficulty=difficulty, pool=pool,
                                tripwires=Tripwires(orch.tripwire), canary=canary_wire(orch.tripwire, envs))
    if (state := folder.resume_state()) is not None:
        orchestrator.load_state_dict(state)
    return orchestrator


def within_capacity(concurrency: int, envs: Sequence[TrainEnv | HeldOutEnv]) -> int:
    """`concurrency`, or the smallest capacity an environment's server says its tasks have (an OpenEnv server's
    sessions), noted, when that is less: rollouts past it would only wait for a free session or fail."""
    limits = [(e.served.capacity, e.id) for e in envs if e.served.capacity is not None]
    if not limits or min(limits)[0] >= concurrency:
        return concurrency
    capacity, env_id = min(limits)
    print(f"tracegym rl: environment {env_id!r} runs at most {capacity} rollouts at once (its server's capacity): "
          f"orchestrator.concurrency {concurrency} runs as {capacity}", file=sys.stderr)
    return capacity


def canary_wire(config: TripwireConfig, envs: list[TrainEnv]) -> CanaryWire | None:
    """The `canary` tripwire over the first `canary_tasks` read tasks of each single-agent environment; None when
    `canary_every` leaves it off (or the tripwires are off)."""
    if not (config.enabled and config.canary_every):
        return None
    chosen = [CanaryEnv(e.id, e.client, [e.stream.rows[i] for i in sorted(e.stream.rows)[:config.canary_tasks]])
              for e in envs if e.seating is None]
    return CanaryWire([c for c in chosen if c.rows], config.canary_every)


def seating_for(env: EnvChoice, served: ServedTaskset, where: str, endpoint: Endpoint, base_model: str,
                pool: OpponentPool | None) -> Seating | None:
    """Who sits where in each episode of `env` (config at `where`), checked against the seats its env server serves;
    None for a single-agent taskset, which `play` and `seats` must leave alone."""
    if not served.multi_agent:
        if env.play != Play() or env.seats:
            raise UsageError(f"{where}: taskset {env.id!r} is single-agent; `play` and `seats` seat the members "
                             "of a multi-agent one")
        return None
    unknown = sorted(set(env.seats) - set(served.members))
    if unknown:
        raise UsageError(f"{where}.seats: seat {unknown[0]!r}: taskset {env.id!r} has no such seat (seats: "
                         f"{', '.join(served.members)})")
    return Seating(served.members, env.play, env.seats, endpoint, base_model, pool.draw if pool else None)


class EnvServers:
    """The run's env servers as the orchestrator reaches them: a client each (one per address, shared by the
    environments it serves), what each serves, and its first rows, asked once."""

    def __init__(self, folder: RLFolder, endpoints: Endpoints) -> None:
        self.folder, self.addresses = folder, endpoints.envs
        self.clients: dict[str, EnvClient] = {}

    def reach(self, env: EnvChoice, held_out: bool) -> tuple[EnvClient, ServedTaskset]:
        """The client of an environment's env server, and what that server serves (checked to be `env.id`)."""
        name = self._name(env, held_out)
        if name not in self.clients:
            self.clients[name] = EnvClient(self.addresses[name])
        served = describe(self.addresses[name])
        if not served.named(env.id):
            raise UsageError(f"the env server of {name!r} ({self.addresses[name]}) serves taskset {served.id!r}, "
                             f"not {env.id!r}")
        if served.rows_error is not None:
            raise UsageError(f"the env server of {name!r} cannot give taskset {env.id!r}'s tasks: {served.rows_error}")
        return self.clients[name], served

    def rows(self, env: EnvChoice, held_out: bool, count: int) -> list[TaskData]:
        """The environment's first `count` rows, read from its env server."""
        return ask(self.addresses[self._name(env, held_out)], lambda client: client.rows(range(count)))

    def _name(self, env: EnvChoice, held_out: bool) -> str:
        name = env_server_key(env, held_out)
        if name not in self.addresses:
            raise UsageError(f"{self.folder.path / ENDPOINTS} names no env server {name!r}")
        return name


def group_rewards(group: Group) -> dict[str, list[float]]:
    """The rewards a group's advantages compare, per seat: its episodes' trainable members' (a rollout's own, seat
    `SOLO`)."""
    return {seat: [r for _, r in scored] for seat, scored in scored_seats(group).items()}


def group_passes(group: Group) -> dict[str, list[float]]:
    """What a group's task's pass rates average, per seat: a game seat's wins (1 a win, 0.5 a draw, 0 a loss or
    forfeit), else its reward (a rollout's; a member the game gave no outcome)."""
    return {seat: [PASSES.get(e.outcomes[seat], 0.0) if seat in e.outcomes else r for e, r in scored]
            for seat, scored in scored_seats(group).items()}


PASSES = {Outcome.WIN: 1.0, Outcome.DRAW: 0.5}
"""A game seat's pass per outcome (any other: 0) for online difficulty."""


def scored_seats(group: Group) -> dict[str, list[tuple[Episode, float]]]:
    """Each trainable seat's (episode, reward) in a group, of the members whose trace can be trained on."""
    out: dict[str, list[tuple[Episode, float]]] = {}
    for episode in group:
        for member in episode.trainable_members:
            trace = episode.traces.get(member)
            if trace is not None and trainable(trace) and trace.reward is not None:
                out.setdefault(member, []).append((episode, trace.reward))
    return out


def group_key(group: Group) -> str:
    """The task a group ran (each of its episodes records it)."""
    return group[0].task_key


def reward_figures(played: list[tuple[Episode, list[str]]]) -> dict[str, Any]:
    """The learner's mean reward over the (episode, learner seats) a held-out evaluation played, with its 95%
    interval, as `tracegym eval` computes it, and how many of its rewards were left unscored."""
    rewards = [e.rewards.get(m) for e, seats in played for m in seats]
    estimate = mean_ci([r for r in rewards if r is not None])
    return {"eval_reward": estimate.mean, "eval_reward_ci95": estimate.half_width, "eval_n": estimate.n,
            "eval_unscored": len(rewards) - estimate.n}


def game_figures(played: list[tuple[Episode, list[str]]]) -> dict[str, Any]:
    """The learner's win and forfeit rates (with their 95% intervals), the share of games that reached an outcome
    and the episodes that ended on an error, over the (episode, learner seats) a held-out evaluation played."""
    outcomes = [e.outcomes.get(m) for e, seats in played for m in seats]
    wins = mean_ci([float(o == Outcome.WIN) for o in outcomes if o is not None])
    forfeits = mean_ci([float(o == Outcome.FORFEIT) for o in outcomes if o is not None])
    return {"eval_win_rate": wins.mean, "eval_win_rate_ci95": wins.half_width, "eval_forfeit_rate": forfeits.mean,
            "eval_decided_rate": len([o for o in outcomes if o is not None]) / len(outcomes) if outcomes else None,
            "eval_episode_errors": sum(e.error is not None for e, _ in played)}


def check_not_all_failed(step: int, groups: list[list[Trace]], episodes: list[Episode] | None = None) -> None:
    """Stop the run, saying why, when every rollout of a step failed (a wrong model name, a dead endpoint), or
    every one of its `episodes` was lost (an env server gone: no learner trace is left to count): training on
    nothing would only hide it."""
    traces = [t for g in groups for t in g]
    if traces and not any(t.ok for t in traces):
        first = next((e for t in traces for e in t.errors), None)
        reason = f"{first.kind.value} error in {first.stage}: {first.message}" if first else "no error recorded"
        raise InfrastructureError(f"step {step}: all {len(traces)} rollouts failed; the first: {reason}")
    errors = [e.error for e in episodes or [] if e.error is not None]
    if not traces and episodes and len(errors) == len(episodes):
        raise InfrastructureError(f"step {step}: all {len(episodes)} episodes failed; the first: "
                                  f"{errors[0].kind.value} error in {errors[0].stage}: {errors[0].message}")


def trainable(trace: Trace) -> bool:
    """True when the rollout ended on the model's own output and has a reward to learn from."""
    return unfit(trace) is None


def _version(sampled: int | None, served_at_start: int) -> int:
    return served_at_start if sampled is None else sampled


def step_metrics(groups: list[list[Trace]], samples: list[Sample], seconds: float) -> dict[str, Any]:
    """Reward, advantage, length, truncation, failure, error and throughput figures of one step. `reward` is over
    the trainable rollouts (what the advantages compare); `reward_unmasked` over every rollout, a failed one at
    the reward it recorded or 0 (`unmasked_reward`): `reward - reward_unmasked` is what the failures, had they been
    counted, would have cost the step's mean. `rollouts_failed` counts the failed rollouts, `failed/<reason>` each
    `Trace.failure` kind (model_unavailable, sandbox_error, tool_timeout, scoring_error, env_server_error,
    rollout_timeout, ...); `cut/<kind>` the rollouts cut short or misread (`Trace.cut`: overlong, length,
    unparsable), whatever the cut policy made of them (the signal counts those it masked, `masked/<kind>`)."""
    traces = [t for g in groups for t in g]
    failed = Counter(unfit(t) for t in traces if not trainable(t))
    # trainable rollouts only, unlike `tracegym eval`'s reward, which also counts scored rollouts that failed
    reward = mean_ci([t.reward for t in traces if trainable(t) and t.reward is not None])
    advantages = [s.advantage for s in samples]
    lengths = [t.usage.completion_tokens for t in traces]
    return {
        "reward": reward.mean,
        "reward_std": reward.std,
        "reward_unmasked": statistics.fmean(unmasked_reward(t) for t in traces) if traces else None,
        "advantage_mean": statistics.fmean(advantages) if advantages else None,
        "advantage_abs_mean": statistics.fmean(abs(a) for a in advantages) if advantages else None,
        "completion_tokens_mean": statistics.fmean(lengths) if lengths else 0.0,
        "truncation_rate": sum(t.is_truncated for t in traces) / len(traces) if traces else 0.0,
        **{f"cut/{kind}": n for kind, n in sorted(Counter(t.cut.value for t in traces if t.cut).items())},
        "errors": sum(bool(t.errors) for t in traces),
        "rollouts_failed": sum(failed.values()),
        **{f"failed/{reason}": n for reason, n in sorted(failed.items())},
        "rollouts": len(traces),
        "samples": len(samples),
        "trained_tokens": sum(s.num_trained for s in samples),
        "generation_s": seconds,
        "rollouts_per_s": len(traces) / seconds if seconds else None,
    }



def unmasked_reward(trace: Trace) -> float:
    """A rollout's reward as if no failure kept it out of its group: the reward it recorded (a rollout a timeout
    hit after scoring keeps its score), else 0 (a rollout that failed before it was scored counts as a miss)."""
    reward = trace.reward
    return 0.0 if reward is None else reward
