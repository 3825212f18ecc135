"""Env-server curve: rollouts/s and the latency the server path adds, per load level, ours next to verifiers'.

At each concurrency c (1, 8, 64, 128, 512, 1024 by default) c callers run single-turn echo rollouts, one rollout
per call (one request per rollout through a server), against the instant fake OpenAI endpoint in its own process:
in process, through our env server with a static pool of `--workers` and with an elastic pool, then (with
`--verifiers-python`, one interpreter that has verifiers: its own venv when its requirements clash with ours)
verifiers in process and through verifiers' own env server (its ZMQ server, `--workers` workers;
`env_server_verifiers.py`). "Added" latency is the server path's p50 (p99) per rollout minus its own library's
in-process p50 (p99) at the same c. Every level is bounded: at most max(`--min-rollouts`, `--per-level` x c)
rollouts and `--cap-s` seconds per measurement (a capped row says so), after a short warm-up (not counted); each
point is the median of `--rounds` measurements, the paths of one library taking turns at each level.
Writes a markdown table and a plot (`--out` .md and .png). Run by `benchmarks/env_server.py --curve`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from env_server import Call, Result, drive, in_process, through
from fake_endpoint import fake_endpoint

from tracegym import Endpoint, TaskData
from tracegym.serve import local_server
from tracegym.testing.echo import SPEC, Echo

LEVELS = [1, 8, 64, 128, 512, 1024]
OURS = ["in-process", "server static", "server elastic"]
THEIRS = ["verifiers in-process", "verifiers server"]
COLORS = dict(zip(OURS + THEIRS, ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"], strict=True))
"""One color per path, the same in both panels."""
Maker = Callable[[], tuple[Call, Callable[[], Awaitable[None]]]]
WARM_UP_S = 1.5
"""Seconds of warm-up rollouts before each measurement (an elastic pool grows meanwhile)."""


@dataclass
class Point:
    path: str
    c: int
    rate: float
    p50_ms: float
    p99_ms: float
    errors: int
    capped: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--curve")
    group.add_argument("--levels", type=int, nargs="+", default=LEVELS, help="concurrency levels of the curve")
    group.add_argument("--min-rollouts", type=int, default=500, help="rollouts per measurement, at least")
    group.add_argument("--per-level", type=int, default=3, help="rollouts per measurement: this many per caller")
    group.add_argument("--cap-s", type=float, default=20.0, help="most seconds per measurement")
    group.add_argument("--rounds", type=int, default=3, help="measurements per path and level (the median is kept)")
    group.add_argument("--verifiers-python", default=sys.executable,
                       help="an interpreter with verifiers installed (its own venv); 'none' leaves verifiers out")
    group.add_argument("--out", type=Path, default=Path(__file__).with_name("env_server_curve"),
                       help="where the table (.md) and the plot (.png) go")


def run(args: argparse.Namespace) -> None:
    """Measure every path at every level, then write the table and the plot."""
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    with fake_endpoint() as base_url:
        endpoint = Endpoint(base_url=base_url, model="fake-model", api_key_env=None, max_retries=0)
        points = ours(endpoint, args)
        version = "not run"
        if args.verifiers_python != "none":
            theirs_points, version = theirs(base_url, args)
            points += theirs_points
    header = {"started": f"{started:%Y-%m-%d %H:%M} UTC", "load": (load_before, os.getloadavg()),
              "command": " ".join(sys.argv), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "verifiers": version}
    args.out.with_suffix(".md").write_text(table(points, header, args))
    plot(points, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.md')} and {args.out.with_suffix('.png')}")


def ours(endpoint: Endpoint, args: argparse.Namespace) -> list[Point]:
    """Our three paths, level by level: each warmed up once, then measured `--rounds` times in turn (in process,
    static, elastic, in process, ...); a point is its rounds' median."""
    tasks = list(Echo({"num_tasks": 100}))
    points: list[Point] = []
    with local_server(SPEC, {"turns": 1}, workers=args.workers) as static, \
            local_server(SPEC, {"turns": 1}, elastic=True) as elastic:
        paths = {"in-process": in_process(endpoint, 1), "server static": through(static, endpoint),
                 "server elastic": through(elastic, endpoint)}
        for c in args.levels:
            total = max(args.min_rollouts, args.per_level * c)
            rounds = asyncio.run(level(paths, tasks, c, total, args.cap_s, args.rounds))
            for path, results in rounds.items():
                points.append(median_point(path, c, results))
                print(json.dumps(points[-1].__dict__), flush=True)
    return points


