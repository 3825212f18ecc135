"""Benchmark: a TRL environment class wrapping an OpenEnv client, run as a taskset at `-c 8` against openenv's own
`create_app` server at capacity 8: rollouts/s, and the server sessions held at once (at most 8 is the aim).

The class (`GuessToolEnv`, this file) holds one `GenericEnvClient` per instance, as TRL's OpenEnv examples do, and
closes it in `close()`, which the taskset calls when it closes. The server (in this process, a thread) plays a
number-guessing game and counts its live sessions (environments made and not yet closed) and their peak. The model
is the fake OpenAI server answering by bisection (7 guesses at most), so the figures measure the rollout path, not a
model. Two paths, one after the other in one run, each `--repeats` times: in process (`tg.evaluate`, concurrency 8)
and through `tracegym eval` with its env-server workers (`--env.workers`, `-c 8`). Each instance lives in one
process: with W workers the pools can together hold more than 8 sessions.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/trl_openenv_pool.py [--rollouts 64] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.generic_client import GenericEnvClient

import tracegym as tg
from tracegym.cli.main import main as tracegym_main
from tracegym.interop.openenv_server import serving
from tracegym.testing import FakeOpenAIServer, reply, tool_call

CAPACITY = 8
CONCURRENCY = 8


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    feedback: str = ""


class Sessions:
    """Live server sessions (environments made and not closed), their peak and total."""

    lock = threading.Lock()
    live = peak = total = 0

    @classmethod
    def opened(cls) -> None:
        with cls.lock:
            cls.live += 1
            cls.total += 1
            cls.peak = max(cls.peak, cls.live)

    @classmethod
    def closed(cls) -> None:
        with cls.lock:
            cls.live -= 1

    @classmethod
    def reset(cls) -> None:
        with cls.lock:
            cls.peak, cls.total = cls.live, 0


class GuessEnvironment(Environment):
    """Guess a number from 1 to 100; higher or lower after each guess."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.target = 0
        Sessions.opened()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self.target = random.Random(seed).randint(1, 100)
        return GuessObservation(feedback="I am thinking of a number from 1 to 100.")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        assert isinstance(action, GuessAction)
        self._state.step_count += 1
        if action.guess == self.target:
            return GuessObservation(feedback="correct", reward=1.0, done=True)
        return GuessObservation(feedback="higher" if action.guess < self.target else "lower", reward=0.0)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        Sessions.closed()


class GuessToolEnv:
    """Guess a number from 1 to 100 (TRL's OpenEnv examples' shape: one client per instance, made once)."""

    def __init__(self):
        self.client = GenericEnvClient(base_url=os.environ["GUESS_URL"])
        self.reward = 0.0

    def reset(self, **kwargs) -> str:
        self.reward = 0.0
        return " " + self.client.reset(seed=kwargs.get("seed")).observation["feedback"]

    def guess(self, number: int) -> str:
        """Guess the hidden number.

        Args:
            number: Your guess, from 1 to 100.
        """
        result = self.client.step({"guess": number})
        self.reward = float(result.reward or 0.0)
        return result.observation["feedback"]

    def get_reward(self) -> float:
        return self.reward

    def close(self) -> None:
        self.client.close()  # the session ends when the taskset closes (or its process exits)


def bisect(request):
    low, high, guess = 1, 100, None
    for message in request.messages:
        if message.role == "assistant" and message.tool_calls:
            guess = json.loads(message.tool_calls[0].arguments)["number"]
        if message.role == "tool" and guess is not None:
            low, high = {"higher": (guess + 1, high), "lower": (low, guess - 1)}.get(message.text, (low, high))
    if request.messages[-1].role == "tool" and request.messages[-1].text == "correct":
        return "Found it."
    return reply(None, tool_call("guess", {"number": (low + high) // 2}))


def in_process(rows: Path, rollouts: int, model: str) -> tuple[int, float]:
    taskset = tg.load_taskset(f"{__file__}:GuessToolEnv", {"rows": str(rows)})
    endpoint = tg.Endpoint(base_url=model, model="fake-model", api_key_env=None)
    start = time.perf_counter()
    traces = asyncio.run(tg.evaluate(taskset, endpoint, num_tasks=rollouts, concurrency=CONCURRENCY))
    elapsed = time.perf_counter() - start
    taskset.close()
    return sum(1 for t in traces if t.ok and t.reward == 1.0), elapsed


def served(rows: Path, rollouts: int, model: str, workers: int) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        tracegym_main(["eval", f"{__file__}:GuessToolEnv", "--taskset.rows", str(rows), "-n", str(rollouts), "-c",
                       str(CONCURRENCY), "--env.workers", str(workers), "--model.base-url", model, "--output-dir",
                       out, "--no-rich", "--max-error-rate", "1"])
        elapsed = time.perf_counter() - start
        [run] = list(Path(out).glob("*/*"))
        traces = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    return sum(1 for t in traces if not t["errors"] and t["rewards"]["GuessToolEnv"]["score"] == 1.0), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "rows.jsonl"
        rows.write_text("\n".join(json.dumps({"prompt": "Find my number.", "seed": s}) for s in range(args.rollouts)))
        app = create_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=CAPACITY)
        with serving(app) as url, FakeOpenAIServer(rule=bisect) as model:
            os.environ["GUESS_URL"] = url
            paths = {"in process": lambda: in_process(rows, args.rollouts, model.base_url),
                     f"eval, {args.workers} workers": lambda: served(rows, args.rollouts, model.base_url,
                                                                     args.workers)}
            results: dict[str, list[tuple[int, float, int, int]]] = {name: [] for name in paths}
            for _ in range(args.repeats):
                for name, run in paths.items():
                    Sessions.reset()
                    good, elapsed = run()
                    results[name].append((good, elapsed, Sessions.peak, Sessions.total))
    print(f"{args.rollouts} rollouts, -c {CONCURRENCY}, server capacity {CAPACITY}")
    for name, runs in results.items():
        rates = [r[0] / r[1] for r in runs]
        print(f"{name:>16}: {statistics.median(rates):6.1f} rollouts/s; ok {[r[0] for r in runs]}; "
              f"peak sessions {[r[2] for r in runs]}; sessions opened {[r[3] for r in runs]}")


if __name__ == "__main__":
    sys.exit(main())
