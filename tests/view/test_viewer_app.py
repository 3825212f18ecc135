"""The viewer's HTTP app without a browser: pages and /api/ endpoints over run folders made by the fakes."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from viewer_folders import (
    episode_log,
    episodes_folder,
    eval_folder,
    files_of,
    long_member_folder,
    long_message_folder,
    rl_folder,
    tool_trace,
)

from tracegym.core.episode import Episode
from tracegym.testing import make_episode
from tracegym.train.rl_folder import RLFolder
from tracegym.view.app import make_app
from tracegym.view.message_view import PREVIEW_CAP, TEXT_CAP
from tracegym.view.run_folder_index import RunFolderIndex


async def _client(path: Path) -> TestClient:
    index = RunFolderIndex.open(path)
    index.refresh()
    client = TestClient(TestServer(make_app(index, follow=False)))
    await client.start_server()
    return client


@pytest.fixture
async def eval_client(tmp_path: Path) -> AsyncIterator[TestClient]:
    client = await _client(eval_folder(tmp_path))
    yield client
    await client.close()


async def _json(client: TestClient, url: str, status: int = 200) -> dict:
    response = await client.get(url)
    assert response.status == status, await response.text()
    return await response.json()


async def _text(client: TestClient, url: str, status: int = 200) -> str:
    response = await client.get(url)
    text = await response.text()
    assert response.status == status, text
    assert "Traceback" not in text
    return text


# --- run page and rows -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["evil.example:8765", "192.168.1.20"])
async def test_a_request_for_another_host_name_is_refused(eval_client, host):
    response = await eval_client.get("/", headers={"Host": host})
    assert response.status == 421 and "loopback only" in await response.text()


@pytest.mark.parametrize("host", ["localhost:8765", "127.0.0.1:8765", "[::1]:8765"])
async def test_a_request_for_a_loopback_host_is_served(eval_client, host):
    assert (await eval_client.get("/", headers={"Host": host})).status == 200


async def test_run_page_prints_summary_json_numbers_to_3_decimals(eval_client, tmp_path):
    summary = json.loads((tmp_path / "calc--fake-model" / "run" / "summary.json").read_text())
    page = await _text(eval_client, "/")
    assert f"<dt>reward</dt><dd>{summary['reward']:.3f}</dd>" in page
    assert f"<dt>reward_ci95</dt><dd>{summary['reward_ci95']:.3f}</dd>" in page
    assert f'<td class="num" data-key="pass_at_k.1">{summary["pass_at_k"]["1"]:.3f}</td>' in page  # by k, in a table
    assert "<dt>num_traces</dt><dd>10</dd>" in page
    api = await _json(eval_client, "/api/run")
    assert api["summary"] == summary and api["traces"] == 12 and api["unreadable"] == 2


async def test_a_run_without_summary_json_yet_shows_counts_and_computes_no_figure(tmp_path):
    path = eval_folder(tmp_path, broken=False)
    (path / "summary.json").unlink()
    client = await _client(path)
    try:
        page = await _text(client, "/")
        assert "no summary.json yet" in page and "<dt>scored traces so far</dt><dd>7</dd>" in page
        assert "<dt>reward</dt>" not in page  # the run's to compute, once, as summary.json's
    finally:
        await client.close()


async def test_rows_filter_by_reward_stop_error_and_taskset(eval_client):
    rows = (await _json(eval_client, "/api/rows?per_page=100"))["rows"]
    assert len(rows) == 12
    ones = await _json(eval_client, "/api/rows?reward_min=0.9&reward_max=1")
    assert {r["reward"] for r in ones["rows"]} == {1.0} and ones["matching"] == 3
    assert (await _json(eval_client, "/api/rows?stop=truncated"))["matching"] == 1
    model = (await _json(eval_client, "/api/rows?error=model"))["rows"]
    assert [r["errors"] for r in model] == [["model"]]
    assert (await _json(eval_client, "/api/rows?error=unreadable"))["matching"] == 2
    assert (await _json(eval_client, "/api/rows?taskset=rev-hard"))["matching"] == 3
    assert (await _json(eval_client, "/api/rows?error=none&taskset=rev"))["matching"] == 5


async def test_rows_sort_and_page(eval_client):
    by_tokens = (await _json(eval_client, "/api/rows?sort=tokens&desc=1&error=none"))["rows"]
    tokens = [r["completion_tokens"] for r in by_tokens]
    assert tokens == sorted(tokens, reverse=True)
    page2 = await _json(eval_client, "/api/rows?per_page=25&page=1&sort=reward")
    assert page2["pages"] == 1 and page2["per_page"] == 25
    empty = await _json(eval_client, "/api/rows?page=9")
    assert empty["rows"] == [] and empty["matching"] == 12


async def test_search_finds_message_text_only(eval_client):
    found = (await _json(eval_client, "/api/rows?q=ARE+YOU+SURE"))["rows"]
    assert [r["task_key"] for r in found] == [tool_trace().task_key]
    assert (await _json(eval_client, "/api/rows?q=%22a%22%3A+2"))["matching"] == 1  # tool call arguments
    assert (await _json(eval_client, "/api/rows?q=fake-model"))["matching"] == 0  # a field, not a message
    page = await _text(eval_client, "/?q=are+you+sure")
    assert "rows 1 to 1 of 1 matching" in page


async def test_the_run_page_table_and_form_work_without_javascript(eval_client):
    page = await _text(eval_client, "/?sort=reward&desc=1")
    assert '<form class="filters" method="get" action="/">' in page
    assert '<option value="reward" selected>' in page
    assert page.count('href="/trace/') >= 8
    assert "traces.jsonl line 11: corrupt line: not JSON" in page
    assert "the last line is incomplete" in page


# --- trace page ------------------------------------------------------------------------------------------------
async def test_trace_page_shows_the_conversation_scores_and_errors(eval_client):
    page = await _text(eval_client, "/trace/9")
    for shown in ("You add numbers.", "what is 2+3?", 'class="call-name">add<', "&quot;a&quot;: 2",
                  "answers <code>c1</code>", "environment response", "Are you sure? Say it in words.",
                  "It is five (5).",
                  "<td>correct</td><td>1.000</td>", "<td>brief</td><td>0.250</td><td>0.500</td>",
                  "<td>words</td><td>4.000</td>", "add was slow", "tool:add", "<dt>reward</dt><dd>1.125</dd>"):
        assert shown in page, shown
    for part in ('<svg class="timeline"', '<section class="graph">', '<section class="tokens-view" data-branch="0">'):
        assert part in page, part
    assert "could not be drawn" not in page
    trace = await _json(eval_client, "/api/trace/9")
    assert trace["graph"]["nodes"][2]["token_ids"] == [1, 2, 3, 4, 5]


async def test_bad_rows_and_queries_get_a_page_and_a_4xx(eval_client):
    for url, status, said in [
        ("/trace/10", 422, "traces.jsonl line 11: corrupt line"),
        ("/trace/11", 422, "unknown schema version 99"),
        ("/trace/12", 404, "there is no trace 12"),
        ("/trace/-1", 404, "not a row number"),
        ("/trace/abc", 404, "not a row number"),
        ("/episode/0", 404, "there is no episode 0"),
        ("/trace/9?branch=7", 400, "branch"),
        ("/?reward_min=lots", 400, "reward_min=&#x27;lots&#x27; is not a number"),
        ("/?reward_min=nan", 400, "not a number"),
        ("/?stop=exploded", 400, "stop="),
        ("/?page=0", 400, "page="),
        ("/?page=99999999999999", 400, "page="),
        ("/?sort=%00%ff", 400, "sort="),
        ("/?bogus=1", 400, "unknown parameter"),
        ("/?stop=error&stop=completed", 400, "more than once"),
        ("/no/such/page", 404, "Not Found"),
    ]:
        page = await _text(eval_client, url, status)
        assert said in page, (url, page)
    error = await _json(eval_client, "/api/trace/11", 422)
    assert "upgrade tracegym" in error["error"]
    assert (await _json(eval_client, "/api/rows?per_page=7", 400))["status"] == 400


async def test_a_corrupt_summary_is_computed_again_from_the_traces(tmp_path):
    client = await _client(eval_folder(tmp_path, broken=False))
    try:
        summary = tmp_path / "calc--fake-model" / "run" / "summary.json"
        written = json.loads(summary.read_text())
        summary.write_text("{not json")
        page = await _text(client, "/")
        assert "summary.json is not valid JSON" in page and "computed again from the run&#x27;s traces" in page
        api = await _json(client, "/api/run")
        assert api["summary"]["reward"] == written["reward"] and api["summary"]["num_traces"] == written["num_traces"]
    finally:
        await client.close()


async def test_an_unreadable_file_is_a_4xx_page(tmp_path):
    client = await _client(eval_folder(tmp_path, broken=False))
    try:
        summary = tmp_path / "calc--fake-model" / "run" / "summary.json"
        (summary.parent / "config.toml").write_text("= not toml")
        assert "is not valid TOML" in await _text(client, "/", 422)
        assert "It is five" in await _text(client, "/trace/9")  # a trace page needs no config
    finally:
        await client.close()


# --- live, read-only -------------------------------------------------------------------------------------------
async def test_appended_traces_show_without_restart_and_the_folder_is_never_written(tmp_path):
    path = eval_folder(tmp_path, broken=False)
    before = files_of(path)
    client = await _client(path)
    try:
        assert (await _json(client, "/api/run"))["traces"] == 10
        for page in ("/", "/trace/0", "/trace/9", "/api/rows?q=five", "/api/trace/3", "/?live=1"):
            await _text(client, page)
        assert files_of(path) == before
        with (path / "traces.jsonl").open("ab") as f:  # a writer mid-line, then finishing it
            line = tool_trace(5).model_dump_json().encode()
            f.write(line[:100])
            f.flush()
            assert "the last line is incomplete (100 bytes" in await _text(client, "/")
            f.write(line[100:] + b"\n")
        assert (await _json(client, "/api/run"))["traces"] == 11
        assert (await _json(client, "/api/rows?q=are+you+sure"))["matching"] == 2  # the search picks it up too
        assert "It is five" in await _text(client, "/trace/10")
        assert 'http-equiv="refresh"' in await _text(client, "/?live=1")
    finally:
        await client.close()


async def test_a_rewritten_traces_file_is_indexed_again(tmp_path):
    path = eval_folder(tmp_path, broken=False)
    client = await _client(path)
    try:
        episode_log(path).write([Episode.solo(tool_trace(i)) for i in range(3)])  # what a resume does
        run = await _json(client, "/api/run")
        assert run["traces"] == 3 and run["generation"] == 1
    finally:
        await client.close()


# --- episodes and RL runs --------------------------------------------------------------------------------------
async def test_episode_run_lists_episodes_and_shows_each_member(tmp_path):
    client = await _client(episodes_folder(tmp_path))
    try:
        rows = (await _json(client, "/api/rows"))["rows"]
        assert [r["member_rewards"] for r in rows] == [{"debater_a": 1.0, "debater_b": 0.0, "judge": 1.0},
                                                         {"debater_a": 0.0, "debater_b": 1.0, "judge": None}]
        assert (await _json(client, "/api/rows?reward_min=1&reward_max=1"))["matching"] == 2
        assert (await _json(client, "/api/rows?error=task"))["matching"] == 1
        assert (await _json(client, "/api/rows?show=trace"))["matching"] == 6
        page = await _text(client, "/episode/1")
        assert "member &#x27;judge&#x27; gave no &#x27;VERDICT: X&#x27; line" in page
        assert page.count('href="/episode/1/member/') == 3
        assert 'class="members-table"' in page and page.count('<div class="member" data-member=') == 3
        member = await _text(client, "/episode/0/member/debater_b")
        assert "you are debater_b" in member
        await _text(client, "/episode/0/member/nobody", 404)
        episode = await _json(client, "/api/episode/0")
        assert set(episode["traces"]) == {"debater_a", "debater_b", "judge"}
        assert "<dt>num_episodes</dt><dd>2</dd>" in await _text(client, "/")
    finally:
        await client.close()


async def test_rl_run_shows_steps_curves_and_the_traces_of_a_step(tmp_path):
    client = await _client(rl_folder(tmp_path))
    try:
        page = await _text(client, "/")
        assert '<a href="/?step=1&phase=train#rows">1</a>' in page and "<td>0.750</td>" in page
        drawn = re.findall(r'data-key="([\w/*]+)"><figcaption>[^<]*</figcaption><svg', page)
        assert drawn == ["reward", "eval_reward", "completion_tokens_mean", "staleness", "trainer/loss"]
        rows = (await _json(client, "/api/rows?step=1&phase=train"))["rows"]
        assert [(r["step"], r["index"]) for r in rows] == [(1, 0), (1, 1)]
        trace = await _text(client, "/trace/3")
        assert "<dt>advantage</dt><dd>-0.500</dd>" in trace and "policy v1" in trace
        metrics = await _json(client, "/api/metrics")
        assert [m["loss"] for m in metrics["trainer"]] == [1.0, 0.5]
        assert (await _json(client, "/api/run"))["steps"] == [0, 1]
    finally:
        await client.close()


async def test_rl_runs_held_out_episodes_are_rows_and_search_finds_episodes(tmp_path):
    client = await _client(rl_folder(tmp_path))
    try:
        rows = (await _json(client, "/api/rows?show=episode&phase=held-out"))["rows"]
        assert [(r["held_out"], r["step"], r["taskset"]) for r in rows] == [("eval-debate", 1, "debate")]
        assert (await _json(client, "/api/rows?show=episode&phase=train"))["rows"] == []
        page = await _text(client, "/?show=episode")
        assert "<td>held-out eval-debate</td>" in page and '<select name="phase">' in page
        episode = await _text(client, f"/episode/{rows[0]['n']}")
        assert "debater_a" in episode and "1.000" in episode
        member = (await _json(client, f"/api/episode/{rows[0]['n']}"))["traces"]["debater_a"]
        said = member["graph"]["nodes"][-1]["message"]["content"]
        found = await _json(client, f"/api/rows?show=episode&q={said[3:12]}")
        assert [r["n"] for r in found["rows"]] == [rows[0]["n"]]
        assert (await _json(client, "/api/rows?show=episode&q=no such words"))["rows"] == []
    finally:
        await client.close()


async def test_rl_runs_held_out_single_agent_evaluation_lists_its_traces_and_no_episodes(tmp_path):
    path = rl_folder(tmp_path)
    RLFolder(path).write_episodes(2, [Episode.solo(tool_trace(i)) for i in range(3)], held_out="calc")
    client = await _client(path)
    try:
        rows = (await _json(client, "/api/rows?phase=held-out&step=2"))["rows"]
        assert [(r["held_out"], r["step"], r["index"]) for r in rows] == [("calc", 2, i) for i in range(3)]
        assert (await _json(client, "/api/run"))["episodes"] == 1  # the held-out debate's; solo records add none
        page = await _text(client, f"/trace/{rows[0]['n']}")
        assert "It is five" in page and "<dt>advantage</dt>" not in page  # no step trained on it
        assert "<td>held-out calc</td>" in await _text(client, "/?phase=held-out")
    finally:
        await client.close()


async def test_rl_runs_multi_agent_steps_list_episodes_joined_with_their_members_traces(tmp_path):
    folder = RLFolder.create(tmp_path, run_id="rl")
    folder.write_episodes(0, [make_episode({"player_0": 1.0, "player_1": -1.0}) for _ in range(2)])
    client = await _client(folder.path)
    try:
        rows = (await _json(client, "/api/rows"))["rows"]  # a multi-agent run lists its episodes first
        traces = (await _json(client, "/api/rows?show=trace"))["rows"]
        assert [r["member_rewards"] for r in rows] == [{"player_0": 1.0, "player_1": -1.0}] * 2
        assert [r["turns"] for r in rows] == [sum(t["turns"] for t in traces[:2]), sum(t["turns"] for t in traces[2:])]
        assert [t["where"] for t in traces] == [f"traces/step-000000.jsonl line {n}" for n in range(1, 5)]
        page = await _text(client, "/episode/1")
        assert page.count('href="/episode/1/member/') == 2
        assert set((await _json(client, "/api/episode/1"))["traces"]) == {"player_0", "player_1"}
    finally:
        await client.close()


def test_episode_records_are_indexed_only_after_the_traces_they_join(tmp_path):
    index = RunFolderIndex.open(episodes_folder(tmp_path))
    index.refresh(max_lines=3)
    assert (len(index.traces), len(index.episodes)) == (3, 0)
    index.refresh()
    assert [r.turns for r in index.episodes] == [sum(t.turns for t in index.traces[:3]),
                                                 sum(t.turns for t in index.traces[3:])]


def test_row_links_are_stable_across_the_pages(tmp_path):
    index = RunFolderIndex.open(eval_folder(tmp_path))
    index.refresh(max_lines=5)
    assert len(index.traces) == 5
    index.refresh()
    assert len(index.traces) == 12 and [r.line for r in index.traces] == list(range(1, 13))
    assert re.search(r"line 12", index.where(index.traces[-1]))


async def test_the_follower_indexes_in_the_background_and_picks_up_appends(tmp_path):
    path = eval_folder(tmp_path, broken=False)
    client = TestClient(TestServer(make_app(RunFolderIndex.open(path))))  # not refreshed: the follower reads it
    await client.start_server()
    try:
        assert await _eventually(client, 10)
        writer = episode_log(path)
        writer.append(Episode.solo(tool_trace(7)))
        writer.close()
        assert await _eventually(client, 11)
    finally:
        await client.close()


async def _eventually(client: TestClient, traces: int) -> bool:
    for _ in range(100):
        if (await _json(client, "/api/run"))["traces"] == traces:
            return True
        await asyncio.sleep(0.05)
    return False


def test_the_viewer_imports_neither_torch_nor_transformers():
    code = "import sys, tracegym.cli.view; print(sorted({'torch', 'transformers', 'vllm'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")})
    assert done.stdout.strip() == "[]"


# --- a message too long to inline ------------------------------------------------------------------------------
LINE = "line {:07d} <script>alert(1)</script> & more\n"


def long_text(chars: int) -> str:
    """Numbered lines with markup in them, cut to `chars` characters."""
    return "".join(LINE.format(i) for i in range(chars // len(LINE.format(0)) + 1))[:chars]


def reader_pre(page: str) -> str:
    """The text a reader page shows, unescaped."""
    [shown] = re.findall(r'<pre class="raw reader" data-page="\d+" data-start="\d+">(.*?)</pre>', page, re.S)
    assert "<" not in shown  # escaped: a <script> in the text is shown, never run
    return html.unescape(shown)


async def test_a_5_mb_message_makes_a_small_trace_page_that_says_what_it_leaves_out_and_links_to_the_reader(
        tmp_path):
    text = long_text(5_000_000)
    client = await _client(long_message_folder(tmp_path, text))
    try:
        page = await _text(client, "/trace/0")
        assert len(page.encode()) < 1_000_000
        more = f"{len(text) - TEXT_CAP:,} more characters not shown here ({len(text):,} in all)"
        assert more in page and '<a href="/trace/0/node/3/text?page=2">read them from page 2 of 50</a>' in page
        graph = page[page.index('<section class="graph">'):page.index('<section class="tokens-view"')]
        assert f"{len(text) - PREVIEW_CAP:,} more characters" in graph and "/trace/0/node/3/text?page=1" in graph
        shown = page.count("&lt;script&gt;alert(1)&lt;/script&gt;")  # the conversation's head and the graph's
        assert shown <= (TEXT_CAP + PREVIEW_CAP) // len(LINE.format(0)) + 2
        assert "<script>alert" not in page and "It is five (5)." in page  # and the rest of the trace is there
    finally:
        await client.close()


async def test_the_readers_pages_are_bounded_and_together_are_the_whole_text(tmp_path):
    text = long_text(5_000_000)
    client = await _client(long_message_folder(tmp_path, text))
    try:
        pages = []
        for k in range(1, 51):
            page = await _text(client, f"/trace/0/node/3/text?page={k}")
            assert len(page.encode()) < 2 * TEXT_CAP and f"page {k} of 50" in page
            assert ("← previous</a>" in page) == (k > 1) and ("next →</a>" in page) == (k < 50)
            pages.append(reader_pre(page))
        assert "".join(pages) == text and {len(p) for p in pages} == {TEXT_CAP}
        api = [await _json(client, f"/api/trace/0/node/3/text?page={k}") for k in (1, 50)]
        assert [(a["page"], a["pages"], a["chars"], a["start"]) for a in api] == [
            (1, 50, len(text), 0), (50, 50, len(text), 49 * TEXT_CAP)]
        assert api[0]["text"] == pages[0] and api[1]["text"] == pages[-1] and api[0]["role"] == "tool"
        call = await _json(client, "/api/trace/0/node/2/text?part=call-0")
        assert call["text"] == '{"a": 2, "b": 3}' and call["parts"] == ["text", "call-0"]
    finally:
        await client.close()


async def test_a_node_part_or_page_the_trace_lacks_is_a_404_page(tmp_path):
    client = await _client(long_message_folder(tmp_path, long_text(250_000)))
    try:
        for url, status, said in [
            ("/trace/0/node/6/text", 404, "this trace has no node &#x27;6&#x27;: its nodes are 0 to 5"),
            ("/trace/0/node/x/text", 404, "no node &#x27;x&#x27;"),
            ("/trace/0/node/3/text?page=0", 404, "page 0 is out of range: the text of node 3 has pages 1 to 3"),
            ("/trace/0/node/3/text?page=4", 404, "pages 1 to 3"),
            ("/trace/0/node/3/text?page=two", 400, "not a page number"),
            ("/trace/0/node/3/text?part=call-0", 404, "node 3 has no text &#x27;call-0&#x27;: it has text"),
            ("/trace/0/node/3/text?page=1&page=2", 400, "each once"),
            ("/trace/0/node/3/text?line=2", 400, "not line"),
            ("/trace/1/node/3/text", 404, "there is no trace 1"),
        ]:
            page = await _text(client, url, status)
            assert said in page and "back to the run" in page, (url, page)
        assert "pages 1 to 3" in (await _json(client, "/api/trace/0/node/3/text?page=9", 404))["error"]
    finally:
        await client.close()


async def test_an_episode_members_long_message_is_paged_from_the_episode_and_the_member_page(tmp_path):
    text = long_text(250_000)
    path, node = long_member_folder(tmp_path, text)
    client = await _client(path)
    try:
        reader = f"/episode/0/member/debater_a/node/{node}/text"
        for url in ("/episode/0", "/episode/0/member/debater_a"):
            page = await _text(client, url)
            assert len(page.encode()) < 1_000_000 and f"{len(text) - TEXT_CAP:,} more characters" in page
            assert f'href="{reader}?page=2"' in page, url
        pages = [reader_pre(await _text(client, f"{reader}?page={k}")) for k in (1, 2, 3)]
        assert "".join(pages) == text
        assert (await _json(client, f"/api{reader}?page=3"))["text"] == pages[2]
        await _text(client, f"{reader}?page=4", 404)
        assert "no trace of a member &#x27;nobody&#x27;" in await _text(client, "/episode/0/member/nobody/node/0/text",
                                                                          404)
    finally:
        await client.close()
