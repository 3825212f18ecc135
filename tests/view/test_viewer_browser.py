"""The trace viewer in a real browser: `tracegym view` serves run folders made by the fakes through the real eval
and RL code, headless Chromium opens every kind of page, and the tests read what is visible through the DOM
(summary figures, filters, the fork marker, coloured sampled tokens and their details, episode columns with private
reasoning marked, RL curves, 4xx pages, a live folder growing). Every page is kept as a screenshot: under
`$TRACEGYM_SCREENSHOTS` when set, else pytest's temporary folder (the path is printed at the end of the run)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from headless_chromium import Chromium, Page, chromium_missing
from view_runs import byte_model, cut_off, debate_run, eval_run, held_out_debates, rl_run
from viewer_process import viewer

from tracegym.core.episode import Episode
from tracegym.core.trace import Trace
from tracegym.testing.scripted_model import render_body
from tracegym.train.rl_folder import RLFolder

pytestmark = [pytest.mark.slow, pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing())),
              pytest.mark.asyncio(loop_scope="module")]

SUMMARY_FIGURES = """(() => {
  const section = [...document.querySelectorAll('section')].find(s => s.querySelector('h2')?.innerText === 'Summary');
  const figures = {};
  for (const dt of section.querySelectorAll('dl.kv dt')) figures[dt.innerText] = dt.nextElementSibling.innerText;
  for (const td of section.querySelectorAll('td[data-key]')) figures[td.dataset.key] = td.innerText;
  return figures;
})()"""
"""summary.json's figures on the run page, by their dotted path in the file (`rewards.correct.mean`)."""
TABLE_ROWS = "[...document.querySelectorAll('#rows table tbody tr')].map(tr => [...tr.cells].map(td => td.innerText))"

UNMARKED_PRIVATE = """[...document.querySelectorAll('main *:not(script):not(style)')].flatMap(e => [...e.childNodes])
  .filter(n => n.nodeType === Node.TEXT_NODE && /private plan|Both were brief/.test(n.textContent))
  .filter(n => !n.parentElement.closest('.private, #tokens'))
  .map(n => (n.parentElement.closest('section[id]')?.id || 'page') + ': ' + n.textContent.trim())"""
"""Where the debaters' and the judge's private reasoning shows outside a `.private` mark (the tokens view, which
shows exact tokens, left out)."""


@dataclass(frozen=True)
class Runs:
    eval: Path
    """An eval run: tool calls, a fork, a model error, tool errors, then a truncated last line."""
    live: Path
    """A copy of the eval run before the truncated line, for the live test to append to."""
    debate: Path
    rl: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("runs")
    model = byte_model(root / "byte-model")
    made = eval_run(root / "eval", model)
    live = Path(shutil.copytree(made, root / "live"))
    cut_off(made)
    debate, rl = debate_run(root / "debate", model), rl_run(root / "rl", model)
    held_out_debates(rl, debate)
    return Runs(made, live, debate, rl)


@pytest.fixture(scope="module")
def shots(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where the screenshots go; their list is printed when the module is done."""
    chosen = os.environ.get("TRACEGYM_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nviewer screenshots in {folder}: "
                            + ", ".join(sorted(p.name for p in folder.glob("*.png"))))


@pytest.fixture(scope="module")
def eval_url(runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with viewer(runs.eval, tmp_path_factory.mktemp("logs") / "view-eval.log") as url:
        yield url


@pytest.fixture(scope="module")
def debate_url(runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with viewer(runs.debate, tmp_path_factory.mktemp("logs") / "view-debate.log") as url:
        yield url


@pytest.fixture(scope="module")
def rl_url(runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with viewer(runs.rl, tmp_path_factory.mktemp("logs") / "view-rl.log") as url:
        yield url


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def browser() -> AsyncIterator[Chromium]:
    """One browser for the module (a start costs a second or two on a busy machine); each test opens its tab."""
    async with Chromium.launch() as chromium:
        yield chromium


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Chromium) -> AsyncIterator[Page]:
    tab = await browser.page()
    yield tab
    browser.pages.remove(tab)
    await tab.close()


def records(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSONL file (a cut-off last line left out)."""
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def traces(run: Path) -> list[Trace]:
    return [Trace.model_validate(r) for r in records(run / "traces.jsonl")]


def row_of(run: Path, task_key: str) -> int:
    """The row number (`/trace/N`) of the first trace of a task."""
    return next(n for n, t in enumerate(traces(run)) if t.task_key == task_key)


def shown(value: float | None) -> str:
    """A figure as the run page prints it."""
    return "-" if value is None else f"{value:.3f}"


def flat_json(value: dict, prefix: str = "") -> list[tuple[str, object]]:
    """A JSON object's leaves by dotted path."""
    return [leaf for k, v in value.items()
            for leaf in (flat_json(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)])]


