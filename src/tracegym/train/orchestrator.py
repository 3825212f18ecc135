"""Orchestrator: turns rollouts into training batches, one step at a time, never too far ahead of the trainer.

Per step: wait until the trainer's policy is recent enough (`max_async_steps`), draw `tasks_per_step` tasks from
the environments by weight, run a group of `group_size` rollouts per task through the env servers against the
currently served policy, compute advantages per group over the rollouts that ended on the model's own output
(a rollout that failed outside the model, `Trace.failure`, is left out of its group's statistics and of training,
and counted by reason), drop groups with no signal, turn every branch into training samples stamped with the
oldest policy version that sampled them, drop samples older than `max_async_steps`, and hand the batch to the
trainer. Held-out environments are
evaluated before the first step, every `eval.every` steps and after the last. Metrics go to `metrics.jsonl`, the
step's traces to `traces/step-N.jsonl`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracegym.core.errors import InfrastructureError
from tracegym.core.interval import mean_ci
from tracegym.core.sample import Sample
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.registry import load_taskset
from tracegym.models.endpoint import Endpoint
from tracegym.serve.env_client import EnvClient
from tracegym.train import exchange
from tracegym.train.advantages import GroupAdvantages, load_advantage_fn
from tracegym.train.rl_config import EnvChoice, RLConfig, env_server_key
from tracegym.train.samples import checked_samples
from tracegym.train.staleness import StalenessControl

POLICY_WAIT_S = 3600.0


class TaskStream:
    """An endless, seeded stream of one environment's tasks (a finite taskset is reshuffled each pass)."""

    def __init__(self, env: EnvChoice, seed: int) -> None:
        self.taskset = load_taskset(env.id, env.options)
        self._rows = self._cycle(seed)

    def _cycle(self, seed: int) -> Iterator[TaskData]:
        if not self.taskset.bounded:
            yield from self.taskset
            return
        for epoch in itertools.count():
            yield from self.taskset.shuffle(seed + epoch)

    def next(self) -> TaskData:
        return next(self._rows)