async def level(paths: dict[str, Maker], tasks: list[TaskData], c: int, total: int, cap_s: float,
                rounds: int) -> dict[str, list[tuple[Result, bool]]]:
    """Every path at concurrency `c`: warmed up for `WARM_UP_S` (an elastic pool grows meanwhile), then `rounds`
    bounded measurements each, the paths in turn; each result with True when the cap cut it short."""
    made = {path: make() for path, make in paths.items()}
    results: dict[str, list[tuple[Result, bool]]] = {path: [] for path in paths}
    try:
        for call, _ in made.values():
            warm_until = time.perf_counter() + WARM_UP_S
            while time.perf_counter() < warm_until:
                await drive(call, tasks, c, max(50, 2 * c), deadline=warm_until + cap_s / 4)
        for _ in range(rounds):
            for path, (call, _) in made.items():
                deadline = time.perf_counter() + cap_s
                result = await drive(call, tasks, c, total, deadline=deadline)
                results[path].append((result, time.perf_counter() >= deadline))
    finally:
        for _, close in made.values():
            await close()
    return results


def median_point(path: str, c: int, results: list[tuple[Result, bool]]) -> Point:
    """One path's point at one level: the median of its rounds' rates and latencies; failures summed."""
    runs = [r for r, _ in results]
    return Point(path, c, statistics.median(r.rate for r in runs), statistics.median(r.p50_ms for r in runs),
                 statistics.median(r.p99_ms for r in runs), sum(r.errors for r in runs),
                 any(capped for _, capped in results))


def theirs(base_url: str, args: argparse.Namespace) -> tuple[list[Point], str]:
    """verifiers' two paths, measured by `env_server_verifiers.py` under `--verifiers-python`, and its version."""
    command = [args.verifiers_python, str(Path(__file__).with_name("env_server_verifiers.py")), "--base-url",
               base_url, "--levels", *map(str, args.levels), "--workers", str(args.workers), "--min-rollouts",
               str(args.min_rollouts), "--per-level", str(args.per_level), "--cap-s", str(args.cap_s), "--rounds",
               str(args.rounds)]
    budget = len(args.levels) * 2 * args.cap_s * (args.rounds + 1) + 300  # every measurement capped, plus start-up
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its own interpreter, none of our paths
    done = subprocess.run(command, capture_output=True, text=True, timeout=budget, env=env)
    points, version = [], "?"
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if "version" in row:
            version = row["version"]
            continue
        name = f"verifiers {row['path']}"
        points.append(Point(name, row["c"], row["rate"], row["p50_ms"], row["p99_ms"], row["errors"], row["capped"]))
        print(json.dumps(points[-1].__dict__), flush=True)
    if done.returncode != 0 or not points:
        print(f"verifiers' benchmark failed (exit {done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
    return points, version


def table(points: list[Point], header: dict, args: argparse.Namespace) -> str:
    """The markdown table: one row per path and level, with the rate against in-process and the added latency."""
    by = {(p.path, p.c): p for p in points}
    lines = [f"Measured {header['started']} on {header['machine']}; load average before {_load(header['load'][0])}, "
             f"after {_load(header['load'][1])}; verifiers {header['verifiers']}.",
             f"`{header['command']}`", "",
             "| c | path | rollouts/s | vs its in-process | p50 ms | added p50 ms | p99 ms | added p99 ms | failed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in args.levels:
        for path in OURS + THEIRS:
            point = by.get((path, c))
            if point is None:
                continue
            base = by.get(("verifiers in-process" if path.startswith("verifiers") else "in-process", c))
            server = base is not None and base is not point
            ratio = f"{point.rate / base.rate:.2f}x" if server and base else "-"
            added50 = f"{point.p50_ms - base.p50_ms:+.2f}" if server and base else "-"
            added99 = f"{point.p99_ms - base.p99_ms:+.2f}" if server and base else "-"
            capped = " (capped)" if point.capped else ""
            lines.append(f"| {c} | {path} | {point.rate:,.0f}{capped} | {ratio} | {point.p50_ms:.2f} | {added50} | "
                         f"{point.p99_ms:.2f} | {added99} | {point.errors} |")
    return "\n".join(lines) + "\n"


def _load(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


def plot(points: list[Point], path: Path) -> None:
    """Two panels over c (log): rollouts/s, and the p50 latency each server path adds to its own in-process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(p.path, p.c): p for p in points}
    fig, (rates, added) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in OURS + THEIRS:
        mine = sorted((p for p in points if p.path == name), key=lambda p: p.c)
        if not mine:
            continue
        style = "--" if name.startswith("verifiers") else "-"
        rates.plot([p.c for p in mine], [p.rate for p in mine], style, marker="o", label=name, color=COLORS[name])
        base = "verifiers in-process" if name.startswith("verifiers") else "in-process"
        pairs = [(p.c, p.p50_ms - by[(base, p.c)].p50_ms) for p in mine if name != base and (base, p.c) in by]
        if pairs:
            added.plot([c for c, _ in pairs], [a for _, a in pairs], style, marker="o", label=name, color=COLORS[name])
    rates.set(xscale="log", yscale="log", xlabel="concurrent callers", ylabel="rollouts/s",
              title="single-turn rollouts, instant model")
    added.set(xscale="log", yscale="symlog", xlabel="concurrent callers", ylabel="added p50 latency (ms)",
              title="server path minus its in-process, per rollout")
    for ax in (rates, added):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
