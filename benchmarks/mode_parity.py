"""Mode parity of RL: the same short reverse-text run synchronous (`max_async_steps = 0`) and asynchronous (the
shipped `max_async_steps = 1`), same seed, same 64 held-out tasks; held-out reward before and after each, the 95%
interval of the async - sync difference paired by task, and what each mode masked or filtered per step.

    .venv/bin/python benchmarks/mode_parity.py --run        # both runs, one after the other, then the report
    .venv/bin/python benchmarks/mode_parity.py              # the report of runs already in --output-dir

Each run is `tracegym rl @ configs/rl/reverse_text.toml --steps STEPS --orchestrator.eval.every 0
--checkpoint-every STEPS --orchestrator.tasks-per-step N --orchestrator.max-async-steps {0,1}` (held-out evaluation
before step 0 and after the last step, on the final policy): the shipped config, shortened to fit a loaded 2-core
machine (4 steps of 2 groups of 8 by default, against 40 of 4). A run whose vLLM did not become healthy within its
start-up timeout (a loaded machine) is started again, at most `ATTEMPTS` times.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tracegym.core.interval import MeanCI, mean_ci
from tracegym.core.trace import Trace
from tracegym.train.rl_folder import RLFolder, held_out_folder, step_name

CONFIG = Path(__file__).parents[1] / "configs" / "rl" / "reverse_text.toml"
MODES = {"sync": 0, "async": 1}
"""Run id -> `orchestrator.max_async_steps` (1 is the shipped config's and RLConfig's default)."""
HELD_OUT = "reverse-text"
ATTEMPTS = 3
COUNTS = ("groups_without_signal", "groups_filtered", "rollouts_filtered", "samples_dropped_stale", "rollouts_failed",
          "cut/length", "samples", "rollouts")
"""Per-step counts summed over the run: what was masked, filtered or dropped, and what was trained."""


def run(output_dir: Path, steps: int, tasks_per_step: int) -> None:
    """Both runs, one after the other (never at once: they would share the cores)."""
    for run_id, lag in MODES.items():
        for attempt in range(1, ATTEMPTS + 1):
            log = output_dir / f"{run_id}.log"
            shutil.rmtree(output_dir / run_id, ignore_errors=True)  # a failed attempt's folder
            command = [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(CONFIG), "--steps", str(steps),
                       "--orchestrator.eval.every", "0", "--checkpoint-every", str(steps),
                       "--orchestrator.tasks-per-step", str(tasks_per_step),
                       "--orchestrator.max-async-steps", str(lag), "--output-dir", str(output_dir),
                       "--run-id", run_id]
            print(f"{run_id} (attempt {attempt}): {' '.join(command[2:])}", flush=True)
            started = time.monotonic()
            with log.open("w") as out:
                code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
            print(f"{run_id}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
            if "not healthy after" not in log.read_text():
                break


def held_out(folder: RLFolder, step: int) -> dict[str, float]:
    """Each held-out task's reward at `step`, by task key."""
    path = folder.path / held_out_folder(HELD_OUT) / "traces" / f"{step_name(step)}.jsonl"
    traces = [Trace.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
    return {t.task_key: t.reward for t in traces if t.reward is not None}


def paired(after: dict[str, float], before: dict[str, float]) -> MeanCI:
    """The mean per-task difference after - before, over the tasks both scored, with its 95% interval."""
    return mean_ci([after[k] - before[k] for k in sorted(after.keys() & before.keys())])


def fmt(ci: MeanCI, signed: bool = False) -> str:
    mean = f"{ci.mean:+.3f}" if signed else f"{ci.mean:.3f}"
    low, high = ci.mean - ci.half_width, ci.mean + ci.half_width
    return f"{mean} ± {ci.half_width:.3f} [{low:+.3f}, {high:+.3f}]" if signed else f"{mean} ± {ci.half_width:.3f}"


def summary(folder: RLFolder, steps: int) -> dict[str, Any]:
    """What the report says of one run."""
    metrics = folder.metrics.read()
    step_records = [m for m in metrics if "step" in m and "reward" in m]
    trainer = [json.loads(line) for line in (folder.path / "trainer_metrics.jsonl").read_text().splitlines()
               if line.strip()]
    counts = {key: sum(int(m.get(key) or 0) for m in step_records) for key in COUNTS}
    masked = {k: sum(int(m.get(k) or 0) for m in step_records) for k in sorted({k for m in step_records for k in m
                                                                             if k.startswith("masked/")})}
    caught = {name: sum(round((m.get(f"filters/all/{name}") or 0) * (m.get("filters/all/checked") or 0))
                        for m in step_records) for name in ("gibberish", "repetition", "dropped")}
    times = [m["time"] for m in metrics]
    return {
        "before": held_out(folder, 0), "after": held_out(folder, steps),
        "train_reward": [m["reward"] for m in step_records],
        "staleness": sorted({int(m.get("staleness") or 0) for m in step_records}),
        "evals": [(m["eval_step"], m.get("policy_version")) for m in metrics if "eval_reward" in m],
        "counts": counts, "masked": masked, "caught": caught,
        "masked_token_frac": sum(t.get("masked_low_frac", 0) + t.get("masked_high_frac", 0) for t in trainer)
        / max(len(trainer), 1),
        "abs_log_ratio": sum(t.get("abs_log_ratio_mean", 0) for t in trainer) / max(len(trainer), 1),
        "wall_s": times[-1] - times[0] if times else 0.0,
    }


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for offset, (run_id, s) in zip((-0.05, 0.05), runs.items(), strict=True):
        cis = [mean_ci(list(s[when].values())) for when in ("before", "after")]
        left.errorbar([0 + offset, 1 + offset], [c.mean for c in cis], yerr=[c.half_width for c in cis],
                      marker="o", capsize=4, label=f"{run_id} (max_async_steps={MODES[run_id]})")
        right.plot(range(len(s["train_reward"])), s["train_reward"], marker=".", label=run_id)
    left.set_xticks([0, 1], ["before (step 0)", f"after (step {len(next(iter(runs.values()))['train_reward'])})"])
    left.set_ylabel("held-out reward (64 tasks, greedy), 95% CI")
    left.set_title("held-out reward")
    right.set_xlabel("step")
    right.set_ylabel("train reward (mean of the step's rollouts)")
    right.set_title("train reward per step")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(output_dir: Path, steps: int, figure: Path) -> str:
    runs = {run_id: summary(RLFolder(output_dir / run_id), steps) for run_id in MODES}
    plot(runs, figure)
    lines = [f"| mode | before (step 0) | after (step {steps}) | gain, paired by task | wall clock |",
             "|---|---|---|---|---:|"]
    for run_id, s in runs.items():
        lines.append(f"| {run_id} (`max_async_steps = {MODES[run_id]}`) | {fmt(mean_ci(list(s['before'].values())))}"
                     f" | {fmt(mean_ci(list(s['after'].values())))} | {fmt(paired(s['after'], s['before']), True)}"
                     f" | {s['wall_s'] / 60:.1f} min |")
    sync, asyn = runs["sync"], runs["async"]
    gains = {run_id: {k: s["after"][k] - s["before"][k] for k in s["after"].keys() & s["before"].keys()}
             for run_id, s in runs.items()}
    lines += ["", f"async - sync, paired by task: before {fmt(paired(asyn['before'], sync['before']), True)}; "
              f"after {fmt(paired(asyn['after'], sync['after']), True)}; gain "
              f"{fmt(paired(gains['async'], gains['sync']), True)}",
              "", "| per run, summed over its steps | " + " | ".join(MODES) + " |", "|---|---:|---:|"]
    rows: dict[str, list[Any]] = {key: [runs[r]["counts"][key] for r in MODES] for key in COUNTS}
    for name in ("gibberish", "repetition"):
        rows[f"rollouts the {name} filter caught (detect: counted, still trained)"] = [runs[r]["caught"][name]
                                                                                     for r in MODES]
    rows["rollouts dropped by an enforcing filter"] = [runs[r]["caught"]["dropped"] for r in MODES]
    for key in sorted({k for r in MODES for k in runs[r]["masked"]}):
        rows[key] = [runs[r]["masked"].get(key, 0) for r in MODES]
    rows["staleness seen"] = [runs[r]["staleness"] for r in MODES]
    rows["held-out evals (eval_step, policy_version)"] = [runs[r]["evals"] for r in MODES]
    rows["mean fraction of tokens masked by the ratio bound"] = [f"{runs[r]['masked_token_frac']:.4f}" for r in MODES]
    rows["mean abs log ratio (trainer vs sampler)"] = [f"{runs[r]['abs_log_ratio']:.3f}" for r in MODES]
    lines += [f"| {key} | " + " | ".join(str(v) for v in values) + " |" for key, values in rows.items()]
    lines += ["", "train reward per step:"] + [f"- {r}: " + ", ".join(f"{x:.3f}" for x in runs[r]["train_reward"])
                                              for r in MODES]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="store_true", help="run both modes first (else: report existing runs)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tasks-per-step", type=int, default=2, help="groups of 8 per step (the config's: 4)")
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/mode_parity"))
    parser.add_argument("--figure", type=Path, default=Path(__file__).with_suffix(".png"))
    args = parser.parse_args()
    if args.run:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        run(args.output_dir, args.steps, args.tasks_per_step)
    print(report(args.output_dir, args.steps, args.figure))


if __name__ == "__main__":
    main()
