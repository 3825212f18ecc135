"""Benchmark: rollouts/s of a verifiers SingleTurnEnv run as a taskset (`verifiers:FILE`: its own rollout(), its
model calls through the interception proxy) against the same tasks and reward as a plain tracegym taskset, side by
side in one process, in process (no env server), against an in-process scripted model that answers at once, so
the figures measure the plumbing: verifiers' own loop plus one local HTTP hop per model call.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/verifiers_taskset.py [--rollouts 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import tracegym as tg
from tracegym.core.sampling import Sampling
from tracegym.envs.registry import load_taskset
from tracegym.envs.rollout import rollout
from tracegym.testing import ScriptedModel

ENVIRONMENT = '''
import verifiers as vf
from datasets import Dataset


def load_environment() -> vf.Environment:
    words = ["apple", "pear", "plum", "melon", "grape", "lemon", "cherry", "peach"]
    dataset = Dataset.from_list([{"question": f"Say {w}", "answer": w} for w in words])

    def exact(completion, answer) -> float:
        return float(completion[-1]["content"].strip() == answer)

    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[exact]))
'''


def exact(task: Any, trace: Any) -> float:
    return float(trace.graph.nodes[-1].message.text.strip() == task.data.answer)


async def rate(taskset: Any, rollouts: int) -> float:
    """Rollouts/s of `rollouts` concurrent single-turn rollouts, every one checked to have scored 1."""
    rows = list(taskset)
    model = ScriptedModel(rule=lambda request: request.messages[-1].text.split()[-1], tokens=True)
    start = time.perf_counter()
    traces = await asyncio.gather(*(rollout(taskset.task(rows[i % len(rows)]), model, Sampling(max_tokens=16))
                                    for i in range(rollouts)))
    took = time.perf_counter() - start
    assert all(trace.reward == 1.0 for trace in traces), next(trace.errors for trace in traces if trace.reward != 1.0)
    return rollouts / took


async def main(rollouts: int, rounds: int) -> None:
    path = Path(tempfile.mkdtemp()) / "say_word.py"
    path.write_text(ENVIRONMENT)
    wrapped = load_taskset(f"verifiers:{path}")
    native = tg.Taskset(id="native", data=[{"prompt": r.prompt, "answer": r.answer} for r in wrapped],
                        rewards=[exact])
    await rate(wrapped, 8)  # warm: the proxy, the shared OpenAI client, verifiers' lazy imports
    for round_ in range(rounds):
        ours, theirs = await rate(native, rollouts), await rate(wrapped, rollouts)
        print(f"round {round_}: tracegym taskset {ours:7.1f} rollouts/s   verifiers env {theirs:7.1f} rollouts/s   "
              f"({ours / theirs:.1f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.rollouts, args.rounds))
