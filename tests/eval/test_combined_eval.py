"""`tracegym eval A B C` and `[[eval.env]]`: one run folder per taskset inside a combined one, the combined summary,
`--resume` of the combined run, and bad input refused before anything is written."""

import json
import tomllib
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.eval import combined_run
from tracegym.testing import FakeOpenAIServer
from tracegym.testing.script import Fail


def reverse_or_refuse(request):
    """Reverse-text's prompts reversed; any prompt that asks to sort refused (a model error on that rollout)."""
    text = request.messages[-1].text
    return Fail(status=400, message="refused") if "sort" in text.lower() else text[::-1]


@pytest.fixture
def server():
    with FakeOpenAIServer(rule=reverse_or_refuse) as fake:
        yield fake


def eval_args(server, out: Path, *extra: str) -> list[str]:
    return ["eval", *extra, "--model.base-url", server.base_url, "--output-dir", str(out), "--no-rich"]


def combined_run_folder(out: Path) -> Path:
    [run] = list(out.glob("*/*"))
    return run


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_several_tasksets_get_a_run_folder_each_inside_one_combined_run_with_one_summary(server, tmp_path):
    assert main(eval_args(server, tmp_path, "reverse-text", "arithmetic", "-n", "3", "-r", "2")) == 0
    run = combined_run_folder(tmp_path)
    assert run.parent.name == "reverse-text_arithmetic--fake-model"
    for name in ("reverse-text", "arithmetic"):
        assert len(lines(run / name / "traces.jsonl")) == 6
        assert summary(run / name)["num_traces"] == 6 and (run / name / "config.toml").is_file()
    combined = summary(run)
    assert [(t["name"], t["total"], t["failed"]) for t in combined["tasksets"]] == [
        ("reverse-text", 6, 0), ("arithmetic", 6, 0)]
    assert combined["tasksets"][0]["reward"] == 1.0 and combined["total"] == 12 and combined["not_run"] == []
    assert combined["reward"] == pytest.approx((1.0 + combined["tasksets"][1]["reward"]) / 2)


def test_the_combined_table_names_every_taskset_and_the_run_folder(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path, "reverse-text", "arithmetic", "-n", "2", "--no-serve")) == 0
    out = capsys.readouterr().out
    assert "all (mean of tasksets)" in out and f"combined run folder: {combined_run_folder(tmp_path)}" in out
    assert "0/2 rollouts" in out


def test_eval_env_entries_take_their_own_options_and_counts_in_prime_rl_spelling(server, tmp_path):
    config = tmp_path / "evals.toml"
    config.write_text('num_tasks = 3\n\n[[eval.env]]\nid = "reverse-text"\nargs = { max_words = 2 }\n'
                      'num_examples = 2\nrollouts_per_example = 2\n\n[[eval.env]]\nid = "arithmetic"\n'
                      'name = "sums"\n')
    assert main(eval_args(server, tmp_path / "out", "@", str(config), "--no-serve")) == 0
    run = combined_run_folder(tmp_path / "out")
    reversed_rows = lines(run / "reverse-text" / "traces.jsonl")
    assert len(reversed_rows) == 4 and len(lines(run / "sums" / "traces.jsonl")) == 3
    assert "max_words = 2" in (run / "reverse-text" / "config.toml").read_text()


def test_resume_of_the_combined_run_finishes_each_taskset_and_starts_those_not_begun(server, tmp_path):
    assert main(eval_args(server, tmp_path, "reverse-text", "arithmetic", "-n", "3", "--no-serve")) == 0
    run = combined_run_folder(tmp_path)
    first = run / "reverse-text"
    for name in ("traces.jsonl", "episodes.jsonl"):  # killed after one rollout of the first taskset
        (first / name).write_text((first / name).read_text().splitlines(keepends=True)[0])
    for path in sorted((run / "arithmetic").rglob("*"), reverse=True):  # and before the second began
        path.rmdir() if path.is_dir() else path.unlink()
    (run / "arithmetic").rmdir()
    assert main(["eval", "--resume", str(run), "--model.base-url", server.base_url]) == 0
    assert len(lines(first / "traces.jsonl")) == 3 and len(lines(run / "arithmetic" / "traces.jsonl")) == 3
    assert [t["total"] for t in summary(run)["tasksets"]] == [3, 3]


def test_a_resumed_combined_run_keeps_its_tasksets_and_counts(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path, "reverse-text", "arithmetic", "-n", "2", "--no-serve")) == 0
    run = combined_run_folder(tmp_path)
    assert main(["eval", "--resume", str(run), "-n", "3"]) == 2
    assert "num_tasks = 2, not 3" in capsys.readouterr().err


def test_one_taskset_of_the_run_can_be_resumed_alone(server, tmp_path):
    assert main(eval_args(server, tmp_path, "reverse-text", "arithmetic", "-n", "2", "--no-serve")) == 0
    assert main(["eval", "--resume", str(combined_run_folder(tmp_path) / "arithmetic")]) == 0


