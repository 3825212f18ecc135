"""Tripwires over a finished RL run's recorded traces: each step's trainable rollouts (a reward, as the run folder
holds them in `traces/step-N.jsonl`), grouped by task, fed to the wires (`train.tripwire`) as the run fed them, with
the default thresholds and the witness named. The wires read only traces, so this is what they would have said
during the run; it measures a wire added after a run on that run's own rollouts.

    .venv/bin/python benchmarks/tripwire_offline.py --witness exact outputs/tripwire/planted outputs/tripwire-honest/*
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path


def main() -> None:
    from tracegym.train.rl_folder import RLFolder
    from tracegym.train.tripwire import TripwireConfig, Tripwires

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--witness", default=None)
    args = parser.parse_args()
    for run in args.runs:
        folder = RLFolder(run)
        wires = Tripwires(TripwireConfig(witness=args.witness))
        fired: list[tuple[int, str]] = []
        steps = folder.steps()
        for step in steps:
            groups: dict[str, list] = defaultdict(list)
            for trace in folder.step_log(step).read().traces:
                groups[trace.task_key].append(trace)
            fired += [(trip.step, trip.wire) for trip in wires.observe(step, list(groups.values()))]
        first = {wire: min(s for s, w in fired if w == wire) for wire in {w for _, w in fired}}
        counts = Counter(w for _, w in fired)
        said = ", ".join(f"{w} x{counts[w]} (first at step {first[w]})" for w in sorted(first)) or "none"
        print(f"{run}: {len(steps)} steps; firings: {said}")


if __name__ == "__main__":
    main()