async def open_ok(page: Page, url: str, shot: Path) -> None:
    """Open `url`, expect HTTP 200 and no script error, and keep a screenshot."""
    response = await page.goto(url)
    assert response.status == 200, f"{url}: HTTP {response.status}"
    await page.screenshot(shot)
    assert page.errors == [], f"{url}: script errors {page.errors}"


# --- eval run ------------------------------------------------------------------------------------------------
async def test_the_run_page_prints_the_summary_to_3_decimals_and_lists_every_trace(page, eval_url, runs, shots):
    await open_ok(page, f"{eval_url}/", shots / "eval-run.png")
    summary = json.loads((runs.eval / "summary.json").read_text())
    figures = await page.evaluate(SUMMARY_FIGURES)
    for key, value in flat_json(summary):
        if isinstance(value, float):
            assert figures[key] == f"{value:.3f}", key
        elif isinstance(value, int):
            assert figures[key] == str(value), key
    assert figures["reward"] == f"{summary['reward']:.3f}" and summary["reward"] not in (0.0, 1.0)
    assert figures["rewards.correct.mean"] == f"{summary['rewards']['correct']['mean']:.3f}"
    assert figures["rewards.brief.mean"] == f"{summary['rewards']['brief']['mean']:.3f}"
    assert figures["errors_by_kind.model"] == "2" and figures["errors_by_kind.tool"] == "2"

    rows = await page.evaluate(TABLE_ROWS)
    written = traces(runs.eval)
    assert [int(r[0]) for r in rows] == list(range(len(written))) == list(range(12))
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        (t.task_key, str(t.rollout_index), shown(t.reward), t.stop_reason.value) for t in written]
    notes = " ".join(await page.texts(".note"))
    assert "traces.jsonl: the last line is incomplete" in notes  # the killed writer's half line, said as such


async def test_the_filters_narrow_the_table(page, eval_url, runs, shots):
    written = traces(runs.eval)
    await page.goto(f"{eval_url}/")
    await page.type("input[name=reward_min]", "1")
    await page.click("form.filters button[type=submit]", navigates=True)
    await page.screenshot(shots / "eval-run-filter-reward.png")
    rows = await page.evaluate(TABLE_ROWS)
    assert len(rows) == sum(t.reward is not None and t.reward >= 1 for t in written) == 8
    assert all(float(r[3]) >= 1 for r in rows)
    assert "matching" in await page.text("#rows")

    await page.goto(f"{eval_url}/")
    await page.evaluate("document.querySelector('select[name=error]').value = 'model'")
    await page.click("form.filters button[type=submit]", navigates=True)
    await page.screenshot(shots / "eval-run-filter-errors.png")
    rows = await page.evaluate(TABLE_ROWS)
    assert [(r[1], r[4], r[5]) for r in rows] == [("3", "error", "model")] * 2

    await page.goto(f"{eval_url}/")
    await page.type("input[name=q]", "sum is 17")
    await page.click("form.filters button[type=submit]", navigates=True)
    await page.screenshot(shots / "eval-run-search.png")
    rows = await page.evaluate(TABLE_ROWS)
    assert [r[1] for r in rows] == ["1", "1"]
    assert page.errors == []


