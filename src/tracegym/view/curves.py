"""Curves: an RL run's metric records (`metrics.jsonl`) drawn per step as inline SVG, one small chart per metric,
with no script: each point's `<title>` gives its step and value on hover.

A step record has `step` and the orchestrator's figures (`reward`, `completion_tokens_mean`, `staleness`,
`groups_filtered`, ...); a held-out record has `eval_step`, `env` and `eval_reward` with its 95% half-width
`eval_reward_ci95`. A key `K` is read from the records that have it, at `step` (a held-out record: at the policy
version it ran on, `train.plots.evaluated_policy`, else its `eval_step`); records with an
`env` draw one line per env; a `K_ci95` beside `K` draws the interval as a band and error bars. A key with `*`
(`failed/*`, `filters/all/*`) draws one line per rate it matches (not a `_ci95`, nor a filter's `checked` count).
A key no record has draws no chart: one line names them all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from html import escape
from typing import Any, TypeGuard

from tracegym.train.filters import ALL, CHECKED
from tracegym.train.plots import evaluated_policy
from tracegym.view.page import number

WIDTH, HEIGHT, LEFT, BOTTOM, TOP, RIGHT = 480, 200, 52, 26, 12, 12
"""One chart's size and margins, in SVG units."""
CURVE_KEYS = {"reward": "reward (trainable rollouts)", "eval_reward": "held-out reward (95% interval)",
              "completion_tokens_mean": "completion tokens (mean)", "staleness": "staleness (policy versions)",
              "groups_filtered": "groups filtered out", f"filters/{ALL}/*": "share of rollouts each filter caught",
              "rollouts_filtered": "rollouts left out by filters", "failed/*": "failed rollouts, by reason",
              "samples_dropped_stale": "samples dropped as too stale"}
"""The metrics an RL run page shows by default (`metrics.jsonl` keys, `train.orchestrator.step_metrics`), titled."""
MAX_DOTS = 300
"""At most this many hoverable dots per line (every k-th point beyond it; the line keeps them all)."""
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")

Point = tuple[float, float, float | None]
"""(step, value, 95% half-width or None)."""


def curves_svg(records: list[dict[str, Any]], keys: Mapping[str, str]) -> str:
    """One `<figure class="curve" data-key=K>` captioned with its title per key K of `keys` (an `<svg>` with axes,
    a line per series, a dot per point, the interval band where the records have `K_ci95`, and a legend when there
    are several series); the keys no record has are named in one `<p class="curves-none">` after them. Records
    that are not dicts, lack a step or hold a value that is not a finite number are skipped (a metrics file being
    written may end in anything)."""
    drawn = {key: _series(records, key) for key in keys}
    figures = "".join(_figure(key, keys[key], series) for key, series in drawn.items() if series)
    missing = [keys[key] for key, series in drawn.items() if not series]
    none = f'<p class="curves-none muted">not recorded in this run: {escape(", ".join(missing))}</p>' if missing \
        else ""
    return f'<div class="curves">{figures}</div>{none}'


def _series(records: list[dict[str, Any]], key: str) -> dict[str, list[Point]]:
    """The key's points by series (the metric a `*` key matched, and the record's `env`; '' for a plain key
    without env), in step order."""
    out: dict[str, list[Point]] = {}
    for record in records:
        if not isinstance(record, dict):
            continue
        step = record.get("step", record.get("eval_step"))
        if not _finite(step):
            continue
        if "step" not in record and _finite(record.get("policy_version")):
            step = evaluated_policy(record)
        env = str(record.get("env", ""))
        for name in _matching(record, key):
            value, ci = record[name], record.get(f"{name}_ci95")
            if _finite(value):
                series = " ".join(filter(None, [name if name != key else "", env]))
                out.setdefault(series, []).append((float(step), float(value), float(ci) if _finite(ci) else None))
    return {name: sorted(points) for name, points in sorted(out.items())}


def _matching(record: dict[str, Any], key: str) -> list[str]:
    if "*" not in key:
        return [key] if key in record else []
    return [k for k in record if fnmatchcase(k, key) and not k.endswith(("_ci95", f"/{CHECKED}"))]