class Orchestrator:
    """Runs the steps of one RL run; `run()` until `config.steps` batches are handed over."""

    def __init__(self, config: RLConfig, run_dir: Path, base_url: str, base_model: str,
                 env_addresses: dict[str, str], start_step: int = 0) -> None:
        self.config, self.run_dir, self.base_url, self.base_model = config, run_dir, base_url, base_model
        self.env_addresses = env_addresses
        orch = config.orchestrator
        self.rng = random.Random(orch.seed + start_step)
        self.streams = {e.id: TaskStream(e, orch.seed + i) for i, e in enumerate(orch.train.envs)}
        fn = load_advantage_fn(orch.advantage, **({"std": True} if orch.std_normalize else {}))
        self.advantages = GroupAdvantages(fn, filter_no_signal=orch.filter_no_signal)
        self.staleness = StalenessControl(orch.max_async_steps)
        self.traces_invalid = 0
        """Traces dropped so far because `validate` found their tokens unfit for training."""
        self.start_step = start_step
        self.clients: dict[str, EnvClient] = {}

    # --- the loop ----------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Every step from `start_step`, with held-out evaluations; closes the env clients at the end."""
        self.clients = {env_id: EnvClient(address) for env_id, address in self.env_addresses.items()}
        self.restore(self.start_step)
        try:
            if self.start_step == 0:
                await self.evaluate(0)
            for step in range(self.start_step, self.config.steps):
                version, model = await self.wait_policy(step)
                samples, metrics = await self.collect(step, version, model)
                exchange.write_batch(self.run_dir, step, samples, metrics)
                self.save_state(step + 1)
                self.log({"step": step, **metrics})
                every = self.config.orchestrator.eval.every
                if every and (step + 1) % every == 0 and step + 1 < self.config.steps:
                    await self.evaluate(step + 1)
            await self.evaluate(self.config.steps, wait=True)
        finally:
            for client in self.clients.values():
                await client.aclose()

    async def wait_policy(self, step: int) -> tuple[int, str]:
        """Block (without blocking the loop) until the trainer's version allows producing `step`'s batch."""
        deadline = time.monotonic() + POLICY_WAIT_S
        while True:
            version, model = exchange.current_policy(self.run_dir, self.base_model)
            if self.staleness.may_start(step, version):
                return version, model
            if time.monotonic() > deadline:
                raise InfrastructureError(f"step {step}: the trainer published no policy >= "
                                          f"{step - self.staleness.max_async_steps} in {POLICY_WAIT_S:.0f}s")
            await asyncio.sleep(0.05)

    async def collect(self, step: int, version: int, model: str) -> tuple[list[Sample], dict[str, Any]]:
        """The samples of one step and its metrics."""
        started = time.monotonic()
        orch = self.config.orchestrator
        endpoint = self.endpoint(model)
        sampling = orch.train.sampling.to_sampling()
        envs = self.rng.choices([e.id for e in orch.train.envs], [e.weight for e in orch.train.envs],
                                k=orch.tasks_per_step)
        gate = asyncio.Semaphore(max(1, orch.concurrency // orch.group_size))

        async def group(env_id: str) -> list[Trace]:
            async with gate:
                stream = self.streams[env_id]
                return await self.clients[env_id].run_group(stream.taskset, stream.next(), endpoint, orch.group_size,
                                                            sampling=sampling)

        groups = await asyncio.gather(*(group(e) for e in envs))
        check_not_all_failed(step, groups)
        samples = self.to_samples(groups, version, step)
        self.save_traces(step, groups)
        metrics = step_metrics(groups, samples, time.monotonic() - started)
        metrics.update({"policy_version": version, "staleness": step - version,
                        "groups_filtered": self.advantages.filtered, "samples_dropped_stale": self.staleness.dropped,
                        "traces_invalid": self.traces_invalid})
        return samples, metrics

    def to_samples(self, groups: list[list[Trace]], version: int, step: int) -> list[Sample]:
        """Advantages per group over its trainable rollouts, then every branch of each of those as a sample,
        stamped with the oldest policy version that sampled it (`version`, the one served when the step
        started, where the endpoint reported none); samples too old for `step` are dropped and counted."""
        out: list[Sample] = []
        for traces in groups:
            kept = [t for t in traces if trainable(t)]
            advantages = self.advantages([t.reward for t in kept], key=traces[0].task_key if traces else "")
            if advantages is None:
                continue
            for trace, advantage in zip(kept, advantages, strict=True):
                out += self.trace_samples(trace, advantage, version, step)
        return self.staleness.admit(out, step)

    def trace_samples(self, trace: Trace, advantage: float, version: int, step: int) -> list[Sample]:
        """The trace's samples with loss, carrying its advantage and reward; an untrainable trace is counted."""
        samples, problems = checked_samples(trace)
        if problems:  # not exactly trainable (e.g. no logprobs, greedy): dropped and counted
            self.traces_invalid += 1
            self.log({"step": step, "invalid_trace": problems[0], "problems": len(problems)})
        stamp = {"advantage": advantage, "reward": trace.reward}
        return [s.model_copy(update={**stamp, "policy_version": _version(s.policy_version, version)})
                for s in samples if s.num_trained]

    # --- state across a resume --------------------------------------------------------------------------
    def save_state(self, next_step: int) -> None:
        """What a resume from `next_step` needs: advantage state (e.g. EMA baselines) and counts."""
        folder = self.run_dir / "orchestrator"
        folder.mkdir(exist_ok=True)
        state = {"advantages": self.advantages.state_dict(), "staleness": self.staleness.state_dict()}
        (folder / f"step-{next_step:06d}.json").write_text(json.dumps(state))

    def restore(self, step: int) -> None:
        """Load the state saved when `step`'s batch was next, and drop batches the old run made from `step` on."""
        for stale in (self.run_dir / "batches").glob("step-*.msgpack"):
            if int(stale.stem.split("-")[1]) >= step:
                stale.unlink()
        path = self.run_dir / "orchestrator" / f"step-{step:06d}.json"
        if step and path.exists():
            state = json.loads(path.read_text())
            self.advantages.load_state_dict(state["advantages"])
            self.staleness.load_state_dict(state["staleness"])

    # --- evaluation --------------------------------------------------------------------------------------
    async def evaluate(self, step: int, wait: bool = False) -> None:
        """Mean reward (with a 95% interval) on each held-out environment under the policy of `step`."""
        phase = self.config.orchestrator.eval
        if not phase.envs:
            return
        if wait:
            await self.wait_version(step)
        version, model = exchange.current_policy(self.run_dir, self.base_model)
        for env in phase.envs:
            client = self.clients.get(env_server_key(env, held_out=True)) or self.clients[env.id]
            traces = await client.evaluate(load_taskset(env.id, env.options), self.endpoint(model),
                                           num_tasks=phase.num_tasks, sampling=phase.sampling.to_sampling(),
                                           concurrency=self.config.orchestrator.concurrency)
            estimate = mean_ci([t.reward for t in traces if t.reward is not None])  # as `tracegym eval` does
            self.log({"eval_step": step, "env": env.id, "policy_version": version, "eval_reward": estimate.mean,
                      "eval_reward_ci95": estimate.half_width, "eval_n": estimate.n,
                      "eval_unscored": len(traces) - estimate.n})

    async def wait_version(self, version: int) -> None:
        deadline = time.monotonic() + POLICY_WAIT_S
        while exchange.current_policy(self.run_dir, self.base_model)[0] < version:
            if time.monotonic() > deadline:
                raise InfrastructureError(f"the trainer never published policy {version}")
            await asyncio.sleep(0.1)

    # --- helpers -----------------------------------------------------------------------------------------
    def endpoint(self, model: str) -> Endpoint:
        return self.config.model.endpoint(self.base_url, model, weights=self.config.trainer.model)

    def save_traces(self, step: int, groups: list[list[Trace]]) -> None:
        folder = self.run_dir / "traces"
        folder.mkdir(exist_ok=True)
        with (folder / f"step-{step:06d}.jsonl").open("w") as f:
            for trace in itertools.chain.from_iterable(groups):
                f.write(trace.model_dump_json() + "\n")

    def log(self, record: dict[str, Any]) -> None:
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"time": time.time(), **record}) + "\n")


