"""`tracegym eval` under the watchdog: a stage silent past its soft budget is named in the log, past its hard
budget the run stops (exit 5, one line naming the stage), keeping what finished and leaving no process behind."""

import io
import os
import time

import pytest
from rich.console import Console

from tracegym.cli.main import main
from tracegym.eval.dashboard import RichDashboard, Tally
from tracegym.runtimes.processes import descendants
from tracegym.runtimes.watchdog import STALLED_EXIT
from tracegym.testing import FakeOpenAIServer, Stall

TINY = ["--watchdog.warn-after", "0.2", "--timeouts.model", "600", "--timeouts.rollout", "900"]
"""Budgets far below the rollout's own timeouts: only the watchdog can end these runs."""


@pytest.fixture
def hung():
    """A model endpoint that accepts every chat request and never replies."""
    with FakeOpenAIServer(rule=lambda request: Stall(None)) as fake:
        yield fake


def stuck_eval(server, tmp_path, *extra: str) -> list[str]:
    return ["eval", "reverse-text", "-n", "2", "--model.base-url", server.base_url, "--output-dir", str(tmp_path),
            "--run-id", "r", "--no-rich", *TINY, *extra]


def test_a_stuck_model_endpoint_stops_the_eval_naming_the_model_call(hung, tmp_path, capsys):
    code = main(stuck_eval(hung, tmp_path, "--no-serve", "--watchdog.model-call", "0.5"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == STALLED_EXIT
    assert len(err) == 1 and err[0].startswith("tracegym eval: stopped: no progress in model call")
    assert "(hard budget 0.5 s)" in err[0]
    log = (tmp_path / "reverse-text--fake-model" / "r" / "logs" / "eval.log").read_text()
    assert "eval: watchdog: no progress in model call" in log  # the soft budget's warning came first


def test_a_stuck_env_server_stops_the_eval_naming_it_and_leaves_no_process(hung, tmp_path, capsys):
    before = descendants(os.getpid())
    code = main(stuck_eval(hung, tmp_path, "--watchdog.env-server", "1"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == STALLED_EXIT
    assert len(err) == 1 and "stopped: no progress in env server (2 episodes asked) for" in err[0]
    assert descendants(os.getpid()) <= before  # the env server and its workers are stopped


def test_a_stalled_eval_writes_its_summary_and_says_how_to_resume(hung, tmp_path, capsys):
    main(stuck_eval(hung, tmp_path, "--no-serve", "--watchdog.model-call", "0.5"))
    out = capsys.readouterr().out
    run = tmp_path / "reverse-text--fake-model" / "r"
    assert (run / "summary.json").is_file()
    assert f"finish the run with: tracegym eval --resume {run}" in out


def test_a_watchdog_turned_off_only_warns(tmp_path, capsys):
    log = tmp_path / "reverse-text--fake-model" / "r" / "logs" / "eval.log"

    def after_the_warning(request):
        """Reply once the eval log names the silent model call (past every budget by then)."""
        deadline = time.monotonic() + 60
        while "eval: watchdog: no progress in model call" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "no watchdog warning in the log"
            time.sleep(0.05)
        return request.messages[-1].text[::-1]

    with FakeOpenAIServer(rule=after_the_warning) as slow:
        code = main(stuck_eval(slow, tmp_path, "--no-serve", "--watchdog.model-call", "0.2",
                               "--no-watchdog.enabled"))
    assert code == 0


def test_the_rich_dashboard_shows_the_watchdogs_warning():
    out = io.StringIO()
    board = RichDashboard(Tally(total=2), "run", Console(file=out, width=120, force_terminal=False))
    with board:
        board.warn("no progress in model call for 121 s: last event none")
    assert "watchdog: no progress in model call for 121 s: last event none" in out.getvalue()


def test_a_budget_that_is_not_positive_exits_2_naming_its_flag(tmp_path, capsys):
    assert main(["eval", "reverse-text", "--watchdog.model-call", "-5", "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("tracegym eval: --watchdog.model-call: Input should be greater than 0")
    assert not any(tmp_path.iterdir())