async def test_a_forked_trace_shows_its_tool_calls_the_fork_marker_and_the_timeline(page, eval_url, runs, shots):
    n = row_of(runs.eval, "1")  # its `<tool_call>` text was re-read as a call: the next prompt forked
    trace = traces(runs.eval)[n]
    assert len(trace.branches) == 2
    await open_ok(page, f"{eval_url}/trace/{n}", shots / "eval-trace-fork.png")
    fork = "#graph .fork[data-fork]"
    assert await page.count(fork) == 1
    assert await page.evaluate(f"document.querySelector('{fork}').dataset.fork") == "retokenized"
    await page.center(fork)  # visible: it has a box on the page
    assert "retokenized" in await page.text(fork) and "did not extend branch 0's tokens" in await page.text(fork)
    assert "2 branches" in await page.text("#graph .graph-summary")

    shown_nodes = await page.evaluate("[...document.querySelectorAll('#conversation .msg')].map(m => +m.dataset.node)")
    assert shown_nodes == trace.branches[1]  # the branch the rollout ended on, message by message
    assert await page.texts("#conversation .call .call-name") == ["add"]
    assert '"a": 10' in await page.text("#conversation .call .call-args")
    conversation = await page.text("#conversation")
    assert "17.0" in conversation and "The sum is 17." in conversation

    stages = await page.evaluate("[...document.querySelectorAll('#timeline svg.timeline g.span')]"
                                 ".map(g => [g.dataset.stage, parseFloat(g.querySelector('rect').getAttribute('x')),"
                                 " g.querySelector('rect').getBoundingClientRect().width])")
    names = [s[0] for s in stages]
    assert {"setup", "model", "tool:add", "scoring"} <= set(names)
    assert all(width > 0 for _, _, width in stages)
    by_start = sorted(trace.spans, key=lambda s: s.start)
    drawn = {name: x for name, x, _ in stages if name != "model"}
    order = [s.name for s in by_start if s.name in drawn]
    assert sorted(drawn, key=drawn.get) == list(dict.fromkeys(order))  # drawn to scale: in the spans' time order


async def test_sampled_tokens_are_coloured_and_show_their_details(page, eval_url, runs, shots):
    n = row_of(runs.eval, "0")
    trace = traces(runs.eval)[n]
    await page.goto(f"{eval_url}/trace/{n}")
    ids = await page.evaluate("[...document.querySelectorAll('#tokens .tokens .t')].map(t => +t.dataset.id)")
    assert ids == trace.graph.tokens()  # the branch's exact token ids, in order
    mask = [m for node in trace.graph.path() for m in (node.mask or [])]
    sampled = await page.evaluate("[...document.querySelectorAll('#tokens .tokens .t')]"
                                  ".map(t => t.classList.contains('s') ? 1 : 0)")
    assert sampled == mask and 0 < sum(mask) < len(mask)

    last = trace.graph.nodes[trace.graph.head]
    said = await page.evaluate(f"[...document.querySelectorAll('#tokens .seg[data-node=\"{last.id}\"] .t.s')]"
                               ".map(t => t.textContent).join('')")
    assert said == render_body(last.message) == "The sum is 5.<|end|>\n"  # each token's text, from the tokenizer

    colours = await page.evaluate("""(() => {
      const bg = sel => getComputedStyle(document.querySelector(sel)).backgroundColor;
      return [bg('#tokens .tokens .t.s'), bg('#tokens .tokens .t:not(.s)')];
    })()""")
    assert colours[1] == "rgba(0, 0, 0, 0)" and colours[0] != colours[1]  # a sampled token is coloured

    token = "#tokens .tokens .t.s"
    assert "logprob -0.5000" in await page.evaluate(f"document.querySelector('{token}').title")
    await page.hover(token)
    assert await page.evaluate(f"document.querySelector('{token}').matches(':hover')")
    await page.click(token)
    detail = await page.wait_for("document.querySelector('#tokens .token-detail')?.innerText")
    first = ids[mask.index(1)]
    assert f"id {first} · text {json.dumps(chr(first))}" in detail and "logprob -0.5000" in detail
    assert "sampled" in detail
    await page.screenshot(shots / "eval-trace-token-picked.png")
    assert page.errors == []


