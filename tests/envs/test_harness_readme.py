"""The README's "Agents as programs" example defines a working task: its harness, with the command swapped for a
real program, runs a rollout whose reward reads the program's exit status and answer file."""

import dataclasses
import re
from pathlib import Path

import pytest

from tracegym.core.task_data import TaskData
from tracegym.envs.harness import ProgramHarness
from tracegym.envs.rollout import rollout
from tracegym.runtimes.catalog import runtime_for
from tracegym.testing import ScriptedModel

README = Path(__file__).parents[2] / "README.md"
AGENT = """
import json, os, urllib.request
body = json.dumps({"messages": [{"role": "user", "content": open("input.txt").read()}]}).encode()
call = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body)
answer = json.load(urllib.request.urlopen(call))["choices"][0]["message"]["content"]
open("answer.txt", "w").write(answer if os.environ["AGENT_MODEL"] == "scripted" else "?")
"""


def example() -> dict:
    section = README.read_text().split("## Agents as programs", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    return scope


@pytest.mark.skipif(runtime_for("bubblewrap").unavailable() is not None, reason="the example runs in bubblewrap")
async def test_the_readme_agent_example_runs_with_a_real_program_in_place_of_my_agent():
    solve = example()["Solve"]
    assert isinstance(solve.harness, ProgramHarness) and solve.harness.command[0] == "my-agent"
    task = solve(TaskData(prompt="what is 6*7?", answer="42"))
    task.harness = dataclasses.replace(solve.harness, command=["python3", "-c", AGENT.replace("{", "{{").replace(
        "}", "}}")])
    trace = await rollout(task, ScriptedModel(["42"], tokens=True))
    assert not trace.errors and trace.reward == 1.0, trace.errors
    assert task.program.setup.ok and trace.num_turns == 1
