"""Report of an SFT run (`configs/sft/reverse_text_teacher.toml`): held-out exact match before and after, the
training loss, a curve, and the trained student's merged weights.

Reads the run folder: the held-out evaluations in `metrics.jsonl` (exact-match accuracy on the same 64 held-out
tasks each time, with its 95% interval) and the trainer's loss per step in `trainer_metrics.jsonl`; writes
`RUN_DIR/plots/sft_exact.png` and, from the newest checkpoint, the student with its adapter merged in
(`RUN_DIR/merged/`: a model directory vLLM serves, e.g. as an `opd` run's teacher). With `--traces FILE` (a
`tracegym eval` of those weights on the held-out tasks) it splits the accuracy into phrases the run trained on
and phrases it never saw.

    python benchmarks/sft_reverse_text.py outputs/sft/<run-id> [--traces outputs/<eval-run>/traces.jsonl]
"""

from __future__ import annotations

import argparse
import math
import shutil
from pathlib import Path

from tracegym.core.interval import Z_95, mean_ci
from tracegym.core.trace import Trace
from tracegym.envs.registry import load_taskset
from tracegym.models.embedded import embedded_model_dir
from tracegym.train.rl_folder import RLFolder
from tracegym.train.roles import load_config


def evaluations(folder: RLFolder) -> list[dict]:
    return [r for r in folder.metrics.read() if "eval_step" in r]


def gain(first: dict, last: dict) -> tuple[float, float, float]:
    """The change of the mean and its 95% interval (unpaired normal approximation, conservative for paired tasks)."""
    def se(record: dict) -> float:
        return record["eval_reward_ci95"] / Z_95

    diff = last["eval_reward"] - first["eval_reward"]
    half = Z_95 * math.sqrt(se(first) ** 2 + se(last) ** 2)
    return diff, diff - half, diff + half


def plot(folder: RLFolder, evals: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = [(r["step"], r["loss"]) for r in folder.trainer_metrics.read() if "loss" in r]
    fig, left = plt.subplots(figsize=(7, 4))
    left.plot(*zip(*losses, strict=True), color="tab:gray", label="training loss (mean NLL per answer token)")
    left.set_xlabel("step")
    left.set_ylabel("loss")
    right = left.twinx()
    right.errorbar([r["eval_step"] for r in evals], [r["eval_reward"] for r in evals],
                   yerr=[r["eval_reward_ci95"] for r in evals], color="tab:blue", marker="o", capsize=3,
                   label="held-out exact match (95% interval)")
    right.set_ylabel("held-out exact match")
    right.set_ylim(0, 1)
    fig.legend(loc="upper center")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def merge(run_dir: Path) -> Path:
    """The newest checkpoint's student with its adapter merged in, as a model directory (weights, config,
    tokenizer) at `run_dir/merged`."""
    from tracegym.train.trainer import build_trainer

    folder = RLFolder(run_dir)
    checkpoint = folder.latest_checkpoint()
    if checkpoint is None:
        raise SystemExit(f"{run_dir} has no complete checkpoint")
    config = load_config(run_dir)
    trainer = build_trainer(config.trainer)
    trainer.load(checkpoint)
    out = trainer.save_merged(run_dir / "merged")
    base = Path(config.trainer.model or embedded_model_dir())
    for item in base.iterdir():
        if item.is_file() and item.name != "model.safetensors":
            shutil.copy2(item, out / item.name)
    return out


def seen_split(run_dir: Path, traces_path: Path) -> str:
    """Exact match of an eval's traces on phrases in the run's training set and on the others."""
    config = load_config(run_dir)
    train = config.orchestrator.train.envs[0]
    seen = {row.prompt for row in load_taskset(train.id, train.options)}
    traces = [Trace.model_validate_json(line) for line in traces_path.read_text().splitlines() if line.strip()]
    lines = []
    for name, group in (("trained on", [t for t in traces if t.task.prompt in seen]),
                        ("never seen", [t for t in traces if t.task.prompt not in seen])):
        estimate = mean_ci([float(t.last_reply.strip() == t.task.answer) for t in group])
        if estimate.n:
            lines.append(f"{name}: {estimate.mean:.3f} ± {estimate.half_width:.3f} over {estimate.n} tasks")
    return "; ".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--traces", type=Path, help="traces.jsonl of a `tracegym eval` of the merged weights")
    parser.add_argument("--no-merge", action="store_true", help="skip writing the merged weights")
    args = parser.parse_args()
    folder = RLFolder(args.run_dir)
    evals = evaluations(folder)
    if not evals:
        raise SystemExit(f"{args.run_dir / 'metrics.jsonl'} holds no held-out evaluation")
    print("| step | held-out exact match | 95% interval |\n|---:|---:|---|")
    for r in evals:
        lo, hi = r["eval_reward"] - r["eval_reward_ci95"], r["eval_reward"] + r["eval_reward_ci95"]
        print(f"| {r['eval_step']} | {r['eval_reward']:.3f} ({r['eval_n']} tasks) | [{lo:.3f}, {hi:.3f}] |")
    diff, lo, hi = gain(evals[0], evals[-1])
    print(f"gain {evals[0]['eval_step']} -> {evals[-1]['eval_step']}: {diff:+.3f}, 95% interval [{lo:+.3f}, {hi:+.3f}]")
    losses = [r["loss"] for r in folder.trainer_metrics.read() if "loss" in r]
    seconds = [r["train_s"] for r in folder.trainer_metrics.read() if "train_s" in r]
    if losses:
        print(f"training loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps; "
              f"mean train_s {sum(seconds) / len(seconds):.1f}")
    plot(folder, evals, args.run_dir / "plots" / "sft_exact.png")
    print(f"curve: {args.run_dir / 'plots' / 'sft_exact.png'}")
    if args.traces:
        print(seen_split(args.run_dir, args.traces))
    if not args.no_merge:
        print(f"merged weights: {merge(args.run_dir)}")


if __name__ == "__main__":
    main()
