"""`tracegym rl --dry-run`: the resolved config of every process; old keys migrate with a warning."""

from pathlib import Path

from tracegym.cli.main import main

CONFIG = Path(__file__).parents[2] / "configs" / "rl" / "reverse_text.toml"


def test_dry_run_prints_every_process_config_and_starts_nothing(tmp_path, capsys):
    assert main(["rl", "@", str(CONFIG), "--dry-run", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[run.orchestrator]" in out and "[vllm]" in out and "[env_servers" in out
    assert not list(tmp_path.iterdir())


def test_an_old_key_still_works_with_a_warning_naming_the_new_one(tmp_path, capsys):
    old = tmp_path / "old.toml"
    old.write_text("steps = 3\n[sampling]\nmax_tokens = 20\n")
    assert main(["rl", "@", str(old), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "max_completion_tokens = 20" in captured.out
    assert "'orchestrator.train.sampling.max_completion_tokens'" in captured.err


def test_an_unknown_key_exits_2_naming_it(capsys):
    assert main(["rl", "--orchestrator.group-sze", "4", "--dry-run"]) == 2
    assert "--orchestrator.group-sze" in capsys.readouterr().err
