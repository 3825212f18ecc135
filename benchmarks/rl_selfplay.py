"""Benchmark report of a multi-agent RL run (`tracegym rl @ configs/rl/kuhn_poker_selfplay.toml`): the learner
against a fixed copy of the base model on held-out deals, before and after training, on the same deals.

Reads the run folder only: the held-out episodes of the first and last evaluation (`evals/<env>/`, each deal
played once with the learner in each seat, the opponent always the base model), the step records
(`metrics.jsonl`) and the trainer's (`trainer_metrics.jsonl`). Prints, per evaluation, the learner's mean payoff
and win / loss / forfeit rates with 95% intervals; the change from the first evaluation to the last as a paired
difference over the same (deal, seat) pairs with its 95% interval; seconds per step; and draws the curve
(`tracegym plot`'s, with the held-out payoff per evaluation).

    .venv/bin/python benchmarks/rl_selfplay.py outputs/rl/<run-id> [--env kuhn-poker]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tracegym.core.episode import Episode, Outcome
from tracegym.core.interval import mean_ci
from tracegym.train.plots import plot_run
from tracegym.train.rl_folder import RLFolder


def learner_results(episodes: list[Episode]) -> dict[tuple[str, str], tuple[float | None, Outcome | None]]:
    """(deal key, learner seat) -> (learner's payoff, outcome) of one held-out evaluation."""
    out = {}
    for episode in episodes:
        for member in episode.trainable_members:
            out[(episode.task_key, member)] = (episode.rewards.get(member), episode.outcomes.get(member))
    return out


def describe(results: dict) -> str:
    payoffs = [r for r, _ in results.values() if r is not None]
    outcomes = [o for _, o in results.values()]
    payoff = mean_ci(payoffs)
    parts = [f"payoff {payoff.mean:+.3f} ± {payoff.half_width:.3f} (n={payoff.n})"]
    for outcome in (Outcome.WIN, Outcome.LOSS, Outcome.FORFEIT):
        rate = mean_ci([float(o == outcome) for o in outcomes])
        parts.append(f"{outcome.value} {rate.mean:.3f} ± {rate.half_width:.3f}")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--env", default="kuhn-poker")
    args = parser.parse_args()
    folder = RLFolder(args.run_dir)
    results = {step: learner_results(folder.step_log(step, held_out=args.env).read().episodes)
               for step in folder.steps(held_out=args.env)}
    print(f"held-out evaluations of {args.env} (learner vs the base model, each deal from both seats):")
    for step, result in results.items():
        print(f"  step {step:3d}: {describe(result)}")
    first, last = min(results), max(results)
    pairs = [(results[first][k][0], results[last][k][0]) for k in results[first] if k in results[last]]
    diff = mean_ci([b - a for a, b in pairs if a is not None and b is not None])
    print(f"change step {first} -> {last}: payoff {diff.mean:+.3f}, 95% interval [{diff.mean - diff.half_width:+.3f}, "
          f"{diff.mean + diff.half_width:+.3f}] (paired over {diff.n} (deal, seat) pairs)")
    steps = [m for m in folder.metrics.read() if "step" in m and "generation_s" in m]
    trainer = [m for m in folder.trainer_metrics.read() if "train_s" in m]
    times = [m["time"] for m in steps]
    wall = (max(times) - min(times)) / (len(times) - 1) if len(times) > 1 else float("nan")
    print(f"seconds per step: wall {wall:.1f} (between step records), generation "
          f"{statistics.fmean(m['generation_s'] for m in steps):.1f}, training "
          f"{statistics.fmean(m['train_s'] for m in trainer):.1f}, weight sync "
          f"{statistics.fmean(m['weight_sync_s'] for m in trainer):.2f} (means over {len(steps)} steps)")
    learner = [(m["step"], m.get("learner/win_rate"), m.get("learner/forfeit_rate")) for m in steps]
    print("train learner win / forfeit rate per step:", json.dumps([(s, round(w or 0, 2), round(f or 0, 2))
                                                                    for s, w, f in learner]))
    print("plots:", ", ".join(str(p) for p in plot_run(args.run_dir)))


if __name__ == "__main__":
    main()
