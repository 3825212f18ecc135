"""Report of an on-policy distillation run (`tracegym rl @ configs/opd/reverse_text.toml`) from a teacher chosen by
held-out exact match: the teacher's and the student's held-out exact match on the same disjoint held-out tasks
(paired 95% intervals), the student's per-token reverse KL to the teacher per step, and a plot.

Reads the run folders only: the OPD run's held-out traces and step records (`opd/kl`: the mean over the student's
sampled tokens of student logprob - teacher logprob, a per-token estimate of KL(student || teacher)), and the
teacher's own run (the SFT run whose merged weights it is), whose last held-out evaluation is the teacher's score
on the same tasks.

    python benchmarks/opd_reverse_text.py outputs/opd/reverse-text-opd outputs/sft/reverse-text-recipe \
        [--png benchmarks/opd_reverse_text.png]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from sft_reverse_text import draw_held_out, evaluations, examples, figure, fmt, gains, overlap_line, table

from tracegym.train.rl_folder import RLFolder


def kl_steps(run_dir: Path) -> list[dict[str, Any]]:
    return [m for m in RLFolder(run_dir).metrics.read() if "step" in m and "opd/kl" in m]


def kl_trend(steps: list[dict[str, Any]]) -> str:
    """The KL's least-squares slope per step, and its mean over the first and the last third of the steps."""
    xs, ys = [m["step"] for m in steps], [m["opd/kl"] for m in steps]
    slope = statistics.linear_regression(xs, ys).slope if len(xs) > 1 else float("nan")
    third = max(len(ys) // 3, 1)
    return (f"reverse KL per token: first third {statistics.fmean(ys[:third]):.3f}, last third "
            f"{statistics.fmean(ys[-third:]):.3f}, slope {slope:+.4f} nats per step")


def draw(png: Path, steps: list[dict[str, Any]], evals: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (kl, held_out) = plt.subplots(1, 2, figsize=(11, 4))
    kl.plot([m["step"] for m in steps], [m["opd/kl"] for m in steps], "o-", color="tab:red")
    kl.set_xlabel("step")
    kl.set_ylabel("per-token reverse KL to the teacher (nats)")
    kl.grid(alpha=0.3)
    draw_held_out(held_out, evals, "student ")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("teacher_run", type=Path, help="the run whose merged weights are the teacher")
    parser.add_argument("--png", type=Path, default=Path("benchmarks/opd_reverse_text.png"))
    args = parser.parse_args()
    evals, teacher = evaluations(args.run_dir), evaluations(args.teacher_run)
    teacher_last = teacher[max(teacher)]
    shared = teacher_last.keys() & evals[max(evals)].keys()
    print(f"teacher (step {max(teacher)} of {args.teacher_run}) on the same {len(shared)} held-out tasks: "
          f"exact match {fmt(figure({k: teacher_last[k] for k in shared}))}")
    print(overlap_line("student's ", args.run_dir, evals[max(evals)]))
    print("\n".join(table(evals)))
    print("\n".join(gains(evals)))
    steps = kl_steps(args.run_dir)
    for m in steps:
        print(f"  step {m['step']:3d}: kl {m['opd/kl']:.3f}  teacher {m['opd/teacher_logprob']:.2f}  "
              f"student {m['opd/student_logprob']:.2f}  train exact {m.get('reward', float('nan')):.3f}")
    print(kl_trend(steps))
    print("\n".join(examples(evals[max(evals)])))
    draw(args.png, steps, evals)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
