"""`tracegym eval`, `show`, `rescore` and `list` end to end against the fake OpenAI server."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.config.episode_log import record_line
from tracegym.core.episode import Episode
from tracegym.core.trace import Trace
from tracegym.eval.run_folder import RunFolder
from tracegym.testing import FakeOpenAIServer
from tracegym.testing.script import Entry, Fail


def reverse(request) -> str:
    return request.messages[-1].text[::-1]


@pytest.fixture
def server():
    with FakeOpenAIServer(rule=reverse) as fake:
        yield fake


def eval_args(server, tmp_path, *extra: str) -> list[str]:
    return ["eval", "reverse-text", "-n", "4", "-r", "2", "--model.base-url", server.base_url,
            "--output-dir", str(tmp_path), "--no-rich", *extra]


def only_run(tmp_path: Path) -> Path:
    [run] = list(tmp_path.glob("*/*"))
    return run


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def leave_rollouts(run: Path, traces: list[dict], tail: str = "") -> None:
    """Leave the run's episode log holding `traces`, each with its solo record, as a run killed after them leaves
    it (with `tail`, a line it was cut off writing)."""
    records = [record_line(Episode.solo(Trace.model_validate(t))) for t in traces]
    (run / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces) + tail)
    (run / "episodes.jsonl").write_text("".join(records))


def test_eval_writes_config_traces_summary_and_logs(server, tmp_path):
    assert main(eval_args(server, tmp_path)) == 0
    run = only_run(tmp_path)
    assert run.parent.name == "reverse-text--fake-model"
    traces, records = lines(run / "traces.jsonl"), lines(run / "episodes.jsonl")
    assert len(traces) == 8 and [r["id"] for r in records] == [t["id"] for t in traces]
    assert all(r["members"] == ["agent"] and "traces" not in r for r in records)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reward"] == 1.0 and summary["num_traces"] == 8 and summary["pass_at_k"]["2"] == 1.0
    assert (run / "config.toml").is_file() and (run / "logs" / "eval.log").is_file()


def test_the_live_dashboard_runs_without_a_terminal_and_shows_its_final_figures(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path)[:-1]) == 0
    out = capsys.readouterr().out
    assert "mean reward 1.000" in out and "8/8" in out and "ETA" in out


def test_no_rich_streams_plain_status_lines(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path)) == 0
    out = [line for line in capsys.readouterr().out.splitlines() if line.startswith("eval: ")]
    assert out[0] == "eval: 8 rollouts to run"
    assert out[1].startswith("eval: 8/8 rollouts  reward 1.000  errors none  truncated 0") and len(out) == 2


def test_the_eval_log_has_one_status_line_per_trace(server, tmp_path):
    assert main(eval_args(server, tmp_path)) == 0
    log = (only_run(tmp_path) / "logs" / "eval.log").read_text().splitlines()
    assert [line.split()[1] for line in log if " rollouts  reward " in line] == [f"{i}/8" for i in range(1, 9)]


def test_dry_run_prints_the_resolved_config_and_writes_nothing(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path, "--dry-run")) == 0
    assert 'id = "reverse-text"' in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_an_unreachable_endpoint_fails_before_any_folder_is_made(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    code = main(["eval", "reverse-text", "-n", "2", "--model.base-url", url, "--output-dir", str(tmp_path)])
    assert code == 1 and url in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_bad_taskset_option_exits_2_and_writes_nothing(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path, "--taskset.max-words", "many")) == 2
    assert "--taskset.max-words" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def refuse_odd_words(request) -> Entry:
    """Answers a prompt of an even number of letters; refuses the rest (HTTP 400: a model error, not retried)."""
    text = request.messages[-1].text
    return Fail(status=400, message="refused") if len(text) % 2 else text[::-1]


def test_an_eval_where_most_rollouts_failed_exits_1_saying_how_many(tmp_path, capsys):
    with FakeOpenAIServer(rule=lambda request: Fail(status=400, message="refused")) as failing:
        assert main(eval_args(failing, tmp_path)) == 1
    err = capsys.readouterr().err
    assert "8 of 8 rollouts failed (100%), more than --max-error-rate 0.5 allows" in err
    assert len(lines(only_run(tmp_path) / "traces.jsonl")) == 8  # the failed rollouts are kept as data


def test_an_eval_under_its_max_error_rate_exits_0_and_heads_its_reward_with_the_scored_count(tmp_path, capsys):
    with FakeOpenAIServer(rule=refuse_odd_words) as half:
        assert main(eval_args(half, tmp_path, "--max-error-rate", "1")) == 0
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert 0 < summary["num_scored"] < summary["num_traces"] == 8
    assert f"{summary['num_scored']} of 8 scored" in capsys.readouterr().out


def test_a_max_error_rate_outside_0_to_1_exits_2(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path, "--max-error-rate", "1.5")) == 2
    assert "max_error_rate" in capsys.readouterr().err.replace("-", "_")


def simulate_kill(run: Path) -> tuple[int, int]:
    """Drop two rollouts, mark one errored, cut the last one mid-line; returns (kept good, to redo)."""
    records = lines(run / "traces.jsonl")
    records[0]["stop_reason"] = "error"
    leave_rollouts(run, records[:5], tail=json.dumps(records[5])[:80])
    return 4, 4  # records 1-4 are good; 0 (errored), 5 (cut), 6, 7 (missing) are redone


def test_resume_reruns_exactly_the_missing_and_errored_rollouts(server, tmp_path):
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    kept, redo = simulate_kill(run)
    before = len(server.requests)
    assert main(["eval", "--resume", str(run), "--no-rich"]) == 0
    assert len(server.requests) - before == redo
    records = lines(run / "traces.jsonl")
    pairs = [(r["task_key"], r["rollout_index"]) for r in records]
    assert len(records) == kept + redo and len(set(pairs)) == len(pairs)
    assert [r["id"] for r in lines(run / "episodes.jsonl")] == [r["id"] for r in records]
    assert len(lines(run / "traces.errored.jsonl")) == len(lines(run / "episodes.errored.jsonl")) == 1


def test_resume_reruns_a_rollout_whose_record_outlived_its_trace(server, tmp_path):
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    rows = (run / "traces.jsonl").read_text().splitlines(keepends=True)
    lost = json.loads(rows[3])
    (run / "traces.jsonl").write_text("".join([*rows[:3], "not json\n", *rows[4:]]))  # a corrupt line
    before = len(server.requests)
    assert main(["eval", "--resume", str(run), "--no-rich"]) == 0
    assert len(server.requests) - before == 1
    records = lines(run / "traces.jsonl")
    assert len(records) == 8 and (lost["task_key"], lost["rollout_index"]) in {
        (r["task_key"], r["rollout_index"]) for r in records}
    assert [r["id"] for r in lines(run / "episodes.errored.jsonl")] == [lost["id"]]


def test_resuming_a_complete_run_calls_no_model(server, tmp_path):
    main(eval_args(server, tmp_path))
    before = len(server.requests)
    assert main(["eval", "--resume", str(only_run(tmp_path)), "--no-rich"]) == 0
    assert len(server.requests) == before


def test_resume_with_a_different_run_defining_option_is_refused(server, tmp_path, capsys):
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    before = (run / "traces.jsonl").read_text()
    assert main(["eval", "--resume", str(run), "-n", "9"]) == 2
    assert "num_tasks = 4, not 9" in capsys.readouterr().err
    assert (run / "traces.jsonl").read_text() == before


def test_resume_of_a_folder_that_is_not_a_run_is_refused(tmp_path, capsys):
    assert main(["eval", "--resume", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_rescore_recomputes_rewards_without_calling_the_model(server, tmp_path):
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    records = lines(run / "traces.jsonl")
    for r in records:  # as if an old reward function had scored everything 0
        r["rewards"]["lcs"]["score"] = 0.0
    (run / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    before = len(server.requests)
    assert main(["rescore", str(run)]) == 0
    assert len(server.requests) == before
    [rescored] = list(run.glob("traces.rescored-*.jsonl"))
    assert [r["rewards"]["lcs"]["score"] for r in lines(rescored)] == [1.0] * 8
    [records] = list(run.glob("episodes.rescored-*.jsonl"))
    assert [r["rewards"]["agent"] for r in lines(records)] == [1.0] * 8
    assert [r["rewards"]["lcs"]["score"] for r in lines(run / "traces.jsonl")] == [0.0] * 8
    [summary] = list(run.glob("summary.rescored-*.json"))
    assert json.loads(summary.read_text())["reward"] == 1.0


def test_show_prints_the_summary_and_traces(server, tmp_path, capsys):
    main(eval_args(server, tmp_path))
    capsys.readouterr()
    assert main(["show", str(only_run(tmp_path)), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "pass@2" in out and "assistant:" in out


def test_list_names_every_builtin_taskset(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("reverse-text", "wordle", "counter-env", "tool-calculator"))


def test_run_folder_opened_by_resume_keeps_its_config(server, tmp_path):
    main(eval_args(server, tmp_path))
    config = RunFolder.open(only_run(tmp_path)).read_config()
    assert config["model"]["name"] == "fake-model" and config["taskset"]["id"] == "reverse-text"


def test_resume_after_kill_9_completes_the_run_without_duplicates(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    with FakeOpenAIServer(rule=reverse, latency=0.1) as fake:
        command = [sys.executable, "-m", "tracegym.cli.main", "eval", "reverse-text", "-n", "20", "-r", "2", "-c", "2",
                   "--model.base-url", fake.base_url, "--output-dir", str(tmp_path), "--no-rich"]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = list(tmp_path.glob("*/*/traces.jsonl"))
            if runs and runs[0].read_text().count("\n") >= 5:
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        run = only_run(tmp_path)
        assert len(RunFolder.open(run).log.read().episodes) < 40  # the last line may be cut off
        assert main(["eval", "--resume", str(run), "--no-rich"]) == 0
    records = lines(run / "traces.jsonl")
    assert len({(r["task_key"], r["rollout_index"]) for r in records}) == len(records) == 40
    assert len(lines(run / "episodes.jsonl")) == 40


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def finished_run_with_config(server, tmp_path, old: str, new: str) -> tuple[Path, dict[str, bytes]]:
    """A finished run whose config.toml has `old` replaced by `new`, and a snapshot of its files."""
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    config = (run / "config.toml").read_text()
    assert old in config
    (run / "config.toml").write_text(config.replace(old, new))
    return run, snapshot(run)


def test_resume_with_another_taskset_id_is_a_mismatch_with_the_saved_run(server, tmp_path, capsys):
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    before = snapshot(run)
    assert main(["eval", "--resume", str(run), "--taskset.id", "wordle"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "does not match the saved run" in err and "'reverse-text'" in err
    assert snapshot(run) == before


@pytest.mark.parametrize("command", [["eval", "--resume"], ["rescore"]])
def test_an_unknown_key_in_the_saved_config_is_named_with_a_suggestion(server, tmp_path, capsys, command):
    run, before = finished_run_with_config(server, tmp_path, "rollouts = 2", "rolouts = 2")
    assert main([*command, str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "config.toml: rolouts: unknown key; did you mean rollouts?" in err
    assert snapshot(run) == before


@pytest.mark.parametrize("command", [["eval", "--resume"], ["rescore"]])
def test_a_wrongly_typed_saved_value_names_the_file_and_key(server, tmp_path, capsys, command):
    run, before = finished_run_with_config(server, tmp_path, "rollouts = 2", 'rollouts = "two"')
    assert main([*command, str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "config.toml: rollouts: Input should be a valid integer" in err
    assert snapshot(run) == before


def test_show_names_a_bad_pass_threshold_in_the_saved_config(server, tmp_path, capsys):
    run, _ = finished_run_with_config(server, tmp_path, "pass_threshold = 1.0", 'pass_threshold = "x"')
    assert main(["show", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "config.toml: pass_threshold" in err


def test_wall_time_after_a_resume_adds_up_every_session(server, tmp_path):
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "wall_time": 1000.0}))  # a long first session
    leave_rollouts(run, lines(run / "traces.jsonl")[:-2])  # killed before the last two
    assert main(["eval", "--resume", str(run), "--no-rich"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert 1000.0 < summary["wall_time"] < 1060.0
    assert summary["rollouts_per_second"] == pytest.approx(8 / summary["wall_time"])


def test_resume_samples_with_the_saved_config(server, tmp_path):
    main(eval_args(server, tmp_path, "--sampling.temperature", "0.3"))
    run = only_run(tmp_path)
    leave_rollouts(run, lines(run / "traces.jsonl")[:5])  # killed after five rollouts
    before = len(server.requests)
    assert main(["eval", "--resume", str(run), "--no-rich"]) == 0
    resumed = server.requests[before:]
    assert len(resumed) == 3 and {r["temperature"] for r in resumed} == {0.3}


def test_dry_run_refuses_an_unknown_option_of_a_factory_built_taskset(tmp_path, capsys):
    assert main(["eval", "counter-env", "--dry-run", "--taskset.bogus", "3", "--output-dir", str(tmp_path)]) == 2
    assert "--taskset.bogus: unknown option" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_dry_run_builds_the_taskset_so_an_unannotated_factory_checks_its_options(tmp_path, capsys):
    factory = tmp_path / "my_counter.py"
    factory.write_text("from tracegym.tasksets.counter_env import counter_env\n\n\n"
                       "def make(config=None):\n    return counter_env(config)\n")
    assert main(["eval", f"{factory}:make", "--dry-run", "--taskset.bogus", "3"]) == 2
    assert "'bogus'" in capsys.readouterr().err


def test_a_resume_mismatch_names_only_the_field_that_differs(server, tmp_path, capsys):
    main(eval_args(server, tmp_path))
    assert main(["eval", "--resume", str(only_run(tmp_path)), "--sampling.temperature", "0.9"]) == 2
    err = capsys.readouterr().err
    assert "sampling.temperature = 1.0, not 0.9" in err and "top_p" not in err


def test_show_warns_about_corrupt_middle_lines(server, tmp_path, capsys):
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    text = (run / "traces.jsonl").read_text().splitlines(keepends=True)
    (run / "traces.jsonl").write_text("".join([text[0], "not json\n", *text[1:]]))
    capsys.readouterr()
    assert main(["show", str(run)]) == 0
    assert "1 line(s) of traces.jsonl or episodes.jsonl could not be read" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("garbage", [b"not json at all", b"\xff\xfe\x00 binary"], ids=["text", "binary"])
def test_resume_sets_a_corrupt_line_aside_names_it_and_reruns_its_rollout(server, tmp_path, capsys, garbage):
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    rows = (run / "traces.jsonl").read_bytes().splitlines(keepends=True)
    (run / "traces.jsonl").write_bytes(b"".join([rows[0], garbage + b"\n", *rows[2:]]))  # row 1 is overwritten
    capsys.readouterr()
    assert main(["eval", "--resume", str(run), "--model.base-url", server.base_url, "--no-rich"]) == 0
    err = capsys.readouterr().err
    assert "1 line(s) of traces.jsonl could not be read (line 2: corrupt, not JSON" in err
    assert "set aside in traces.jsonl.unreadable" in err
    assert (run / "traces.jsonl.unreadable").read_bytes() == garbage + b"\n"
    assert len(lines(run / "traces.jsonl")) == 8 and json.loads((run / "summary.json").read_text())["reward"] == 1.0


def test_a_resume_while_another_process_writes_the_run_is_refused_naming_it(server, tmp_path, capsys):
    main(eval_args(server, tmp_path))
    run = only_run(tmp_path)
    before = (run / "traces.jsonl").read_bytes()
    writer = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from tracegym.config.run_dir import owned\n"
                               f"with owned(Path({str(run)!r})):\n    print('held', flush=True)\n    time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "held\n"
        capsys.readouterr()
        assert main(["eval", "--resume", str(run), "--model.base-url", server.base_url, "--no-rich"]) == 2
        assert f"is being written by another tracegym (pid {writer.pid})" in capsys.readouterr().err
    finally:
        writer.kill()
        writer.wait()
    assert (run / "traces.jsonl").read_bytes() == before
    assert main(["eval", "--resume", str(run), "--model.base-url", server.base_url, "--no-rich"]) == 0


def test_a_taskset_option_flag_reaches_the_resolved_config(capsys):
    assert main(["eval", "arithmetic", "-n", "5", "--taskset.difficulty", "hard", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert 'difficulty = "hard"' in out and "max_digits = 3" in out and "num_ops = 3" in out


SAME_ROWS = '''import tracegym as tg


def reversed_answer(task, trace):
    return trace.last_reply == task.data.answer


def make(config=None):
    return tg.Taskset(config, id="same", data=[{"prompt": "abc", "answer": "cba"}] * 4, rewards=[reversed_answer])
'''


def same_rows_args(server, tmp_path, *extra: str) -> list[str]:
    """Eval args of a taskset of four identical rows, two rollouts each."""
    path = tmp_path / "same_rows.py"
    path.write_text(SAME_ROWS)
    return ["eval", f"{path}:make", "-r", "2", "--model.base-url", server.base_url,
            "--output-dir", str(tmp_path / "out"), "--no-rich", *extra]


@pytest.mark.parametrize("where", [[], ["--no-serve"]], ids=["env-server", "in-process"])
def test_identical_rows_are_separate_tasks_in_the_traces_and_the_summary(server, tmp_path, where):
    assert main(same_rows_args(server, tmp_path, *where)) == 0
    run = only_run(tmp_path / "out")
    pairs = sorted((r["task_key"], r["rollout_index"]) for r in lines(run / "traces.jsonl"))
    assert pairs == [(key, i) for key in "0123" for i in range(2)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_tasks"] == 4 and summary["rollouts_per_task"] == 2


def test_resume_of_identical_rows_runs_exactly_the_missing_pairs(server, tmp_path, capsys):
    assert main(same_rows_args(server, tmp_path)) == 0
    run = only_run(tmp_path / "out")
    leave_rollouts(run, lines(run / "traces.jsonl")[:2])  # killed after two rollouts
    before = len(server.requests)
    capsys.readouterr()
    assert main(["eval", "--resume", str(run), "--no-rich"]) == 0
    assert "eval: 6 rollouts to run" in capsys.readouterr().out
    assert len(server.requests) - before == 6
    pairs = sorted((r["task_key"], r["rollout_index"]) for r in lines(run / "traces.jsonl"))
    assert pairs == [(key, i) for key in "0123" for i in range(2)]


def test_resume_of_a_run_keyed_by_content_hash_is_refused_and_leaves_the_folder_alone(server, tmp_path, capsys):
    assert main(same_rows_args(server, tmp_path)) == 0
    run = only_run(tmp_path / "out")
    old = []  # as tracegym wrote them before rows were keyed by position: no id, the key a hash of the row
    for record in lines(run / "traces.jsonl")[:2]:
        del record["task"]["id"]
        record["task_key"] = "816892289a832bf3"
        old.append(record)
    (run / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    (run / "episodes.jsonl").unlink()  # nor did that tracegym write episode records
    before = snapshot(run)
    assert main(["eval", "--resume", str(run), "--no-rich"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "2 episode(s) of task keys this taskset does not have ('816892289a832bf3')" in err
    assert snapshot(run) == before


def test_resume_refuses_a_stored_trace_whose_row_differs_from_the_tasksets(server, tmp_path, capsys):
    assert main(same_rows_args(server, tmp_path)) == 0
    run = only_run(tmp_path / "out")
    records = lines(run / "traces.jsonl")[:2]
    records[1]["task"]["prompt"] = "xyz"  # the dataset changed under the run
    leave_rollouts(run, records)
    assert main(["eval", "--resume", str(run), "--no-rich"]) == 2
    assert f"task {records[1]['task_key']!r} of the run is not the taskset's row" in capsys.readouterr().err
