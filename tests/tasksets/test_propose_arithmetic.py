"""Propose-arithmetic, the proposer-solver pattern's worked example: the verifier (valid, invalid, unsafe
expressions refused), the learnability reward, solvers skipped for an invalid proposal, and the held-out rows,
over scripted models."""

import itertools
import re

import pytest

from tracegym.envs.evaluate import run_episode
from tracegym.envs.proposer_solver import PROPOSER, InvalidProposal, learnability
from tracegym.envs.registry import load_taskset
from tracegym.tasksets.propose_arithmetic import (
    EXAMPLE,
    PROPOSER_SYSTEM,
    ProposerPrompt,
    evaluate,
    numbers_in,
    read_proposal,
)
from tracegym.testing import ScriptedModel

SOLVERS = [f"solver_{i}" for i in range(4)]


def players(proposal: str, solver_replies: list[str]) -> ScriptedModel:
    """The proposer replies `proposal`; the solvers' replies are taken from `solver_replies` in turn."""
    replies = itertools.cycle(solver_replies)
    return ScriptedModel(rule=lambda r: proposal if r.messages[0].text == PROPOSER_SYSTEM else next(replies))


def asking_for(proposal: str) -> ProposerPrompt:
    """A proposer row that asks for exactly the numbers `proposal` uses (any row where it cannot be read)."""
    try:
        used = numbers_in(proposal.partition("=")[0]) or [1]
    except SyntaxError:
        used = [1]
    return ProposerPrompt(id="asked", prompt="Write one problem.", numbers=len(used), largest=50, include=used[0])


async def episode(proposal: str, solver_replies: list[str], row: ProposerPrompt | None = None):
    taskset = load_taskset("propose-arithmetic", {"num_tasks": 3})
    return await run_episode(taskset, row or asking_for(proposal), players(proposal, solver_replies))


def model_calls(ep, member: str) -> int:
    return sum(node.message.role == "assistant" for node in ep.traces[member].graph.nodes)


def test_a_valid_proposal_is_its_expression_and_the_value_code_computed():
    proposal = read_proposal("Sure!\nProblem: (12 + 7) * 3 = 57 apples\n4 + 4 = 8")
    assert (proposal.problem, proposal.answer) == ("(12 + 7) * 3", 57)


@pytest.mark.parametrize(("reply", "reason"), [
    ("The answer is 7", "format"),                      # no '<problem> = <value>' line
    ("3 + 4 = seven", "format"),                        # no integer value
    ("3 + 4 = 8", "wrong_answer"),                      # the stated value is not the value
    ("12 = 12", "refused"),                             # no operator: not a problem
])
def test_an_invalid_proposal_is_refused_with_its_reason(reply, reason):
    with pytest.raises(InvalidProposal) as refused:
        read_proposal(reply)
    assert refused.value.refusal.reason == reason


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')",   # a call: refused on its characters, never run
    "2 ** 99999",                        # a power (a huge number): refused as an operator
    "7 / 2",                             # division
    "().__class__",                      # attribute access
    "1000000 + 1",                       # a number over the limit
    "1 + 2 + 3 + 4 + 5 + 6",             # too many operators
    "(" * 30 + "1" + ")" * 30,           # nesting past the length limit
])
def test_the_verifier_refuses_unsafe_or_oversized_expressions(expression):
    with pytest.raises(InvalidProposal) as refused:
        evaluate(expression)
    assert refused.value.refusal.reason == "refused" and refused.value.refusal.message


def test_the_verifier_computes_precedence_parentheses_and_unary_minus():
    assert [evaluate(e) for e in ("2 + 3 * 4", "(2 + 3) * 4", "-5 - -2", "10 - 4 - 3")] == [14, 20, -3, 3]


def test_learnability_peaks_at_half_and_is_zero_at_none_or_all():
    assert [learnability(p) for p in (0.0, 0.25, 0.5, 0.75, 1.0)] == [0.0, 0.75, 1.0, 0.75, 0.0]


