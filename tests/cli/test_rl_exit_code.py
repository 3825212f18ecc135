"""`tracegym rl`'s exit code tells the truth: past `--max-error-rate` of failed rollouts over the run it exits 1
with a one-line cause, and its headline says "n of m scored" when not all were."""

from tracegym.cli.main import main
from tracegym.cli.rl import verdict
from tracegym.core.errors import ErrorKind
from tracegym.testing import make_trace
from tracegym.train.orchestrator import step_metrics
from tracegym.train.rl_folder import RLFolder


def run_folder(tmp_path, *steps: list[float | None]) -> RLFolder:
    """A run folder whose orchestrator logged one step record per entry (None: a rollout whose endpoint was down)."""
    folder = RLFolder(tmp_path)
    for step, rewards in enumerate(steps):
        traces = [make_trace(reward=r) if r is not None else make_trace(reward=None, error=ErrorKind.INFRASTRUCTURE)
                  for r in rewards]
        folder.metrics.append({"step": step, **step_metrics([traces], [], 1.0)})
    return folder


def test_a_run_with_more_failed_rollouts_than_max_error_rate_exits_1_saying_so_in_one_line(tmp_path, capsys):
    assert verdict(0, run_folder(tmp_path, [1.0, None, None], [None, 0.0, None]), 0.5) == 1
    err = capsys.readouterr().err
    assert err == "tracegym rl: 4 of 6 rollouts failed (67%), more than --max-error-rate 0.5 allows\n"


def test_a_run_within_max_error_rate_exits_0_with_n_of_m_scored_in_its_headline(tmp_path, capsys):
    assert verdict(0, run_folder(tmp_path, [1.0, None, 1.0], [0.0, 1.0, 1.0]), 0.5) == 0
    out = capsys.readouterr().out
    assert out == "rl: 2 steps, 5 of 6 rollouts scored (1 failed: model_unavailable 1); reward 0.800\n"


def test_a_run_whose_rollouts_all_scored_says_so(tmp_path, capsys):
    assert verdict(0, run_folder(tmp_path, [1.0, 0.0]), 0.0) == 0
    assert capsys.readouterr().out == "rl: 1 step, 2 rollouts, all scored; reward 0.500\n"


def test_a_run_that_already_failed_keeps_its_exit_code(tmp_path, capsys):
    assert verdict(1, run_folder(tmp_path, [1.0, None, None]), 0.5) == 1
    assert verdict(1, run_folder(tmp_path / "empty"), 0.5) == 1
    assert capsys.readouterr().out.count("rl: ") == 1  # a run with no step record has no headline


def test_max_error_rate_is_a_flag_of_the_rl_command(tmp_path, capsys):
    assert main(["rl", "--max-error-rate", "0.2", "--dry-run", "--output-dir", str(tmp_path)]) == 0
    assert "max_error_rate = 0.2" in capsys.readouterr().out


def test_a_max_error_rate_above_1_exits_2_naming_the_flag(capsys):
    assert main(["rl", "--max-error-rate", "1.5", "--dry-run"]) == 2
    assert "--max-error-rate" in capsys.readouterr().err
