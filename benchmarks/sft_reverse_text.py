"""Report of a reverse-text run on a disjoint held-out split (`configs/sft/reverse_text_recipe.toml`; the OPD and
SFT-then-RL reports read their runs with it too): held-out exact match before and after on the same tasks, with
paired 95% intervals, the larger effects behind it (character-level LCS ratio, exact match by phrase length), a
check that no held-out phrase (nor a reordering of one) is among the run's training phrases, and a plot.

Reads the run folder only: the held-out traces of every evaluation (`evals/<env>/traces/step-N.jsonl`: the same
tasks each time, temperature 0), the run's config (its training taskset, rebuilt here for the overlap check) and the
trainer's records (`trainer_metrics.jsonl`: an SFT step's loss, token accuracy and perplexity).

    python benchmarks/sft_reverse_text.py outputs/sft/reverse-text-recipe [--png benchmarks/sft_reverse_text.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tracegym.core.interval import MeanCI, mean_ci
from tracegym.core.trace import Trace
from tracegym.envs.registry import load_taskset
from tracegym.tasksets.reverse_text import lcs_ratio
from tracegym.train.rl_folder import RLFolder
from tracegym.train.roles import load_config

Evaluation = dict[str, Trace]
"""One held-out evaluation: its traces by task id."""


def evaluations(run_dir: Path) -> dict[int, Evaluation]:
    """Every held-out evaluation of the run's (first) held-out env, by step."""
    folders = sorted((run_dir / "evals").glob("*/traces"))
    if not folders:
        raise SystemExit(f"{run_dir / 'evals'} holds no held-out traces")
    out = {}
    for path in sorted(folders[0].glob("step-*.jsonl")):
        traces = [Trace.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
        out[int(path.stem.removeprefix("step-"))] = {t.task_key: t for t in traces}
    return out


def exact(trace: Trace) -> float:
    return float(trace.last_reply.strip() == str(trace.task.answer))


def lcs(trace: Trace) -> float:
    return lcs_ratio(trace.last_reply.strip(), str(trace.task.answer))


def words(trace: Trace) -> int:
    return len(str(trace.task.prompt).split())


def figure(evaluation: Evaluation, score: Any = exact, keep: Any = None) -> MeanCI:
    return mean_ci([score(t) for t in evaluation.values() if keep is None or keep(t)])


def paired_gain(before: Evaluation, after: Evaluation, score: Any = exact) -> MeanCI:
    """The per-task change of `score` on the tasks both evaluations share, with its 95% interval."""
    shared = sorted(before.keys() & after.keys())
    return mean_ci([score(after[k]) - score(before[k]) for k in shared])


def overlap(run_dir: Path, evaluation: Evaluation) -> tuple[int, int, int, int]:
    """(training phrases, held-out phrases among them, held-out phrases whose words in another order are among
    them, held-out phrases inside a longer training phrase), over every training env of the run."""
    config = load_config(run_dir)
    phrases = {str(row.prompt) for env in config.orchestrator.train.envs
               for row in load_taskset(env.id, dict(env.options))}
    word_sets = {tuple(sorted(p.split())) for p in phrases}
    held_out = {str(t.task.prompt) for t in evaluation.values()}
    padded = [f" {p} " for p in phrases]
    return (len(phrases), len(held_out & phrases),
            sum(tuple(sorted(p.split())) in word_sets for p in held_out),
            sum(any(f" {p} " in q for q in padded) for p in held_out))


def overlap_line(name: str, run_dir: Path, evaluation: Evaluation) -> str:
    phrases, same, reordered, inside = overlap(run_dir, evaluation)
    return (f"{name}training phrases: {phrases} distinct; held-out phrases among them: {same}; reorderings among "
            f"them: {reordered}; held-out phrases inside a longer training phrase (shared words): {inside} of "
            f"{len({t.task.prompt for t in evaluation.values()})}")


def fmt(estimate: MeanCI) -> str:
    return (f"{estimate.mean:.3f} [{estimate.mean - estimate.half_width:.3f}, "
            f"{estimate.mean + estimate.half_width:.3f}] (n={estimate.n})")


def signed(estimate: MeanCI) -> str:
    return (f"{estimate.mean:+.3f} [{estimate.mean - estimate.half_width:+.3f}, "
            f"{estimate.mean + estimate.half_width:+.3f}] (n={estimate.n})")


def table(evals: dict[int, Evaluation]) -> list[str]:
    """Markdown rows: each evaluation's exact match, LCS ratio and exact match by phrase length."""
    lengths = sorted({words(t) for e in evals.values() for t in e.values()})
    head = ["step", "exact match [95%]", "LCS ratio [95%]", *[f"exact, {n} word(s)" for n in lengths]]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for step, evaluation in sorted(evals.items()):
        by_length = [fmt(figure(evaluation, exact, lambda t, n=n: words(t) == n)) for n in lengths]
        rows.append(f"| {step} | {fmt(figure(evaluation))} | {fmt(figure(evaluation, lcs))} | "
                    + " | ".join(by_length) + " |")
    return rows


def gains(evals: dict[int, Evaluation], first: int | None = None) -> list[str]:
    """The paired gains from the first evaluation (or `first`) to the last."""
    steps = sorted(evals)
    start, end = evals[steps[0] if first is None else first], evals[steps[-1]]
    lines = [f"exact match gain {steps[0] if first is None else first} -> {steps[-1]} (paired): "
             f"{signed(paired_gain(start, end))}",
             f"LCS ratio gain (paired): {signed(paired_gain(start, end, lcs))}"]
    for n in sorted({words(t) for t in end.values()}):
        keys = {k for k, t in end.items() if words(t) == n}
        part = paired_gain({k: start[k] for k in keys if k in start}, {k: end[k] for k in keys})
        lines.append(f"exact match gain, {n}-word phrases: {signed(part)}")
    return lines


def examples(evaluation: Evaluation, count: int = 6) -> list[str]:
    """A few held-out replies, right ones first."""
    ordered = sorted(evaluation.values(), key=lambda t: -exact(t))[:count]
    return [f"{t.task.prompt!r} -> {t.last_reply.strip()!r} ({'exact' if exact(t) else 'wrong'})" for t in ordered]


def draw_held_out(ax: Any, evals: dict[int, Evaluation], label: str = "") -> None:
    steps = sorted(evals)
    for score, name, color in ((exact, "exact match", "tab:blue"), (lcs, "LCS ratio", "tab:green")):
        estimates = [figure(evals[s], score) for s in steps]
        ax.errorbar(steps, [e.mean for e in estimates], yerr=[e.half_width for e in estimates], fmt="o-",
                    capsize=3, color=color, label=f"{label}held-out {name} (95% interval)")
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out score (same tasks, T=0)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def draw(png: Path, trainer: list[dict[str, Any]], evals: dict[int, Evaluation]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in trainer if "loss" in r]
    left.plot(steps, [r["loss"] for r in trainer if "loss" in r], color="tab:gray", label="loss (mean NLL)")
    left.set_xlabel("step")
    left.set_ylabel("training loss")
    accuracy = left.twinx()
    accuracy.plot([r["step"] for r in trainer if "token_accuracy" in r],
                  [r["token_accuracy"] for r in trainer if "token_accuracy" in r], color="tab:purple",
                  label="token accuracy")
    accuracy.set_ylim(0, 1)
    accuracy.set_ylabel("token accuracy (training batch)")
    fig.legend(loc="upper left", fontsize=8)
    draw_held_out(right, evals)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def trainer_lines(trainer: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in trainer if "loss" in r]
    if not rows:
        return []
    fields = [k for k in ("loss", "token_accuracy", "perplexity") if k in rows[0]]
    marks = sorted({0, len(rows) // 4, len(rows) // 2, 3 * len(rows) // 4, len(rows) - 1})
    return [f"step {rows[i]['step']}: " + ", ".join(f"{k} {rows[i][k]:.3f}" for k in fields) for i in marks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--png", type=Path, default=Path("benchmarks/sft_reverse_text.png"))
    args = parser.parse_args()
    evals = evaluations(args.run_dir)
    trainer = RLFolder(args.run_dir).trainer_metrics.read()
    last = evals[max(evals)]
    print(overlap_line("", args.run_dir, last))
    print("\n".join(table(evals)))
    print("\n".join(gains(evals)))
    print("\n".join(trainer_lines(trainer)))
    print("\n".join(examples(last)))
    draw(args.png, trainer, evals)
    print(f"wrote {args.png}")
    print(json.dumps({"eval_steps": sorted(evals), "held_out_tasks": len(last)}))


if __name__ == "__main__":
    main()
