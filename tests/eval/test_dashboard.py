"""The live dashboard: the rich panel's figures, completions and ETA; plain status lines without repeats."""

import io

from rich.console import Console

from tracegym.core.errors import ErrorKind
from tracegym.eval.dashboard import PlainDashboard, RichDashboard, Tally
from tracegym.testing.traces import make_trace


class FakeClock:
    """Seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def traces():
    return [make_trace(reply="olleh", reward=1.0, rollout_index=0),
            make_trace(reply="dlrow", reward=0.5, rollout_index=1),
            make_trace(reply="", reward=None, rollout_index=2, error=ErrorKind.MODEL)]


def rich_text(total: int, finished: list, clock: FakeClock) -> str:
    """The rich dashboard's final render after `finished` traces land one second apart."""
    tally = Tally(total=total, clock=clock)
    console = Console(record=True, width=200, file=io.StringIO())
    with RichDashboard(tally, "a title", console) as board:
        for trace in finished:
            clock.now += 1.0
            tally.add(trace)
            board.update(trace)
    return console.export_text()


def test_the_rich_dashboard_shows_mean_reward_errors_and_the_latest_completions():
    text = rich_text(6, traces(), FakeClock())
    assert "mean reward 0.750" in text and "errors 1 (model=1)" in text
    assert "olleh" in text and "dlrow" in text and "3/6" in text


def test_the_rich_dashboard_estimates_the_time_left_from_the_rate_so_far():
    text = rich_text(6, traces(), FakeClock())  # 3 done in 3 s at 1/s: 3 s to go
    assert "ETA 0:00:03" in text


def test_plain_lines_give_a_status_every_n_traces_and_each_error():
    out = io.StringIO()
    tally = Tally(total=3, clock=FakeClock())
    with PlainDashboard(tally, out, every=2) as board:
        for trace in traces():
            tally.add(trace)
            board.update(trace)
    lines = out.getvalue().splitlines()
    assert lines[0] == "eval: 3 rollouts to run"
    assert lines[1].startswith("eval: 2/3 rollouts  reward 0.750  errors none")
    assert "model error in model: scripted model error" in lines[2]
    assert lines[3].startswith("eval: 3/3 rollouts  reward 0.750  errors model=1") and len(lines) == 4


def test_the_final_status_line_is_not_repeated_when_the_last_trace_printed_it():
    out = io.StringIO()
    tally = Tally(total=2, clock=FakeClock())
    with PlainDashboard(tally, out, every=2) as board:
        for trace in traces()[:2]:
            tally.add(trace)
            board.update(trace)
    assert len([line for line in out.getvalue().splitlines() if line.startswith("eval: 2/2 rollouts")]) == 1
