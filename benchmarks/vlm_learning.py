"""Report of an RL or SFT run of the embedded VLM on colour-codeword: held-out reward before and after on the same tasks
(pictures of the held-out split, never trained on; temperature 0), the paired 95% interval of the change, and what
is behind it: how many replies are a code word at all (the format), and how often a code word reply is the right
one against chance (seeing the colour). Reads the run folder only; writes a plot.

    python benchmarks/vlm_learning.py outputs/rl/<run-id> [--png benchmarks/vlm_learning.png]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from sft_reverse_text import Evaluation, evaluations

from tracegym.core.interval import MeanCI, mean_ci
from tracegym.core.trace import Trace
from tracegym.tasksets.colour_codeword import CODEWORDS

EDGES = re.compile(r"^[\s\"'`*]+|[\s\"'`*.]+$")
"""What the taskset's reward strips from a reply before comparing it with the code word."""


def word(trace: Trace) -> str:
    return EDGES.sub("", trace.last_reply).lower()


def reward(trace: Trace) -> float:
    return float(trace.reward or 0.0)


def fmt(e: MeanCI, sign: str = "") -> str:
    return f"{e.mean:{sign}.3f} [{e.mean - e.half_width:{sign}.3f}, {e.mean + e.half_width:{sign}.3f}] (n={e.n})"


def row(step: int, evaluation: Evaluation) -> str:
    traces = list(evaluation.values())
    codewords = [t for t in traces if word(t) in CODEWORDS.values()]
    right = mean_ci([reward(t) for t in codewords])
    answered = f"{right.mean:.3f} of {right.n}" if right.n else "-"
    common = max({word(t) for t in traces}, key=lambda w: sum(word(t) == w for t in traces))
    share = sum(word(t) == common for t in traces) / len(traces)
    return (f"| {step} | {fmt(mean_ci([reward(t) for t in traces]))} | {len(codewords) / len(traces):.2f} | "
            f"{answered} | {common!r} ({share:.0%}) |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    evals = evaluations(args.run_dir)
    print("| step | held-out reward [95%] | replies that are a code word | right among those | commonest reply |")
    print("|---:|---|---:|---|---|")
    for step, evaluation in evals.items():
        print(row(step, evaluation))
    first, last = min(evals), max(evals)
    shared = sorted(evals[first].keys() & evals[last].keys())
    gain = mean_ci([reward(evals[last][k]) - reward(evals[first][k]) for k in shared])
    print(f"\npaired change step {first} -> {last} on the same {len(shared)} tasks: {fmt(gain, '+')}")
    trainer = [json.loads(line) for line in (args.run_dir / "trainer_metrics.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (args.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "step" in m and "reward" in m]
    print("train reward by step:", " ".join(f"{m['reward']:.2f}" for m in steps))
    print("mean |log ratio| by step:", " ".join(f"{t.get('abs_log_ratio_mean', 0):.3f}" for t in trainer))
    print("train_s by step:", " ".join(f"{t['train_s']:.1f}" for t in trainer))
    if args.png is not None:
        draw(args.png, steps, evals)


def draw(png: Path, steps: list[dict], evals: dict[int, Evaluation]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([m["step"] for m in steps], [m["reward"] for m in steps], label="train reward (rollouts, T=1)")
    figures = {s: mean_ci([reward(t) for t in e.values()]) for s, e in evals.items()}
    ax.errorbar(list(figures), [f.mean for f in figures.values()], yerr=[f.half_width for f in figures.values()],
                fmt="o", capsize=3, label="held-out reward (T=0, 95% interval)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward (exact code word)")
    ax.set_title("RL of the embedded VLM on colour-codeword")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main()
