"""The viewer over run folders written before every run was an episode (tests/data/legacy_runs): every trace is
listed and opens with its tokens, multi-agent episodes open with their members, and a single-agent eval folder
lists the same rows in the episode-log layout that replaced the old one."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tracegym.config.episode_log import EpisodeLog
from tracegym.core.episode import Episode
from tracegym.core.trace import Trace
from tracegym.eval.run_folder import CONFIG, EPISODES, SUMMARY, TRACES
from tracegym.train.rl_folder import RLFolder
from tracegym.view.app import make_app
from tracegym.view.run_folder_index import RowKind, RunFolderIndex

LEGACY = Path(__file__).parents[1] / "data" / "legacy_runs"
FOLDERS = ["eval-reverse-text", "eval-kuhn-poker", "rl"]
MULTI_AGENT = ["eval-kuhn-poker", "rl"]


def written(path: Path) -> list[Trace]:
    """Every trace the folder holds, as the episode log reader reads it (not the index)."""
    if (path / TRACES).exists():
        logs = [EpisodeLog(path / TRACES, path / EPISODES)]
    else:
        rl = RLFolder(path)
        logs = [rl.step_log(step, env) for env in (None, *rl.held_out_envs()) for step in rl.steps(env)]
    return [t for log in logs for t in log.read().traces]


def indexed(path: Path) -> RunFolderIndex:
    index = RunFolderIndex.open(path)
    index.refresh()
    return index


@pytest.fixture
async def client(request: pytest.FixtureRequest) -> AsyncIterator[TestClient]:
    client = TestClient(TestServer(make_app(indexed(LEGACY / request.param), follow=False)))
    await client.start_server()
    yield client
    await client.close()


async def _get(client: TestClient, url: str) -> str:
    response = await client.get(url)
    text = await response.text()
    assert response.status == 200, text
    return text


@pytest.mark.parametrize("name", FOLDERS)
def test_the_index_lists_every_trace_of_a_legacy_folder(name):
    index = indexed(LEGACY / name)
    shown = [index.trace(n) for n in range(len(index.traces))]
    assert sorted(t.id for t in shown) == sorted(t.id for t in written(LEGACY / name))
    assert all(any(node.token_ids for node in t.graph.nodes) for t in shown)
    assert index.unreadable == 0 and index.incomplete() == []


@pytest.mark.parametrize(("name", "first"), [("eval-reverse-text", RowKind.TRACE),
                                             ("eval-kuhn-poker", RowKind.EPISODE), ("rl", RowKind.EPISODE)])
def test_a_legacy_folder_first_lists_its_traces_or_its_multi_agent_episodes(name, first):
    assert indexed(LEGACY / name).first_shown is first


def test_a_legacy_rl_folder_shows_its_steps_and_held_out_evaluation():
    index = indexed(LEGACY / "rl")
    assert index.steps() == [0, 1, 2] and index.held_out_envs() == ["eval-kuhn-poker"]
    held_out = [r for r in index.episodes if r.held_out is not None]
    assert [(r.held_out, r.step, r.taskset) for r in held_out] == [("eval-kuhn-poker", 0, "kuhn-poker")]


@pytest.mark.parametrize("client", FOLDERS, indirect=True)
async def test_the_app_opens_every_trace_of_a_legacy_folder_with_its_tokens(client):
    rows = (await (await client.get("/api/rows?show=trace&per_page=500")).json())["rows"]
    assert rows
    for row in rows:
        page = await _get(client, f"/trace/{row['n']}")
        assert '<span class="t s' in page and "could not be drawn" not in page, row["where"]


@pytest.mark.parametrize("client", MULTI_AGENT, indirect=True)
async def test_the_app_opens_a_legacy_folders_episodes_with_their_members(client):
    rows = (await (await client.get("/api/rows?show=episode")).json())["rows"]
    assert rows
    for row in rows:
        page = await _get(client, f"/episode/{row['n']}")
        assert page.count(f'href="/episode/{row["n"]}/member/') == 2
        member = await _get(client, f"/episode/{row['n']}/member/player_1")
        assert '<span class="t s' in member


async def test_a_new_single_agent_eval_folder_lists_the_same_trace_rows_as_the_old_one(tmp_path):
    old = LEGACY / "eval-reverse-text"
    new = tmp_path / "new"
    new.mkdir()
    for name in (CONFIG, SUMMARY):
        shutil.copy(old / name, new / name)
    EpisodeLog(new / TRACES, new / EPISODES).write(Episode.solo(t) for t in written(old))
    seen = {}
    for path in (old, new):
        client = TestClient(TestServer(make_app(indexed(path), follow=False)))
        await client.start_server()
        try:
            run = await (await client.get("/api/run")).json()
            rows = await (await client.get("/api/rows?per_page=500")).json()
            seen[path] = (run["traces"], run["episodes"], rows)
        finally:
            await client.close()
    assert seen[new] == seen[old]
    assert seen[new][:2] == (6, 0)
