"""Eval's cut policy (`--cuts`): an overlong, a length-truncated and an unparsable rollout are counted apart in the
summary, and each counts in the mean reward with its own rule (kept by default, a number, or masked out)."""

from tracegym.cli.main import main
from tracegym.core.cut_policy import CutPolicy
from tracegym.core.errors import ContextLengthError, classify
from tracegym.core.messages import assistant
from tracegym.core.trace import Cut, StopReason, Trace
from tracegym.eval.summary import summarize, summary_lines
from tracegym.testing import make_trace, tool_call


def cut(reward: float, kind: Cut) -> Trace:
    """A scored rollout cut as `kind` says."""
    trace = make_trace(reward=reward)
    if kind in (Cut.LENGTH, Cut.OVERLONG):
        trace.stop_reason = StopReason.TRUNCATED
    if kind == Cut.OVERLONG:
        trace.errors.append(classify(ContextLengthError("prompt of 70412 tokens"), "model"))
    if kind == Cut.UNPARSABLE:
        trace.graph.add(assistant(None, [tool_call("add", "{oops")]), sampled=True)
    assert trace.cut == kind
    return trace


TRACES = [make_trace(reward=1.0), make_trace(reward=0.0), cut(1.0, Cut.LENGTH), cut(1.0, Cut.OVERLONG),
          cut(1.0, Cut.UNPARSABLE)]


def test_the_summary_counts_each_kind_of_cut_apart():
    summary = summarize(TRACES)
    assert summary.cuts == {"length": 1, "overlong": 1, "unparsable": 1}
    assert (summary.reward, summary.num_scored, summary.masked) == (0.8, 5, 0)


def test_each_kind_of_cut_counts_with_its_own_reward():
    summary = summarize(TRACES, cuts=CutPolicy(length=0.0, overlong=-1.0, unparsable=0.5))
    assert summary.reward == (1.0 + 0.0 + 0.0 - 1.0 + 0.5) / 5
    assert summary.pass_at_k[1] == 1 / 5


def test_a_masked_cut_is_left_out_of_every_mean_and_counted():
    summary = summarize(TRACES, cuts=CutPolicy(overlong="mask", length="mask"))
    assert (summary.reward, summary.num_scored, summary.masked, summary.num_traces) == (2 / 3, 3, 2, 5)
    assert "cut: length 1, overlong 1, unparsable 1 (2 masked)" in summary_lines(summary)
    assert "3 of 5 scored" in next(line for line in summary_lines(summary) if line.startswith("reward:"))


def test_the_traces_keep_their_scores_whatever_the_policy():
    summarize(TRACES, cuts=CutPolicy(length="mask"))
    assert [t.reward for t in TRACES] == [1.0, 0.0, 1.0, 1.0, 1.0]


def test_cuts_are_set_from_the_eval_command_line(capsys):
    assert main(["eval", "arithmetic", "-n", "2", "--cuts.length", "0", "--cuts.unparsable", "mask", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[cuts]" in out and "length = 0.0" in out and 'unparsable = "mask"' in out


def test_a_cut_rule_that_is_neither_keep_mask_nor_a_number_exits_2_naming_the_flag(capsys):
    assert main(["eval", "arithmetic", "--cuts.overlong", "drop", "--dry-run"]) == 2
    assert "--cuts.overlong" in capsys.readouterr().err
