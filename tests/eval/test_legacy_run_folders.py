"""Run folders written before every run was an episode (tests/data/legacy_runs) still open: `show`, `rescore` and
`eval --resume` on a copy of each old eval folder, single-agent (`traces.jsonl` alone) and multi-agent."""

import json
import shutil
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.eval.run_folder import RunFolder
from tracegym.testing import FakeOpenAIServer

LEGACY = Path(__file__).parent.parent / "data" / "legacy_runs"


def reverse(request) -> str:
    return request.messages[-1].text[::-1]


def player(request) -> str:
    """As the multi-agent folder was played: player_1 with a malformed think first."""
    if "You are player_1" in request.messages[0].text:
        return "<think>hmm check call"
    return "<think>I hold my card</think> check call"


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(LEGACY / name, tmp_path / name))


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def pairs(records: list[dict], index: str) -> list[tuple[str, int]]:
    return sorted((r["task_key"], r[index]) for r in records)


def test_show_opens_an_old_single_agent_folder_and_leaves_it_alone(tmp_path, capsys):
    run = copy("eval-reverse-text", tmp_path)
    before = snapshot(run)
    assert main(["show", str(run), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "pass@2" in out and "assistant:" in out
    assert snapshot(run) == before


def test_show_opens_an_old_multi_agent_folder_with_its_per_seat_summary(tmp_path, capsys):
    run = copy("eval-kuhn-poker", tmp_path)
    assert main(["show", str(run), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "player_0" in out and "player_1" in out and "assistant:" in out


def test_rescore_of_an_old_single_agent_folder_rescores_its_traces(tmp_path):
    run = copy("eval-reverse-text", tmp_path)
    stored = lines(run / "traces.jsonl")
    assert main(["rescore", str(run)]) == 0
    [rescored] = list(run.glob("traces.rescored-*.jsonl"))
    assert [(r["id"], r["rewards"]) for r in lines(rescored)] == [(r["id"], r["rewards"]) for r in stored]
    [summary] = list(run.glob("summary.rescored-*.json"))
    assert json.loads(summary.read_text())["num_traces"] == 6 and lines(run / "traces.jsonl") == stored


def test_rescore_of_an_old_multi_agent_folder_replays_its_episodes(tmp_path):
    run = copy("eval-kuhn-poker", tmp_path)
    assert main(["rescore", str(run)]) == 0
    [rescored] = list(run.glob("episodes.rescored-*.jsonl"))
    stored = lines(run / "episodes.jsonl")
    assert [(r["id"], r["rewards"], r["outcomes"]) for r in lines(rescored)] == [
        (r["id"], r["rewards"], r["outcomes"]) for r in stored]


def test_resume_of_an_old_single_agent_folder_reruns_the_missing_pair_into_the_new_format(tmp_path):
    run = copy("eval-reverse-text", tmp_path)
    stored = lines(run / "traces.jsonl")
    (run / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stored[:2] + stored[3:]))
    with FakeOpenAIServer(rule=reverse) as server:
        assert main(["eval", "--resume", str(run), "--model.base-url", server.base_url, "--no-rich"]) == 0
        assert len(server.requests) == 1
    traces, records = lines(run / "traces.jsonl"), lines(run / "episodes.jsonl")
    assert pairs(traces, "rollout_index") == pairs(stored, "rollout_index")
    assert [r["id"] for r in records] == [t["id"] for t in traces] and all(r["members"] == ["agent"] for r in records)
    assert json.loads((run / "summary.json").read_text())["num_traces"] == 6


def test_resume_of_an_old_multi_agent_folder_replays_the_missing_episode(tmp_path):
    run = copy("eval-kuhn-poker", tmp_path)
    stored = lines(run / "episodes.jsonl")
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stored[:2]))  # killed before the last
    with FakeOpenAIServer(rule=player) as server:
        assert main(["eval", "--resume", str(run), "--model.base-url", server.base_url, "--no-rich"]) == 0
        assert server.requests
    episodes = RunFolder(run).log.read().episodes
    assert pairs(lines(run / "episodes.jsonl"), "episode_index") == pairs(stored, "episode_index")
    assert [e.id for e in episodes[:2]] == [r["id"] for r in stored[:2]] and episodes[2].id != stored[2]["id"]
    assert all(len(e.traces) == 2 for e in episodes) and len(lines(run / "traces.jsonl")) == 6


@pytest.mark.parametrize("name", ["eval-reverse-text", "eval-kuhn-poker"])
def test_resume_of_a_complete_old_folder_calls_no_model_and_keeps_every_episode(tmp_path, name):
    run = copy(name, tmp_path)
    ids = [e.id for e in RunFolder(run).log.read().episodes]
    with FakeOpenAIServer(rule=reverse) as server:
        assert main(["eval", "--resume", str(run), "--model.base-url", server.base_url, "--no-rich"]) == 0
        assert not server.requests
    assert [r["id"] for r in lines(run / "episodes.jsonl")] == ids