def _finite(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _figure(key: str, title: str, series: dict[str, list[Point]]) -> str:
    caption = f"<figcaption>{escape(title)}</figcaption>"
    points = [p for s in series.values() for p in s]
    steps = [p[0] for p in points]
    xs = _span(steps)
    ys = _span([y for p in points for y in (p[1] - (p[2] or 0), p[1] + (p[2] or 0))])
    scale = _Scale(xs, ys)
    body = [_axes(scale, _step_ticks(min(steps), max(steps)))]
    for i, (name, pts) in enumerate(series.items()):
        body.append(_line(name or key, pts, COLORS[i % len(COLORS)], scale))
    legend = ""
    if len(series) > 1 or any(name for name in series):
        legend = '<p class="legend">' + " ".join(
            f'<span style="color:{COLORS[i % len(COLORS)]}">■</span> {escape(name or key)}'
            for i, name in enumerate(series)) + "</p>"
    svg = (f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" xmlns="http://www.w3.org/2000/svg" '
           f'aria-label="{escape(key)} per step">{"".join(body)}</svg>')
    return f'<figure class="curve" data-key="{escape(key)}">{caption}{svg}{legend}</figure>'


def _span(values: Sequence[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    if high - low < 1e-12:  # one value: give it some room
        pad = abs(low) * 0.1 or 1.0
        return low - pad, high + pad
    return low, high


class _Scale:
    """Data coordinates to the plot area."""

    def __init__(self, xs: tuple[float, float], ys: tuple[float, float]) -> None:
        self.xs, self.ys = xs, ys

    def x(self, value: float) -> float:
        low, high = self.xs
        return LEFT + (value - low) / (high - low) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        low, high = self.ys
        return HEIGHT - BOTTOM - (value - low) / (high - low) * (HEIGHT - BOTTOM - TOP)


def _step_ticks(first: float, last: float) -> list[int]:
    """The steps labelled on the x axis: the first, the last and a whole step near the middle (steps are whole)."""
    low, high = math.ceil(first), math.floor(last)
    return sorted({low, (low + high) // 2, high}) if low <= high else [round(first)]


def _axes(scale: _Scale, steps: list[int]) -> str:
    y0, y1 = scale.ys
    left, right, top, bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    out = [f'<rect class="plot" x="{left}" y="{top}" width="{right - left}" height="{bottom - top}"/>']
    for value in (y0, (y0 + y1) / 2, y1):
        y = scale.y(value)
        out.append(f'<line class="grid" x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="ytick" x="{left - 4}" y="{y + 4:.1f}">{_label(value)}</text>')
    for step in steps:
        out.append(f'<text class="xtick" x="{scale.x(step):.1f}" y="{bottom + 16}">{step}</text>')
    out.append(f'<text class="axis-name" x="4" y="{bottom + 16}">step</text>')
    return "".join(out)


def _line(name: str, points: list[Point], color: str, scale: _Scale) -> str:
    xy = [(scale.x(s), scale.y(v)) for s, v, _ in points]
    out = [f'<g class="series" data-series="{escape(name)}" style="color:{color}">']
    intervals = [(s, v, c) for s, v, c in points if c is not None]
    if len(intervals) > 1:
        upper = [f"{scale.x(s):.1f},{scale.y(v + c):.1f}" for s, v, c in intervals]
        lower = [f"{scale.x(s):.1f},{scale.y(v - c):.1f}" for s, v, c in reversed(intervals)]
        out.append(f'<polygon class="band" points="{" ".join(upper + lower)}"/>')
    for s, v, c in intervals:
        out.append(f'<line class="bar" x1="{scale.x(s):.1f}" x2="{scale.x(s):.1f}" y1="{scale.y(v - c):.1f}" '
                   f'y2="{scale.y(v + c):.1f}"/>')
    if len(xy) > 1:
        out.append(f'<polyline class="line" points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in xy)}"/>')
    every = math.ceil(len(points) / MAX_DOTS)
    for (x, y), (s, v, ci) in list(zip(xy, points, strict=True))[::every]:
        interval = f" ± {number(ci)}" if ci is not None else ""
        out.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="2.5"><title>{escape(name)} at step '
                   f'{_label(s)}: {number(v)}{interval}</title></circle>')
    return "".join(out) + "</g>"


def _label(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"
