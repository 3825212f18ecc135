"""Benchmark report of a proposer-solver RL run (`tracegym rl @ configs/rl/propose_arithmetic.toml`): the solvers'
held-out score and the proposer's validity rate before and after training, on the same held-out rows.

Reads the run folder only: the held-out episodes of the first and last evaluation (`evals/propose-arithmetic/`:
each row's proposer writes a problem for a fixed held-out prompt, and its four solvers attempt the row's fixed
problem) and each training step's episodes. Prints, per evaluation, the solvers' score (per problem, the mean of
its four solvers; then the mean over problems with its 95% interval: problems are the unit, so the interval is not
narrowed by four correlated draws) and the proposer's validity rate (95% interval over prompts), with the reasons
for invalid proposals; the change first -> last as a paired difference over the same rows with its 95% interval;
per training step the validity rate, the solvers' pass rate on valid proposals and the proposer's mean reward;
and draws `benchmarks/proposer_solver.png`.

    .venv/bin/python benchmarks/proposer_solver.py outputs/rl/<run-id> [--env propose-arithmetic]
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from pathlib import Path

from tracegym.core.episode import Episode
from tracegym.core.interval import MeanCI, mean_ci
from tracegym.envs.proposer_solver import PROPOSER
from tracegym.train.rl_folder import RLFolder

PLOT = Path(__file__).with_suffix(".png")
REASONS = ("invalid_format", "invalid_refused", "invalid_answer", "invalid_off_prompt")


def solver_score(episode: Episode) -> float | None:
    """The mean reward of an episode's solvers that attempted (None: none did, or the episode failed)."""
    scores = [episode.rewards[m] for m in episode.members
              if m != PROPOSER and episode.member_metrics.get(m, {}).get("attempted") == 1.0]
    return statistics.fmean(s for s in scores if s is not None) if scores and episode.ok else None


def valid(episode: Episode) -> float | None:
    """1.0 when the episode's proposal was valid (None: the episode failed before it was judged)."""
    return episode.member_metrics.get(PROPOSER, {}).get("valid") if episode.ok else None


def per_row(episodes: list[Episode], measure) -> dict[str, float]:
    return {e.task_key: value for e in episodes if (value := measure(e)) is not None}


def interval(ci: MeanCI) -> str:
    assert ci.mean is not None
    return f"{ci.mean:.3f} [{ci.mean - ci.half_width:.3f}, {ci.mean + ci.half_width:.3f}] (n={ci.n})"


def paired(before: dict[str, float], after: dict[str, float]) -> str:
    diff = mean_ci([after[k] - before[k] for k in before if k in after])
    assert diff.mean is not None
    return (f"{diff.mean:+.3f}, 95% interval [{diff.mean - diff.half_width:+.3f}, {diff.mean + diff.half_width:+.3f}] "
            f"(paired over {diff.n} rows)")


def step_figures(episodes: list[Episode]) -> tuple[float, float | None, float]:
    """A training step's validity rate, solvers' pass rate on valid proposals, and proposer's mean reward."""
    done = [e for e in episodes if e.ok]
    validity = statistics.fmean(valid(e) or 0.0 for e in done)
    passes = [s for e in done if valid(e) and (s := solver_score(e)) is not None]
    reward = statistics.fmean(float(e.rewards[PROPOSER] or 0.0) for e in done)
    return validity, statistics.fmean(passes) if passes else None, reward


def plot(held: dict[int, tuple[MeanCI, MeanCI]], steps: dict[int, tuple[float, float | None, float]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"step {s}" for s in held]
    for offset, (name, index) in enumerate((("solver held-out score", 0), ("proposal validity", 1))):
        xs = [i + (offset - 0.5) * 0.35 for i in range(len(held))]
        cis = [v[index] for v in held.values()]
        left.bar(xs, [c.mean or 0.0 for c in cis], width=0.35, yerr=[c.half_width for c in cis], capsize=4,
                 label=name)
    left.set_xticks(range(len(held)), labels)
    left.set_ylim(0, 1)
    left.set_title("held out (same rows), 95% intervals")
    left.legend()
    xs = list(steps)
    right.plot(xs, [v[0] for v in steps.values()], "o-", label="validity rate")
    right.plot(xs, [v[1] if v[1] is not None else float("nan") for v in steps.values()], "s-",
               label="solver pass rate (valid proposals)")
    right.plot(xs, [v[2] for v in steps.values()], "^-", label="proposer reward")
    right.set_xlabel("training step")
    right.set_title("training episodes")
    right.legend()
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=120)
    plt.close(fig)
    return PLOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--env", default="propose-arithmetic")
    args = parser.parse_args()
    folder = RLFolder(args.run_dir)
    evals = {step: folder.step_log(step, held_out=args.env).read().episodes for step in folder.steps(held_out=args.env)}
    scores = {step: per_row(eps, solver_score) for step, eps in evals.items()}
    validity = {step: per_row(eps, valid) for step, eps in evals.items()}
    held = {}
    print(f"held-out evaluations of {args.env}:")
    for step, episodes in evals.items():
        held[step] = (mean_ci(list(scores[step].values())), mean_ci(list(validity[step].values())))
        reasons = Counter(r for e in episodes if e.ok for r in REASONS if e.member_metrics[PROPOSER].get(r))
        failed = sum(not e.ok for e in episodes)
        print(f"  step {step:3d}: solver score {interval(held[step][0])}; proposal validity "
              f"{interval(held[step][1])}; invalid by reason {dict(reasons)}; episodes failed {failed}")
    first, last = min(evals), max(evals)
    if first == last:
        print(f"one evaluation only (step {first}): the run ended before its last evaluation")
    else:
        print(f"change step {first} -> {last}: solver score {paired(scores[first], scores[last])}; validity "
              f"{paired(validity[first], validity[last])}")
    steps = {step: step_figures(episodes) for step in folder.steps()
             if (episodes := folder.step_log(step).read().episodes)}
    print("training steps (validity, solver pass rate on valid proposals, proposer reward):")
    for step, (v, p, r) in steps.items():
        print(f"  step {step:3d}: {v:.3f}  {'-' if p is None else f'{p:.3f}'}  {r:+.3f}")
    print("plot:", plot(held, steps))


if __name__ == "__main__":
    main()
