"""The proposer-solver base task as a user writes it: the README's example subclass plays, its verifier judges,
and an invalid proposal skips the solvers."""

import re
from pathlib import Path

import tracegym as tg
from tracegym.envs.proposer_solver import PROPOSER
from tracegym.testing import ScriptedModel

README = Path(__file__).parents[2] / "README.md"


def readme_example() -> dict:
    section = README.read_text().split("### Proposer-solver", 1)[1]
    namespace: dict = {}
    exec(re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1), namespace)  # the README's own code
    return namespace


def players(proposal: str, answer: str) -> ScriptedModel:
    return ScriptedModel(rule=lambda r: proposal if r.messages[0].text.startswith("Reply 'WORD") else answer)


async def test_the_readme_subclass_pays_its_proposer_and_solvers():
    reversals = readme_example()["reversals"]
    episode = await tg.run_episode(reversals, reversals[0], players("WORD: planet\nANSWER: tenalp", "tenalp"))
    assert episode.ok and episode.rewards == {PROPOSER: 0.0, "solver_0": 1.0, "solver_1": 1.0}


async def test_the_readme_subclass_refuses_a_wrong_answer_and_skips_its_solvers():
    reversals = readme_example()["reversals"]
    episode = await tg.run_episode(reversals, reversals[0], players("WORD: planet\nANSWER: planet", "tenalp"))
    assert episode.rewards == {PROPOSER: -1.0, "solver_0": 0.0, "solver_1": 0.0}
    assert episode.member_metrics[PROPOSER]["invalid_answer"] == 1.0 and episode.metrics["slots"] == 1
