"""Timeline: spans drawn to scale in lanes, labelled, well-formed; a trace without spans says so."""

import pytest
from detail_traces import tool_trace, tree

from tracegym.core.errors import ErrorKind, TraceError
from tracegym.core.timing import Span
from tracegym.testing import make_trace
from tracegym.view.timeline import timeline_svg

SVG = "{http://www.w3.org/2000/svg}"


def bars(svg: str) -> dict[str, list]:
    """(x, width, y, title) of each bar, by stage."""
    out: dict[str, list] = {}
    for g in tree(svg).iter(f"{SVG}g"):
        rect = g.find(f"{SVG}rect")
        out.setdefault(g.get("data-stage"), []).append(
            (float(rect.get("x")), float(rect.get("width")), float(rect.get("y")), g.findtext(f"{SVG}title")))
    return out


async def test_a_rollouts_model_calls_tool_and_scoring_each_get_a_titled_bar():
    trace = await tool_trace()
    drawn = bars(timeline_svg(trace))
    assert {"setup", "model", "tool:add", "env_response", "scoring"} <= set(drawn) and "total" not in drawn
    assert len(drawn["model"]) == 2 and "turn 1" in drawn["model"][1][3]


def test_bars_are_to_scale_and_overlapping_tools_stack():
    trace = make_trace(spans=[Span(name="model", start=0.0, end=1.0, turn=0),
                              Span(name="tool:search", start=1.0, end=4.0, turn=0),
                              Span(name="tool:fetch", start=2.0, end=3.0, turn=0),
                              Span(name="scoring", start=4.0, end=4.5), Span(name="total", start=0.0, end=5.0)])
    svg = timeline_svg(trace)
    drawn = bars(svg)
    (mx, mw, _, _), (sx, sw, sy, title) = drawn["model"][0], drawn["tool:search"][0]
    _, fw, fy, _ = drawn["tool:fetch"][0]
    assert sw == pytest.approx(3 * mw, rel=1e-2) and fw == pytest.approx(mw, rel=1e-2)
    assert sx - mx == pytest.approx(mw, rel=1e-2) and fy > sy  # fetch overlaps search: the next row
    assert title == "tool:search · turn 0 · start 1.00 s · 3.00 s"
    assert "tool:search 3.00 s" in svg  # wide enough to carry its label
    assert "tool x2 · 4.00 s" in svg  # the lane's count and summed seconds


def test_no_spans_says_so_and_odd_names_are_escaped():
    assert "No timing recorded" in timeline_svg(make_trace())
    odd = make_trace(spans=[Span(name="tool:<b>&", start=0.0, end=float("nan")), Span(name="tool:<b>&", start=0.0,
                                                                                      end=0.2)])
    drawn = bars(timeline_svg(odd))
    assert list(drawn) == ["tool:<b>&"] and len(drawn["tool:<b>&"]) == 1  # the unfinished span is left out


async def test_a_stage_that_failed_is_marked_with_its_error():
    trace = await tool_trace()
    trace.errors.append(TraceError(kind=ErrorKind.TOOL, stage="tool:add", message="boom <b>", turn=0))
    trace.errors.append(TraceError(kind=ErrorKind.TASK, stage="scoring:correct", message="no number"))
    root = tree(timeline_svg(trace))
    failed = {g.get("data-stage"): g.findtext(f"{SVG}title") for g in root.iter(f"{SVG}g")
              if "failed" in g.get("class").split()}
    assert set(failed) == {"tool:add", "scoring"}
    assert failed["tool:add"].endswith("tool error at tool:add: boom <b>") and "no number" in failed["scoring"]