async def test_errored_traces_show_the_error_with_its_stage(page, eval_url, runs, shots):
    await open_ok(page, f"{eval_url}/trace/{row_of(runs.eval, '3')}", shots / "eval-trace-model-error.png")
    errors = await page.texts("#errors tbody tr")
    assert len(errors) == 1 and errors[0].split("\t")[:2] == ["model", "model"]
    assert "scripted: the prompt was refused" in errors[0]
    await open_ok(page, f"{eval_url}/trace/{row_of(runs.eval, '4')}", shots / "eval-trace-tool-error.png")
    errors = await page.texts("#errors tbody tr")
    assert len(errors) == 1 and errors[0].startswith("tool\ttool:add")
    assert "Error: ValueError" in await page.text("#conversation")  # the tool's error, as the model saw it


# --- episodes ------------------------------------------------------------------------------------------------
async def test_the_episode_page_shows_the_members_side_by_side_with_private_reasoning_marked(page, debate_url, runs,
                                                                                             shots):
    episode = Episode.model_validate(records(runs.debate / "episodes.jsonl")[0])
    await open_ok(page, f"{debate_url}/", shots / "debate-run.png")
    seats = json.loads((runs.debate / "summary.json").read_text())["seats"]
    figures = await page.evaluate(SUMMARY_FIGURES)
    for member in episode.members:
        assert figures[f"seats.{member}.reward"] == f"{seats[member]['reward']:.3f}"
    assert await page.evaluate("document.querySelector('#rows').getBoundingClientRect().top") < 800  # compact
    rows = await page.evaluate(TABLE_ROWS)
    assert len(rows) == 2
    assert rows[0][3] == ", ".join(f"{m} {shown(episode.rewards[m])}" for m in episode.members)

    await open_ok(page, f"{debate_url}/episode/0", shots / "debate-episode.png")
    columns = await page.evaluate("[...document.querySelectorAll('.members .member')].map(c => "
                                  "{const r = c.getBoundingClientRect(); return [c.dataset.member, r.left, r.top, "
                                  "r.width]})")
    assert [c[0] for c in columns] == episode.members == ["debater_a", "debater_b", "judge"]
    lefts = [c[1] for c in columns]
    assert lefts == sorted(lefts) and len(set(lefts)) == 3  # side by side, in seat order
    assert len({round(c[2]) for c in columns}) == 1 and all(c[3] > 200 for c in columns)

    for member in episode.members:
        head = await page.text(f".member[data-member={member}] .member-head .reward")
        assert float(head) == episode.rewards[member]
    side = episode.task.model_extra["sides"]["debater_a"]
    assert f"VERDICT: {side}" in await page.text(".verdict")

    private = await page.evaluate("[...document.querySelectorAll('.member .private')].map(p => "
                                  "[p.closest('.member').dataset.member, p.innerText, p.title])")
    by_member = {m: [text for who, text, _ in private if who == m] for m in episode.members}
    assert any("private plan: stress" in t for t in by_member["debater_a"])
    assert any("private plan: stress" in t for t in by_member["debater_b"])
    assert any("weighing" in t or "argued first" in t for t in by_member["judge"])
    assert all("private" in title for _, _, title in private)
    assert await page.evaluate(UNMARKED_PRIVATE) == []  # nowhere on the page (the verdict included) unmarked
    judge = await page.text(".member[data-member=judge]")
    assert "private plan" not in judge and f"The answer is ({side})" in judge  # others' reasoning never reaches it