async def test_the_proposer_is_paid_the_learnability_of_its_solvers_pass_rate():
    ep = await episode("2 + 3 * 4 = 14", ["14", "it is 14", "15", "no idea"])
    assert ep.error is None and ep.ok
    assert sorted(ep.rewards[s] for s in SOLVERS) == [0.0, 0.0, 1.0, 1.0]
    assert ep.rewards[PROPOSER] == 1.0 and ep.member_metrics[PROPOSER]["pass_rate"] == 0.5
    assert ep.member_metrics[PROPOSER]["valid"] == 1.0


async def test_a_proposal_every_solver_passes_earns_the_proposer_nothing():
    ep = await episode("3 + 5 = 8", ["8"])
    assert ep.rewards == {PROPOSER: 0.0, **dict.fromkeys(SOLVERS, 1.0)}


async def test_solvers_see_the_problem_but_never_the_proposers_answer():
    ep = await episode("6 * 7 = 42", ["42"])
    seen = [m.text for m in ep.traces["solver_0"].messages if m.role != "assistant"]
    assert seen[-1] == "What is 6 * 7?" and not any("42" in text for text in seen)


async def test_an_invalid_proposal_gets_its_own_reward_and_its_solvers_are_skipped():
    ep = await episode("__import__('os') = 0", ["0"])
    assert ep.error is None and ep.ok
    assert ep.rewards[PROPOSER] == -1.0
    assert ep.member_metrics[PROPOSER]["valid"] == 0.0 and ep.member_metrics[PROPOSER]["invalid_refused"] == 1.0
    assert all(model_calls(ep, s) == 0 and ep.member_metrics[s]["attempted"] == 0.0 for s in SOLVERS)
    assert ep.metrics["slots"] == 1


@pytest.mark.parametrize(("problem", "why"), [
    ("3 + 4", "3 + 4 has 2 numbers, not 3"),
    ("3 + 4 * 60", "uses 60, outside 1 to 50"),
    ("3 + 5 * 6", "does not use 32"),
])
def test_a_right_problem_that_is_not_the_one_asked_for_is_off_prompt(problem, why):
    row = ProposerPrompt(id="r", prompt="p", numbers=3, largest=50, include=32)
    with pytest.raises(InvalidProposal, match=re.escape(why)) as refused:
        read_proposal(f"{problem} = {evaluate(problem)}", row)
    assert refused.value.refusal.reason == "off_prompt"


async def test_an_off_prompt_proposal_gets_the_invalid_reward_and_its_own_metric():
    ep = await episode("3 + 4 = 7", ["7"], row=ProposerPrompt(id="r", prompt="p", numbers=2, largest=50, include=32))
    assert ep.rewards[PROPOSER] == -1.0 and ep.member_metrics[PROPOSER]["invalid_off_prompt"] == 1.0
    assert all(model_calls(ep, s) == 0 for s in SOLVERS)


async def test_a_held_out_rows_solvers_attempt_its_fixed_problem_whatever_was_proposed():
    taskset = load_taskset("propose-arithmetic", {"split": "heldout", "num_tasks": 3})
    row = next(iter(taskset))
    ep = await run_episode(taskset, row, players("nonsense", [str(row.answer)]))
    assert ep.traces["solver_0"].messages[-2].text == f"What is {row.problem}?"
    assert all(ep.rewards[s] == 1.0 for s in SOLVERS)
    assert ep.rewards[PROPOSER] == -1.0 and ep.member_metrics[PROPOSER]["invalid_format"] == 1.0


def test_held_out_problems_are_fixed_distinct_and_never_in_a_proposer_prompt():
    heldout = list(load_taskset("propose-arithmetic", {"split": "heldout", "num_tasks": 64}))
    again = list(load_taskset("propose-arithmetic", {"split": "heldout", "num_tasks": 64}))
    prompts = [PROPOSER_SYSTEM, *(r.prompt for r in load_taskset("propose-arithmetic", {"num_tasks": 500})),
               *(r.prompt for r in heldout)]
    problems = [r.problem for r in heldout]
    assert heldout == again and len(set(problems)) == 64 and EXAMPLE not in problems
    assert all(evaluate(r.problem) == r.answer for r in heldout)
    assert not any(p in prompt for p in problems for prompt in prompts)
