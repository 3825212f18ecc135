"""Plots: PNG curves of an RL run from its metrics files (train reward, held-out reward, lengths, staleness; a
multi-agent run's win rates per seat, for the learner and held out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracegym.core.errors import UsageError
from tracegym.train.rl_folder import RLFolder

TRAIN_COLOR = "tab:blue"
HELD_OUT_COLORS = ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")


def held_out_colors(envs: list[str]) -> dict[str, str]:
    """A colour per held-out env, never the train curve's (cycling when there are more envs than colours)."""
    return {env: HELD_OUT_COLORS[i % len(HELD_OUT_COLORS)] for i, env in enumerate(sorted(envs))}


def evaluated_policy(record: dict[str, Any]) -> int:
    """The step a held-out record is drawn at: the policy version it ran on (`policy_version`: the policy trained on
    that many steps), which in a run from before evaluations waited for their policy may be older than its
    `eval_step`; its `eval_step` when it has no version."""
    return int(record.get("policy_version", record["eval_step"]))


def plot_run(run_dir: Path) -> list[Path]:
    """Write `plots/*.png` for the run; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    folder = RLFolder(run_dir)
    metrics = folder.metrics.read()
    if not metrics:
        raise UsageError(f"{run_dir} has no {folder.metrics.path.name} records to plot")
    steps = [m for m in metrics if "step" in m and "reward" in m]
    evals = [m for m in metrics if "eval_reward" in m]
    out = folder.plots
    out.mkdir(exist_ok=True)
    written = [_reward(out, steps, evals)]
    written.append(_series(out / "lengths.png", steps, "completion_tokens_mean", "completion tokens (mean)"))
    written.append(_series(out / "staleness.png", steps, "staleness", "staleness (steps)"))
    if any("opd/kl" in m for m in steps):  # an on-policy distillation run
        written.append(_series(out / "kl.png", steps, "opd/kl", "per-token reverse KL to the teacher"))
    if win_rate_keys(steps) or any("eval_win_rate" in m for m in evals):  # a multi-agent run
        written.append(_win_rates(out, steps, evals))
    trainer = folder.trained_steps()
    if trainer:
        written.append(_series(out / "loss.png", trainer, "loss", "trainer loss"))
    return written


def _reward(out: Path, steps: list[dict[str, Any]], evals: list[dict[str, Any]]) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([m["step"] for m in steps], [m["reward"] for m in steps], label="train reward", color=TRAIN_COLOR,
            alpha=0.6, linewidth=1)
    for env, color in held_out_colors(list({m["env"] for m in evals})).items():
        points = [m for m in evals if m["env"] == env]
        ax.errorbar([evaluated_policy(m) for m in points], [m["eval_reward"] for m in points],
                    yerr=[m.get("eval_reward_ci95", 0.0) for m in points], fmt="o-", capsize=3, color=color,
                    linewidth=2, label=f"held-out {env} (95% CI)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend()
    return _saved(fig, ax, out / "reward.png")


def _series(path: Path, records: list[dict[str, Any]], key: str, label: str) -> Path:
    import matplotlib.pyplot as plt

    points = [(m["step"], m[key]) for m in records if m.get(key) is not None and "step" in m]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot([p[0] for p in points], [p[1] for p in points], color="tab:green")
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    return _saved(fig, ax, path)


def win_rate_keys(steps: list[dict[str, Any]]) -> list[str]:
    """The training win-rate curves a run's step records hold: each seat's (`seat/<id>/win_rate`), then the
    learner's (`learner/win_rate`)."""
    keys = sorted({k for m in steps for k in m if k.startswith("seat/") and k.endswith("/win_rate")})
    return keys + (["learner/win_rate"] if any("learner/win_rate" in m for m in steps) else [])


def _win_rates(out: Path, steps: list[dict[str, Any]], evals: list[dict[str, Any]]) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key in win_rate_keys(steps):
        points = [(m["step"], m[key]) for m in steps if m.get(key) is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], label=key.removesuffix("/win_rate"),
                linewidth=2 if key.startswith("learner/") else 1, alpha=1.0 if key.startswith("learner/") else 0.6)
    for env, color in held_out_colors(list({m["env"] for m in evals if "eval_win_rate" in m})).items():
        held = [m for m in evals if m["env"] == env and m.get("eval_win_rate") is not None]
        ax.errorbar([evaluated_policy(m) for m in held], [m["eval_win_rate"] for m in held],
                    yerr=[m.get("eval_win_rate_ci95", 0.0) for m in held], fmt="o-", capsize=3, color=color,
                    linewidth=2, label=f"held-out {env} (95% CI)")
    ax.set_xlabel("step")
    ax.set_ylabel("win rate")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    return _saved(fig, ax, out / "win_rate.png")


def _saved(fig: Any, ax: Any, path: Path) -> Path:
    """A figure gridded, written to `path` and closed."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
