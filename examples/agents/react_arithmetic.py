"""An agent taskset: the arithmetic taskset's expressions, each solved by the shipped ReAct agent
(`react_agent.py`, an `openai` SDK program) run in the subprocess runtime; its model calls reach the model through
tracegym's interception proxy, so the trace holds every call's exact tokens.

    tracegym eval examples/agents/react_arithmetic.py:ReactArithmetic -n 4 -r 2

The reward reads the answer the agent wrote to `answer.txt` in its working directory; a metric says whether it
used its `calculate` tool. The sandbox runs programs under a uid of its own with the system's PATH and sees none of
the project or its virtualenv, so the agent is installed in each rollout's working directory and runs on the
system's `python3`, given the folder the `openai` package is installed in, bound read-only (`Limits.read_only`;
tracegym stays hidden in it), on its PYTHONPATH. That folder holds compiled modules
(pydantic-core), which load only in an interpreter of the same ABI: when the system's `python3` is another
version, importing this module says so, with what to do, instead of the agent failing in every rollout.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import tracegym as tg
from tracegym.core.errors import UsageError
from tracegym.envs.harness import ProgramHarness
from tracegym.runtimes.process_sandbox import sandbox_python
from tracegym.runtimes.sandbox import Limits
from tracegym.tasksets.arithmetic import Arithmetic, ArithmeticConfig, ExpressionData, last_integer

AGENT = Path(__file__).with_name("react_agent.py")
OPENAI_SPEC = importlib.util.find_spec("openai")
OPENAI_HOME = str(Path(OPENAI_SPEC.origin).parents[1]) if OPENAI_SPEC and OPENAI_SPEC.origin else ""
"""The folder holding the `openai` package, for the agent's PYTHONPATH."""


def _same_abi() -> None:
    """A UsageError unless the sandbox's python3 loads the compiled modules of ours (the same ABI tag)."""
    python = sandbox_python()
    theirs = subprocess.run([python, "-I", "-c", "import sys; print(sys.implementation.cache_tag)"],
                            capture_output=True, text=True, timeout=30).stdout.strip()
    if theirs != sys.implementation.cache_tag:
        raise UsageError(f"react-arithmetic runs its agent on the sandbox's {python} ({theirs or 'unknown'}), which "
                         f"cannot load the openai package installed for this {sys.implementation.cache_tag} "
                         f"interpreter ({OPENAI_HOME}); install openai for {python}, or run from a virtualenv of "
                         f"the same Python version")


_same_abi()


class ReactArithmeticTask(tg.Task[ExpressionData, ArithmeticConfig]):
    """One expression, solved by the ReAct agent."""

    max_turns = 8
    harness = ProgramHarness(["python3", AGENT.name, "--stream", "--max-steps", "6"],
                             env={"PYTHONPATH": OPENAI_HOME}, files=lambda task: {AGENT.name: AGENT.read_text()},
                             limits=Limits(wall_seconds=300, memory_mb=4096, read_only=(OPENAI_HOME,)))

    @tg.reward
    def exact(self, trace: tg.Trace) -> float:
        answer = self.program.file("answer.txt") if self.program else None
        return float(last_integer(answer or "") == self.data.answer)

    @tg.metric
    def used_calculator(self, trace: tg.Trace) -> float:
        return float(any(c.name == "calculate" for m in trace.messages for c in m.tool_calls))


class ReactArithmetic(Arithmetic):
    """Arithmetic by a ReAct agent program; reward: the exact integer in its answer file."""

    id = "react-arithmetic"
    description = "Integer expressions solved by an openai-SDK ReAct agent run through the proxy (reward: exact)."
    task_class = ReactArithmeticTask
