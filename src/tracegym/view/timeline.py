"""Timeline: a trace's spans (setup, model calls, tools, environment responses, stops, scoring) drawn to scale
as inline SVG, one lane per kind of stage, each bar labelled with its name and duration where it fits and
titled with both (hover) where it does not."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from tracegym.core.errors import TraceError
from tracegym.core.timing import Span
from tracegym.core.trace import Trace

WIDTH, LABEL_WIDTH, ROW, AXIS = 1000, 180, 22, 28
"""The drawing's width, the lane labels' column, one bar row's height and the axis's, in SVG units."""
LANES = ("setup", "model", "tool", "env_response", "stop", "scoring")
"""Lane order; a stage is in the lane of its name before any `:` (`tool:search` -> `tool`)."""
CHAR_WIDTH = 6.2
"""Roughly how wide one character of the 11px labels is, to decide whether a label fits its bar."""


@dataclass(frozen=True)
class _Bar:
    span: Span
    row: int


def timeline_svg(trace: Trace) -> str:
    """The spans of `trace` (`core.timing`) as an `<svg class="timeline">` on one time axis from 0 to the
    rollout's end (its `total` span, else the latest end), with tick marks in seconds: a lane per stage kind
    (`LANES`; overlapping spans, e.g. parallel tool calls, stack in rows), the lane's count and summed
    seconds in its label. Each bar is a `<g class="span" data-stage=NAME>` with a `<title>`: stage, turn,
    start and duration; a stage where an error was recorded (`trace.errors`: same stage, or a scorer's
    `scoring:NAME`, in the same turn) is also `failed`, its title ending with the error. A trace with no spans
    gives a `<p class="empty">`."""
    spans = [s for s in trace.spans if s.name != "total" and _finite(s)]
    if not spans:
        return '<p class="empty timeline">No timing recorded for this trace.</p>'
    total = next((s.end for s in trace.spans if s.name == "total" and _finite(s)), 0.0)
    end = max([total, *(s.end for s in spans)]) or 1e-9
    lanes = _lanes(spans)
    height = AXIS + sum(max(b.row for b in bars) + 1 for bars in lanes.values()) * ROW + 6
    scale = (WIDTH - LABEL_WIDTH - 10) / end
    parts, y = [_axis(end, scale, height)], AXIS
    for lane, bars in lanes.items():
        rows = max(b.row for b in bars) + 1
        seconds = sum(b.span.duration for b in bars)
        parts.append(f'<text class="lane" x="4" y="{y + ROW * 0.7:.1f}">{escape(lane)} x{len(bars)} · '
                     f'{_seconds(seconds)}</text>')
        parts += [_bar(b, y, scale, lane, _errors_of(b.span, trace.errors)) for b in bars]
        y += rows * ROW
    return (f'<svg class="timeline" viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
            f'xmlns="http://www.w3.org/2000/svg" aria-label="timeline of {len(spans)} spans over '
            f'{_seconds(end)}">{"".join(parts)}</svg>')


def _finite(span: Span) -> bool:
    return math.isfinite(span.start) and math.isfinite(span.end) and span.end >= span.start >= 0


def _lanes(spans: list[Span]) -> dict[str, list[_Bar]]:
    """Spans by lane, in `LANES` order (other names after, in order of appearance); within a lane each span
    takes the first row where it overlaps nothing."""
    names = [*LANES, *dict.fromkeys(s.name.split(":", 1)[0] for s in spans)]
    out: dict[str, list[_Bar]] = {}
    for lane in dict.fromkeys(names):
        ends: list[float] = []
        bars = []
        for span in sorted((s for s in spans if s.name.split(":", 1)[0] == lane), key=lambda s: s.start):
            row = next((i for i, e in enumerate(ends) if e <= span.start), len(ends))
            ends[row:row + 1] = [span.end]
            bars.append(_Bar(span, row))
        if bars:
            out[lane] = bars
    return out


def _axis(end: float, scale: float, height: int) -> str:
    step = _tick_step(end)
    ticks = []
    for i in range(int(end / step) + 1):
        x = LABEL_WIDTH + i * step * scale
        ticks.append(f'<line class="tick" x1="{x:.1f}" y1="{AXIS - 6}" x2="{x:.1f}" y2="{height}"/>'
                     f'<text class="tick" x="{x:.1f}" y="{AXIS - 10}">{_seconds(i * step)}</text>')
    return "".join(ticks)


def _tick_step(end: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving about five to ten ticks."""
    raw = end / 6
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _errors_of(span: Span, errors: list[TraceError]) -> list[TraceError]:
    return [e for e in errors if (e.stage == span.name or e.stage.startswith(span.name + ":"))
            and (e.turn is None or span.turn is None or e.turn == span.turn)]


def _bar(bar: _Bar, y: int, scale: float, lane: str, errors: list[TraceError]) -> str:
    span = bar.span
    x, w = LABEL_WIDTH + span.start * scale, max(span.duration * scale, 1.0)
    top = y + bar.row * ROW + 3
    turn = f" · turn {span.turn}" if span.turn is not None else ""
    label = f"{span.name} {_seconds(span.duration)}"
    title = f"{span.name}{turn} · start {_seconds(span.start)} · {_seconds(span.duration)}"
    title += "".join(f" · {e.kind.value} error at {e.stage}: {e.message}" for e in errors)
    text = (f'<text x="{x + 3:.1f}" y="{top + ROW * 0.55:.1f}">{escape(label)}</text>'
            if len(label) * CHAR_WIDTH + 6 <= w else "")
    failed = " failed" if errors else ""
    return (f'<g class="span lane-{escape(lane)}{failed}" data-stage="{escape(span.name)}">'
            f"<title>{escape(title)}</title>"
            f'<rect x="{x:.1f}" y="{top}" width="{w:.1f}" height="{ROW - 6}" rx="2"/>{text}</g>')


def _seconds(value: float) -> str:
    """Seconds for a label: `850 ms` or `0.42 ms` under a second, else `1.25 s`."""
    return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.2f} s"