def check_not_all_failed(step: int, groups: list[list[Trace]]) -> None:
    """Stop the run, saying why, when every rollout of a step failed (a wrong model name, a dead endpoint):
    training on nothing would only hide it."""
    traces = [t for g in groups for t in g]
    if traces and not any(t.ok for t in traces):
        first = next((e for t in traces for e in t.errors), None)
        reason = f"{first.kind.value} error in {first.stage}: {first.message}" if first else "no error recorded"
        raise InfrastructureError(f"step {step}: all {len(traces)} rollouts failed; the first: {reason}")


def trainable(trace: Trace) -> bool:
    """True when the rollout ended on the model's own output and has a reward to learn from."""
    return trace.failure is None and trace.reward is not None


def _version(sampled: int | None, served_at_start: int) -> int:
    return served_at_start if sampled is None else sampled


def step_metrics(groups: list[list[Trace]], samples: list[Sample], seconds: float) -> dict[str, Any]:
    """Reward, advantage, length, truncation, failure, error and throughput figures of one step. `reward` is over
    the trainable rollouts; `rollouts_failed` counts the others, and `failed/<reason>` each `Trace.failure`."""
    traces = [t for g in groups for t in g]
    failed = Counter(t.failure or "no_reward" for t in traces if not trainable(t))
    reward = mean_ci([t.reward for t in traces if trainable(t)])  # the estimate `tracegym eval` reports
    advantages = [s.advantage for s in samples]
    lengths = [t.usage.completion_tokens for t in traces]
    return {
        "reward": reward.mean,
        "reward_std": reward.std,
        "advantage_mean": statistics.fmean(advantages) if advantages else None,
        "advantage_abs_mean": statistics.fmean(abs(a) for a in advantages) if advantages else None,
        "completion_tokens_mean": statistics.fmean(lengths) if lengths else 0.0,
        "truncation_rate": sum(t.is_truncated for t in traces) / len(traces) if traces else 0.0,
        "errors": sum(bool(t.errors) for t in traces),
        "rollouts_failed": sum(failed.values()),
        **{f"failed/{reason}": n for reason, n in sorted(failed.items())},
        "rollouts": len(traces),
        "samples": len(samples),
        "trained_tokens": sum(s.num_trained for s in samples),
        "generation_s": seconds,
        "rollouts_per_s": len(traces) / seconds if seconds else None,
    }

