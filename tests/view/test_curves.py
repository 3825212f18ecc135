"""Curves: metric records drawn per step as inline SVG, held-out reward with its interval, globbed metrics."""

import math

from detail_traces import tree

from tracegym.view.curves import curves_svg

SVG = "{http://www.w3.org/2000/svg}"
RECORDS = [
    *({"step": s, "reward": 0.1 * s, "completion_tokens_mean": 20 + s, "filters/calc/gibberish": 0.5 / (s + 1),
       "filters/calc/repetition": 0.1, "filters/calc/checked": 8} for s in range(5)),
    {"eval_step": 0, "env": "calc", "eval_reward": 0.2, "eval_reward_ci95": 0.05},
    {"eval_step": 4, "env": "calc", "eval_reward": 0.6, "eval_reward_ci95": 0.1},
    {"eval_step": 4, "env": "<b>odd</b>", "eval_reward": 0.4, "eval_reward_ci95": 0.1},
    None, "garbage", {"step": "x", "reward": 1}, {"step": 5, "reward": math.nan}, {"step": 6, "reward": True},
]


def figures(html: str) -> dict:
    return {f.get("data-key"): f for f in tree(html).iter("figure")}


def test_each_key_is_a_chart_whose_points_follow_the_values():
    drawn = figures(curves_svg(RECORDS, {"reward": "reward", "completion_tokens_mean": "tokens"}))
    points = [(float(c.get("cx")), float(c.get("cy"))) for c in drawn["reward"].iter(f"{SVG}circle")]
    assert len(points) == 5  # the garbage records are skipped
    assert points == sorted(points) and [y for _, y in points] == sorted((y for _, y in points), reverse=True)
    assert drawn["reward"].find(f".//{SVG}polyline") is not None
    assert "reward at step 4: 0.400" in [c.findtext(f"{SVG}title") for c in drawn["reward"].iter(f"{SVG}circle")]


def test_held_out_reward_has_a_line_per_env_with_its_interval():
    html = curves_svg(RECORDS, {"eval_reward": "held-out reward"})
    figure = figures(html)["eval_reward"]
    series = {g.get("data-series"): g for g in figure.iter(f"{SVG}g")}
    assert set(series) == {"calc", "<b>odd</b>"} and "<b>" not in html
    assert series["calc"].find(f"{SVG}polygon") is not None  # the band between two intervals
    assert len(series["calc"].findall(f"{SVG}line")) == 2  # an error bar per point
    assert "calc at step 4: 0.600 ± 0.100" in [c.findtext(f"{SVG}title") for c in series["calc"].iter(f"{SVG}circle")]


def test_a_glob_draws_every_matching_metric_and_a_missing_key_is_named_not_drawn():
    html = curves_svg(RECORDS, {"filters/*": "filters", "staleness": "staleness (versions)", "failed/*": "failed"})
    drawn = figures(html)
    assert {g.get("data-series") for g in drawn["filters/*"].iter(f"{SVG}g")} == {
        "filters/calc/gibberish", "filters/calc/repetition"}
    assert set(drawn) == {"filters/*"} and drawn["filters/*"].findtext("figcaption") == "filters"
    [none] = [p for p in tree(html).iter("p") if p.get("class") == "curves-none muted"]
    assert "".join(none.itertext()) == "not recorded in this run: staleness (versions), failed"


def test_the_step_axis_is_labelled_with_whole_steps():
    ticks = [t.text for t in tree(curves_svg(RECORDS, {"reward": "r"})).iter(f"{SVG}text") if t.get("class") == "xtick"]
    assert ticks == ["0", "2", "4"]
    ticks = [t.text for t in tree(curves_svg(RECORDS[:4], {"reward": "r"})).iter(f"{SVG}text")
             if t.get("class") == "xtick"]
    assert ticks == ["0", "1", "3"]  # never 1.5
    one = [t.text for t in tree(curves_svg(RECORDS[2:3], {"reward": "r"})).iter(f"{SVG}text")
           if t.get("class") == "xtick"]
    assert one == ["2"]


def test_a_held_out_point_is_drawn_at_the_policy_version_it_ran_on():
    records = [{"eval_step": 4, "env": "calc", "policy_version": 2, "eval_reward": 0.6}]
    figure = figures(curves_svg(records, {"eval_reward": "held-out reward"}))["eval_reward"]
    assert [c.findtext(f"{SVG}title") for c in figure.iter(f"{SVG}circle")] == ["calc at step 2: 0.600"]
