"""Report of the reverse-text recipe, SFT then RL on exact match (`configs/sft/reverse_text_recipe.toml`, then
`configs/rl/reverse_text_from_sft.toml`): held-out exact match through both stages on the same disjoint held-out
tasks, the RL stage's gain over the SFT checkpoint it started from (paired 95% interval), and a plot.

The RL run's first held-out evaluation (step 0) is the SFT stage's last weights on the same tasks, so the RL
stage's gain is paired task by task; the SFT run's step 0 is the base model.

    python benchmarks/sft_then_rl.py outputs/sft/reverse-text-recipe outputs/rl/reverse-text-from-sft \
        [--png benchmarks/sft_then_rl.png]

An SFT checkpoint other than the run's last is made servable (its LoRA adapter merged into the base model's
weights, as the trainer writes `weights/merged`) with

    python benchmarks/sft_then_rl.py --merge outputs/sft/reverse-text-recipe/checkpoints/step-000048 OUT_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sft_reverse_text import (
    draw_held_out,
    evaluations,
    exact,
    examples,
    fmt,
    gains,
    overlap_line,
    paired_gain,
    signed,
    table,
)

from tracegym.train.rl_folder import RLFolder


def draw(png: Path, sft: Any, rl: Any, steps: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offset = max(sft)
    fig, (held_out, train) = plt.subplots(1, 2, figsize=(11, 4))
    draw_held_out(held_out, {**sft, **{offset + s: e for s, e in rl.items()}})
    held_out.axvline(offset, color="black", linestyle=":", label="SFT -> RL")
    held_out.set_xlabel("step (SFT, then RL)")
    train.plot([m["step"] for m in steps], [m["reward"] for m in steps], "o-", color="tab:orange")
    train.set_xlabel("RL step")
    train.set_ylabel("train exact match (policy samples, T=1)")
    train.set_ylim(0, 1)
    train.grid(alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def merge_checkpoint(checkpoint: Path, out: Path) -> None:
    """Write `out`, a model folder: the embedded base model with `checkpoint`'s adapter merged, in bfloat16."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from tracegym.models.embedded import embedded_model_dir
    from tracegym.models.merge_extension import merged, read_adapter

    base_dir = embedded_model_dir()
    base = load_file(str(base_dir / "model.safetensors"))
    weights = dict(merged(base, read_adapter(checkpoint / "adapter"), torch.bfloat16))
    out.mkdir(parents=True, exist_ok=True)
    for extra in base_dir.iterdir():
        if extra.suffix != ".safetensors" and extra.is_file() and not extra.name.startswith("."):
            shutil.copy(extra, out / extra.name)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    if sys.argv[1:2] == ["--merge"]:
        merge_checkpoint(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sft_run", type=Path)
    parser.add_argument("rl_run", type=Path)
    parser.add_argument("--png", type=Path, default=Path("benchmarks/sft_then_rl.png"))
    parser.add_argument("--sft-step", type=int, help="the SFT checkpoint RL started from (default: the run's last)")
    args = parser.parse_args()
    sft, rl = evaluations(args.sft_run), evaluations(args.rl_run)
    if args.sft_step is not None:
        sft = {step: e for step, e in sft.items() if step <= args.sft_step}
    for name, run, evals in (("SFT", args.sft_run, sft), ("RL", args.rl_run, rl)):
        print(overlap_line(f"{name} ", run, evals[max(evals)]))
    print("SFT stage:\n" + "\n".join(table(sft)))
    print("RL stage (step 0 = the SFT checkpoint):\n" + "\n".join(table(rl)))
    print("RL stage: " + "; ".join(gains(rl)))
    base, last = sft[min(sft)], rl[max(rl)]
    print(f"SFT's last evaluation vs RL's step 0 (the same weights, served again): "
          f"{fmt(paired_gain(sft[max(sft)], rl[min(rl)]))}")
    print(f"whole recipe, base model -> RL's last: {signed(paired_gain(base, last, exact))}")
    steps = [m for m in RLFolder(args.rl_run).metrics.read() if "step" in m and "reward" in m]
    print("RL train exact match per step: " + " ".join(f"{m['reward']:.2f}" for m in steps))
    print("\n".join(examples(last)))
    draw(args.png, sft, rl, steps)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