async def test_a_members_trace_page_opens_from_the_episode(page, debate_url, runs, shots):
    await open_ok(page, f"{debate_url}/episode/0/member/debater_a", shots / "debate-member-trace.png")
    assert "debater_a" in await page.text("h1")
    assert "The answer is (" in await page.text("#conversation")
    assert await page.count("#tokens .tokens .t.s") > 0


# --- RL run --------------------------------------------------------------------------------------------------
async def test_the_rl_run_page_draws_the_curves_in_the_page_and_opens_a_steps_traces(page, rl_url, runs, shots):
    await open_ok(page, f"{rl_url}/", shots / "rl-run.png")
    curves = await page.evaluate("[...document.querySelectorAll('figure.curve')].map(f => [f.dataset.key, "
                                 "[...f.querySelectorAll('g.series')].map(g => [g.dataset.series, "
                                 "(g.querySelector('polyline')?.getAttribute('points') || '').trim().split(/\\s+/)"
                                 ".filter(Boolean).length, g.querySelectorAll('circle.point').length])])")
    keys = [key for key, _ in curves]
    for wanted in ("reward", "completion_tokens_mean", "staleness", "groups_filtered", "filters/all/*",
                   "rollouts_filtered", "trainer/loss"):
        assert wanted in keys, f"no {wanted} curve among {keys}"
    points = {key: {name: count for name, count, _ in series} for key, series in curves}
    assert points["reward"]["reward"] == 4  # one point per step
    assert points["eval_reward"] == {"reverse-word": 2}  # the held-out env's evaluations at steps 0 and 4
    assert set(points["filters/all/*"]) == {"filters/all/gibberish", "filters/all/repetition", "filters/all/dropped"}
    ys = await page.evaluate("[...document.querySelector('figure.curve[data-key=reward] g.series polyline')"
                             ".getAttribute('points').trim().split(/\\s+/)].map(p => +p.split(',')[1])")
    assert ys == sorted(ys, reverse=True) and ys[0] > ys[-1]  # the reward rose step by step: the line climbs
    ticks = await page.evaluate("[...document.querySelectorAll('figure.curve text.xtick')].map(t => t.textContent)")
    assert ticks and all(t.isdigit() for t in ticks), ticks  # whole steps only
    assert "failed rollouts" in await page.text(".curves-none")  # no chart without data: named once instead
    loaded = await page.evaluate("performance.getEntriesByType('resource').map(r => r.name)")
    assert all(url.startswith(rl_url) for url in loaded), loaded  # nothing from a CDN: no network here

    await page.click("a[href='/?step=2&phase=train#rows']", navigates=True)
    await page.screenshot(shots / "rl-step-2.png")
    rows = await page.evaluate(TABLE_ROWS)
    step = records(runs.rl / "traces" / "step-000002.jsonl")
    assert len(rows) == len(step) == 12
    head = await page.evaluate("[...document.querySelectorAll('#rows table thead th')].map(th => th.innerText)")
    column = next(i for i, h in enumerate(head) if h.startswith("step"))
    assert {r[column] for r in rows} == {"2"}

    number = int(rows[0][0])
    trace = Trace.model_validate(step[0])
    await open_ok(page, f"{rl_url}/trace/{number}", shots / "rl-trace.png")
    batch = RLFolder(runs.rl).read_batch(2)
    advantage = next(s.advantage for s in batch.samples if s.trace_id == trace.id)
    assert await page.text("#tokens dd[data-key='advantage']") == f"{advantage:.3f}"
    assert await page.text("#tokens dd[data-key='policy version']") == "2"