def test_a_taskset_that_fails_past_the_error_rate_exits_1_naming_it(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path, "reverse-text", "alphabet-sort", "-n", "2", "--no-serve")) == 1
    err = capsys.readouterr().err
    assert "tracegym eval: alphabet-sort: 2 of 2 rollouts failed" in err and "reverse-text" not in err
    assert [t["failed"] for t in summary(combined_run_folder(tmp_path))["tasksets"]] == [0, 2]


def test_dry_run_prints_the_entries_and_writes_nothing(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path, "reverse-text", "arithmetic", "--dry-run")) == 0
    assert '{ id = "arithmetic"' in capsys.readouterr().out and not tmp_path.joinpath("out").exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("extra", "said"), [
    (["reverse-text", "wordel"], "eval.env.1 (wordel): unknown taskset 'wordel'"),
    (["reverse-text", "reverse-text"], "two entries would share the run folder 'reverse-text'"),
    (["reverse-text", "arithmetic", "--taskset.max-words", "3"], "give each its options in its [[eval.env]] entry"),
])
def test_bad_tasksets_are_one_line_exit_2_and_nothing_written(server, tmp_path, capsys, extra, said):
    assert main(eval_args(server, tmp_path / "out", *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_bad_option_of_one_entry_names_the_entry_and_writes_nothing(server, tmp_path, capsys):
    config = tmp_path / "evals.toml"
    config.write_text('[[eval.env]]\nid = "reverse-text"\n\n[[eval.env]]\nid = "arithmetic"\noptions = { '
                      'max_wrods = 2 }\n')
    assert main(eval_args(server, tmp_path / "out", "@", str(config))) == 2
    assert "eval.env.1 (arithmetic): field 'taskset.max_wrods'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_ctrl_c_keeps_the_tasksets_run_so_far_names_the_rest_and_says_how_to_resume(server, tmp_path, capsys,
                                                                                   monkeypatch):
    real, asked = combined_run.execute, []

    def interrupted_at_the_second(parts, folder, work, **options):
        asked.append(parts.name)
        if len(asked) == 2:
            raise KeyboardInterrupt
        return real(parts, folder, work, **options)

    monkeypatch.setattr(combined_run, "execute", interrupted_at_the_second)
    assert main(eval_args(server, tmp_path, "reverse-text", "arithmetic", "-n", "2", "--no-serve")) == 130
    run = combined_run_folder(tmp_path)
    assert [t["name"] for t in summary(run)["tasksets"]] == ["reverse-text"]
    assert summary(run)["not_run"] == ["arithmetic"]
    assert f"tracegym eval --resume {run}" in capsys.readouterr().out
    monkeypatch.setattr(combined_run, "execute", real)
    assert main(["eval", "--resume", str(run)]) == 0
    assert [t["total"] for t in summary(run)["tasksets"]] == [2, 2] and summary(run)["not_run"] == []


def test_show_of_a_combined_run_prints_its_table_and_rescore_names_the_member_folders(server, tmp_path, capsys):
    assert main(eval_args(server, tmp_path, "reverse-text", "arithmetic", "-n", "2", "--no-serve")) == 0
    run = combined_run_folder(tmp_path)
    capsys.readouterr()
    assert main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert "reverse-text" in out and "arithmetic" in out and "all (mean of tasksets)" in out
    assert main(["rescore", str(run)]) == 2
    assert f"rescore each one's run folder: tracegym rescore {run}/<taskset>" in capsys.readouterr().err


def test_an_entry_gives_its_own_env_server_options_over_the_runs(server, tmp_path):
    config = tmp_path / "evals.toml"
    config.write_text('[env]\nworkers = 1\n\n[[eval.env]]\nid = "reverse-text"\nenv = { runtime = "process-group" }\n'
                      '\n[[eval.env]]\nid = "arithmetic"\n')
    assert main(eval_args(server, tmp_path / "out", "@", str(config), "-n", "1", "--dry-run")) == 0
    assert main(eval_args(server, tmp_path / "out", "@", str(config), "-n", "1")) == 0
    run = combined_run_folder(tmp_path / "out")
    first, second = (tomllib.loads((run / name / "config.toml").read_text())["env"]
                     for name in ("reverse-text", "arithmetic"))
    assert (first["runtime"], first["workers"]) == ("process-group", 1)
    assert "runtime" not in second and second["workers"] == 1


def test_a_bad_env_option_of_one_entry_names_the_entry_and_writes_nothing(server, tmp_path, capsys):
    config = tmp_path / "evals.toml"
    config.write_text('[[eval.env]]\nid = "reverse-text"\n\n[[eval.env]]\nid = "arithmetic"\nenv = { runtime = '
                      '"gvisor" }\n')
    assert main(eval_args(server, tmp_path / "out", "@", str(config))) == 2
    assert "eval.env.1 (arithmetic): field 'env.runtime': Value error, unknown runtime 'gvisor'" in \
        capsys.readouterr().err
    assert not (tmp_path / "out").exists()
