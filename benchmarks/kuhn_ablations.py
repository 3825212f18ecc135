"""Benchmark report: Kuhn poker self-play ablations (issue 39, item 2): RAE against group-mean advantages, and a
pool of past checkpoints against a fixed opponent, each the shipped exploitability run otherwise.

Every variant is `configs/rl/kuhn_poker_exploitability.toml` with one change (the held-out evaluations dropped so
that each run fits ~15 min on a 2-core CPU; the final policy is measured exactly instead):

- `rae-selfplay`: the config as shipped (every seat the policy, SPIRAL's role-conditioned baseline);
- `group-mean-selfplay`: `[orchestrator.advantage] name = "group_mean"` (each deal's two episodes, per seat);
- `rae-pool`: one learner seat per episode (`learner = "alternate"`) against a past policy drawn from the run's
  pool (the base model, then each checkpoint);
- `rae-fixed`: one learner seat against the base model every episode.

Per step, from each run's metrics: the learner's completion length (tokens) and its legal-move rate (the share of
its episodes it did not forfeit: an illegal reply ends the hand), with the train reward; per run, the exact
exploitability of each checkpoint's policy, read from 64 replies sampled at each information set as the referee
reads them, with a 95% bootstrap interval (`benchmarks/kuhn_exploitability.py`), next to the base model's.

    .venv/bin/python benchmarks/kuhn_ablations.py run [--steps 12] [--only rae-pool ...]   # the runs, in order
    .venv/bin/python benchmarks/kuhn_ablations.py report [--read-steps 12] [--plot benchmarks/kuhn_ablations.png]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

sys.path.insert(0, str(Path(__file__).parent))
from kuhn_exploitability import read_models, replies_exploitability

from tracegym.tasksets.kuhn_exploitability import exploitability

CONFIG = Path(__file__).parents[1] / "configs" / "rl" / "kuhn_poker_exploitability.toml"
OUTPUT = Path("outputs/kuhn-ablations")
SAMPLES = 64
"""Replies sampled per information set to read a checkpoint's policy (`kuhn_exploitability.replies_exploitability`)."""
VARIANTS: dict[str, dict[str, Any]] = {
    "rae-selfplay": {},
    "group-mean-selfplay": {"advantage": {"name": "group_mean"}},
    "rae-pool": {"play": {"learner": "alternate", "opponent": "pool"}},
    "rae-fixed": {"play": {"learner": "alternate", "opponent": "base"}},
}


def variant_config(change: dict[str, Any], steps: int) -> dict[str, Any]:
    """The shipped exploitability config with `change` applied and no held-out evaluations."""
    config = tomllib.loads(CONFIG.read_text())
    config["steps"] = steps
    orchestrator = config["orchestrator"]
    orchestrator.pop("eval", None)
    if "advantage" in change:
        orchestrator["advantage"] = change["advantage"]
    if "play" in change:
        orchestrator["train"]["envs"][0]["play"] = change["play"]
    return config


def run(name: str, steps: int) -> Path:
    """One `tracegym rl` run of a variant; its folder."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    written = OUTPUT / f"{name}.toml"
    written.write_text(tomli_w.dumps(variant_config(VARIANTS[name], steps)))
    command = [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(written), "--output-dir", str(OUTPUT),
               "--run-id", name]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=False)
    return OUTPUT / name


def per_step(folder: Path) -> list[dict[str, float]]:
    """Per trained step: reward, the learner's completion length and legal-move rate."""
    rows = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        metrics = json.loads(line)
        if "step" not in metrics or "learner/forfeit_rate" not in metrics:
            continue
        rows.append({"step": metrics["step"], "reward": metrics.get("learner/reward", metrics.get("reward")),
                     "completion_tokens": metrics.get("completion_tokens_mean"),
                     "legal_rate": 1 - metrics["learner/forfeit_rate"]})
    return rows


def report(plot_path: Path, steps: list[int]) -> dict[str, Any]:
    """Every variant's per-step figures and the exploitability of the base model (read once: every variant starts
    from it) and of each variant's checkpoints at `steps` (replies and prefix readings)."""
    base_policies, base_replies = read_models(None, SAMPLES)
    labels = {f"step {step}" for step in steps}
    out: dict[str, Any] = {}
    for name in VARIANTS:
        folder = OUTPUT / name
        if not (folder / "metrics.jsonl").exists():
            continue
        policies, replies = read_models(folder, SAMPLES, labels)
        policies, replies = base_policies | policies, base_replies | replies
        out[name] = {"steps": per_step(folder),
                     "exploitability": {label: replies_exploitability(replies[label]) for label in replies},
                     "prefix_exploitability": {label: float(exploitability(read["prefix"].strategy))
                                               for label, read in policies.items()}}
    plot(out, plot_path)
    return out


def plot(out: dict[str, Any], path: Path) -> None:
    """Legal-move rate, completion length and exploitability per step, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, figures in out.items():
        steps = [row["step"] for row in figures["steps"]]
        axes[0].plot(steps, [row["legal_rate"] for row in figures["steps"]], marker="o", label=name)
        axes[1].plot(steps, [row["completion_tokens"] for row in figures["steps"]], marker="o", label=name)
        points = sorted((0 if label == "base" else int(label.split()[1]), *value[:3])
                        for label, value in figures["exploitability"].items())
        axes[2].errorbar([p[0] for p in points], [p[1] for p in points], capsize=3, marker="o", label=name,
                         yerr=[[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]])
    for ax, title in zip(axes, ("learner legal-move rate", "completion tokens", "exploitability (replies)"),
                         strict=True):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["run", "report"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), help="these variants only")
    parser.add_argument("--read-steps", nargs="+", type=int, default=[12],
                        help="report: the checkpoints whose policy is read (each ~3 min on this CPU)")
    parser.add_argument("--plot", type=Path, default=Path("benchmarks/kuhn_ablations.png"))
    parser.add_argument("--json", type=Path, default=Path("benchmarks/kuhn_ablations.json"))
    args = parser.parse_args()
    if args.action == "run":
        for name in args.only or VARIANTS:
            run(name, args.steps)
        return
    out = report(args.plot, args.read_steps)
    args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