async def test_an_rl_runs_held_out_episodes_are_listed_and_open(page, rl_url, runs, shots):
    await open_ok(page, f"{rl_url}/?show=episode&phase=held-out", shots / "rl-held-out.png")
    head = await page.evaluate("[...document.querySelectorAll('#rows table thead th')].map(th => th.innerText)")
    rows = await page.evaluate(TABLE_ROWS)
    written = records(runs.rl / "evals" / "eval-debate" / "episodes" / "step-000004.jsonl")
    assert len(rows) == len(written) == 2
    assert {r[head.index("phase")] for r in rows} == {"held-out eval-debate"}
    await open_ok(page, f"{rl_url}/episode/{rows[0][0]}", shots / "rl-held-out-episode.png")
    members = await page.evaluate("[...document.querySelectorAll('.members .member')].map(c => c.dataset.member)")
    assert members == ["debater_a", "debater_b", "judge"]
    assert await page.evaluate(UNMARKED_PRIVATE) == []
    await page.goto(f"{rl_url}/?show=episode&q=Both+were+brief")  # the judge's reasoning, in its trace
    assert len(await page.evaluate(TABLE_ROWS)) == 2


# --- bad input and a live folder -----------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "status"), [
    ("/trace/999999", 404), ("/trace/abc", 404), ("/episode/0", 404), ("/trace/0?branch=7", 400),
    ("/?reward_min=abc", 400), ("/?page=-1&sort=%00%27%3Cscript%3E", 400), ("/?nonsense=1", 400),
    ("/static/../../etc/passwd", 404), ("/no/such/page", 404)])
async def test_bad_paths_and_garbage_queries_get_a_4xx_page_without_a_traceback(page, eval_url, shots, path, status):
    response = await page.goto(f"{eval_url}{path}")
    name = "bad-" + "".join(c if c.isalnum() else "-" for c in path).strip("-")[:40] + ".png"
    await page.screenshot(shots / name)
    assert response.status == status
    body = await page.text("body")
    assert str(status) in await page.text("h1")
    assert "Traceback" not in body and 'File "' not in body
    assert await page.count("a[href='/']") >= 1  # a way back to the run
    assert page.errors == []


async def test_a_trace_appended_to_a_running_folder_appears_on_reload(page, runs, shots, tmp_path):
    traces_file = runs.live / "traces.jsonl"
    before = records(traces_file)
    added = {**before[0], "id": "appended-while-viewing", "rollout_index": 7}
    line = json.dumps(added) + "\n"
    with viewer(runs.live, tmp_path / "view-live.log") as url:
        await open_ok(page, f"{url}/", shots / "live-before.png")
        assert len(await page.evaluate(TABLE_ROWS)) == len(before)
        with traces_file.open("a") as f:
            f.write(line[:100])  # the writer is part way through the line
        await page.reload()
        assert len(await page.evaluate(TABLE_ROWS)) == len(before)
        assert "the last line is incomplete" in " ".join(await page.texts(".note"))
        with traces_file.open("a") as f:
            f.write(line[100:])
        await page.reload()
        await page.screenshot(shots / "live-after.png")
        rows = await page.evaluate(TABLE_ROWS)
        assert len(rows) == len(before) + 1 and (rows[-1][1], rows[-1][2]) == (added["task_key"], "7")
        assert "incomplete" not in " ".join(await page.texts(".note"))


# --- once defects: private reasoning everywhere, the taskset by its id -------------------------------------------
@pytest.mark.parametrize("path", ["/episode/0/member/debater_a", "/episode/0/member/judge"])
async def test_private_reasoning_is_marked_private_on_a_members_trace_page(page, debate_url, path):
    await page.goto(f"{debate_url}{path}")
    assert await page.evaluate(UNMARKED_PRIVATE) == []  # the tokens view shows exact tokens: left out


async def test_the_run_page_names_the_taskset_by_its_id(page, debate_url):
    await page.goto(f"{debate_url}/")
    status = await page.evaluate("Object.fromEntries([...document.querySelectorAll('main > dl.kv')[0]"
                                 ".querySelectorAll('dt')].map(dt => [dt.innerText, dt.nextElementSibling.innerText]))")
    assert status["taskset"] == "debate"
