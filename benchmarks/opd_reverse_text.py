"""Benchmark report of an on-policy distillation run (`tracegym rl @ configs/opd/reverse_text.toml`): the student's
held-out reward before and after, its per-token KL to the teacher per step, and where the time went.

Reads the run folder only: the held-out evaluations and step records (`metrics.jsonl`: `eval_reward` with its 95%
half-width on the same held-out tasks each time; `opd/kl`, `opd/score_s`, `generation_s` per step) and the
trainer's (`trainer_metrics.jsonl`: `seconds` per step). Prints each held-out evaluation, the gain from the first to
the last as "95% interval [lo, hi]" (unpaired normal approximation, conservative for the same tasks), the KL per
step, seconds per step and the wall time; draws `opd_reverse_text.png` (held-out and train reward, KL) beside the
`tracegym plot` curves. `--load FILE`: lines of `unix-time load1 load5 load15`, summarised over the run.

    .venv/bin/python benchmarks/opd_reverse_text.py outputs/rl/<run-id> [--png benchmarks/opd_reverse_text.png]
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

from tracegym.train.plots import plot_run
from tracegym.train.rl_folder import RLFolder


def gain(first: dict[str, Any], last: dict[str, Any]) -> tuple[float, float, float]:
    """The change in held-out reward and its 95% interval (the two half-widths combined as independent)."""
    delta = last["eval_reward"] - first["eval_reward"]
    half = math.hypot(first["eval_reward_ci95"], last["eval_reward_ci95"])
    return delta, delta - half, delta + half


def draw(png: Path, steps: list[dict[str, Any]], evals: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward, kl) = plt.subplots(1, 2, figsize=(11, 4))
    reward.plot([m["step"] for m in steps], [m["reward"] for m in steps], color="tab:blue", alpha=0.6,
                label="train reward (student samples, T=1)")
    reward.errorbar([m["eval_step"] for m in evals], [m["eval_reward"] for m in evals],
                    yerr=[m["eval_reward_ci95"] for m in evals], fmt="o-", capsize=3, color="tab:orange",
                    label="held-out reward (64 tasks, T=0, 95% CI)")
    reward.set_xlabel("step")
    reward.set_ylabel("LCS-ratio reward")
    reward.legend()
    reward.grid(alpha=0.3)
    kl.plot([m["step"] for m in steps], [m["opd/kl"] for m in steps], "o-", color="tab:red")
    kl.set_xlabel("step")
    kl.set_ylabel("per-token reverse KL to the teacher (nats)")
    kl.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--png", type=Path, default=Path("benchmarks/opd_reverse_text.png"))
    parser.add_argument("--load", type=Path, help="load samples: `unix-time load1 load5 load15` per line")
    args = parser.parse_args()
    folder = RLFolder(args.run_dir)
    records = folder.metrics.read()
    steps = [m for m in records if "step" in m and "reward" in m]
    evals = [m for m in records if "eval_reward" in m]
    trained = folder.trainer_metrics.read()
    print("held-out reward (same tasks each time):")
    for m in evals:
        half = m["eval_reward_ci95"]
        print(f"  step {m['eval_step']:3d} (policy {m['policy_version']}): {m['eval_reward']:.3f} ± {half:.3f} "
              f"[{m['eval_reward'] - half:.3f}, {m['eval_reward'] + half:.3f}] (n={m['eval_n']})")
    delta, lo, hi = gain(evals[0], evals[-1])
    print(f"gain: {delta:+.3f}, 95% interval [{lo:+.3f}, {hi:+.3f}]")
    print("per step: reward, per-token KL, teacher / student logprob, completion tokens, truncation:")
    for m in steps:
        print(f"  {m['step']:3d}: {m['reward']:.3f}  kl {m['opd/kl']:.3f}  teacher {m['opd/teacher_logprob']:.2f}  "
              f"student {m['opd/student_logprob']:.2f}  tokens {m['completion_tokens_mean']:.1f}  "
              f"truncated {m['truncation_rate']:.2f}")
    generation = statistics.fmean(m["generation_s"] for m in steps)
    scoring = statistics.fmean(m["opd/score_s"] for m in steps)
    training = statistics.fmean(m["seconds"] for m in trained) if trained else float("nan")
    wall = records[-1]["time"] - records[0]["time"]
    print(f"seconds per step (mean): generation + teacher scoring {generation:.1f} (scoring {scoring:.1f}), "
          f"training {training:.1f}, wall {wall / max(len(steps), 1):.1f}")
    print(f"wall time from the first held-out evaluation to the last record: {wall:.0f} s ({wall / 60:.1f} min)")
    if args.load:
        start, end = records[0]["time"] - 600, records[-1]["time"]
        loads = [float(line.split()[1]) for line in args.load.read_text().splitlines()
                 if line.split() and start <= float(line.split()[0]) <= end]
        if loads:
            print(f"machine load (1-min average, 2 cores) during the run: mean {statistics.fmean(loads):.1f}, "
                  f"min {min(loads):.1f}, max {max(loads):.1f} ({len(loads)} samples)")
    draw(args.png, steps, evals)
    plot_run(args.run_dir)
    print(f"wrote {args.png} and {folder.plots}/")


if __name__ == "__main__":
    main()
