"""`tracegym eval` on a multi-agent taskset end to end against the fake OpenAI server: the run folder's episodes,
per-seat summary, seat flags, resume and rescore."""

import json
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.eval.run_folder import RunFolder
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer


def player(request) -> str:
    """Checks when it may and calls a bet; player_1 says it with a malformed think first."""
    if "You are player_1" in request.messages[0].text:
        return "<think>hmm check call"  # unclosed: nothing public, an invalid move, then a forfeit
    return "<think>I hold my card</think> check call"


@pytest.fixture
def server():
    with FakeOpenAIServer(rule=player) as fake:
        yield fake


def eval_args(server, tmp_path, *extra: str) -> list[str]:
    return ["eval", "kuhn-poker", "-n", "5", "--model.base-url", server.base_url, "--output-dir", str(tmp_path),
            "--no-rich", "--no-serve", *extra]


def only_run(tmp_path: Path) -> Path:
    [run] = list(tmp_path.glob("*/*"))
    return run


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_eval_writes_episodes_member_traces_and_a_per_seat_summary(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path)) == 0
    run = only_run(tmp_path)
    episodes, traces = lines(run / "episodes.jsonl"), lines(run / "traces.jsonl")
    assert len(episodes) == 5 and "traces" not in episodes[0]
    assert sorted((t["episode_id"], t["member"]) for t in traces) == sorted(
        (e["id"], m) for e in episodes for m in e["members"])
    summary = json.loads((run / "summary.json").read_text())
    seats = summary["seats"]
    assert seats["player_0"]["outcomes"]["win"] == 1.0 and seats["player_1"]["forfeit_rate"] == 1.0
    assert seats["player_0"]["reward"] == 1.0 and seats["player_1"]["reward"] == -1.0
    assert seats["player_1"]["parse_error_rate"] == 1.0 and summary["forfeit_rate"] == 1.0
    assert summary["num_ok"] == 5 and summary["parse_error_rate"] == 0.75  # 15 of 20 replies were player_1's
    shown = capsys.readouterr().out
    assert "player_0" in shown and "+1.000 ± 0.000" in shown


def test_episodes_run_on_an_env_server_given_by_address(server, tmp_path):
    """`--env-address` names a running server: the episodes go there (this once crashed on the address list)."""
    args = [a for a in eval_args(server, tmp_path) if a != "--no-serve"]
    with local_server("kuhn-poker", workers=1) as address:
        assert main([*args, "--env-address", address]) == 0
    assert len(lines(only_run(tmp_path) / "episodes.jsonl")) == 5
    assert not (only_run(tmp_path) / "logs" / "env").exists()  # no server of its own was started


def test_a_seat_pinned_by_flags_plays_that_model_and_does_not_train(server, tmp_path):
    with FakeOpenAIServer(rule=player, model="base") as base:
        assert main(eval_args(server, tmp_path, "--seat.player_1.model", "base",
                              "--seat.player_1.base-url", base.base_url)) == 0
    episodes = RunFolder(only_run(tmp_path)).log.read().episodes
    assert all(e.ok and e.models["player_1"] == "base" and e.trainable == {"player_0": True, "player_1": False}
               for e in episodes)
    assert base.requests and all("You are player_1" in json.dumps(r) for r in base.requests)
    assert not any("You are player_1" in json.dumps(r) for r in server.requests)


def test_a_seat_the_taskset_has_not_exits_2_naming_it_and_writes_nothing(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path, "--seat.player_7.model", "base")) == 2
    assert "seat override for 'player_7'" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_a_seat_given_for_a_single_agent_taskset_exits_2_saying_it_has_none(server, tmp_path, capsys):
    args = ["eval", "reverse-text", "-n", "1", "--model.base-url", server.base_url, "--output-dir", str(tmp_path),
            "--no-rich", "--no-serve", "--seat.judge.model", "base"]
    assert main(args) == 2
    shown = capsys.readouterr().err
    assert "seat override for 'judge'" in shown and "none: it is single-agent" in shown
    assert not list(tmp_path.iterdir())


def test_resume_plays_exactly_the_missing_and_errored_episodes(server, tmp_path):
    assert main(eval_args(server, tmp_path)) == 0
    run = only_run(tmp_path)
    records = (run / "episodes.jsonl").read_text().splitlines()
    errored = json.loads(records[1])
    errored.update(stop_reason="error")
    (run / "episodes.jsonl").write_text("\n".join([records[0], json.dumps(errored), *records[2:4]]) + "\n")
    with (run / "traces.jsonl").open("a") as f:
        f.write('{"schema_version": 1, "id": "cut-off')  # a killed writer's last line
    assert main(["eval", "--resume", str(run), "--no-rich"]) == 0
    episodes = RunFolder(run).log.read().episodes
    assert sorted((e.task_key, e.episode_index) for e in episodes) == [(f"kuhn-0-{i}", 0) for i in range(5)]
    assert all(len(e.traces) == 2 and e.ok for e in episodes)
    assert [e["id"] for e in lines(run / "episodes.errored.jsonl")] == [errored["id"]]
    assert len(lines(run / "traces.jsonl")) == 10
    before = len(server.requests)
    assert main(["eval", "--resume", str(run), "--no-rich"]) == 0
    assert len(server.requests) == before  # nothing left to play


def test_rescore_replays_episodes_from_their_traces_without_a_model(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path)) == 0
    run = only_run(tmp_path)
    before = len(server.requests)
    assert main(["rescore", str(run)]) == 0
    assert len(server.requests) == before
    [rescored] = list(run.glob("episodes.rescored-*.jsonl"))
    stamp = rescored.name.removeprefix("episodes.rescored-").removesuffix(".jsonl")
    episodes = RunFolder(run).side_log(f"rescored-{stamp}").read().episodes
    original = RunFolder(run).log.read().episodes
    assert [(e.id, e.rewards, e.outcomes) for e in episodes] == [(e.id, e.rewards, e.outcomes) for e in original]
    assert "player_0" in capsys.readouterr().out
