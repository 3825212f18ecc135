"""Python functions: write a generated Python function; its code runs in a sandbox against hidden unit tests.

Each task names a function, its signature, what it returns and one example call (see `function_problems`). The
model answers with the function in a fenced python block (the last one counts; a bare ``` block too). The code
runs in the rollout's sandbox (`runtime`, bubblewrap by default, under `wall_seconds`, `cpu_seconds`,
`memory_mb` and `processes`): the host writes it as solution.py with a checker that calls the function on each
hidden test's arguments and prints each result; the host compares them with the expected values, which never
enter the sandbox. Reward `passed`: the fraction of hidden tests passed. Metric `solved`: 1.0 when all passed.

With `attempts` above 1 the task is multi-turn: after a reply that fails a test, the environment answers with
the first failing test's call and what it returned, raised or broke (and the end of stderr), and the model tries
again; the last reply is scored. A program that breaks a sandbox limit, dies by a signal or leaves processes
running is the model's error (kind `model`, at the stage where it ran: `env_response`, or `scoring:passed` when
rescored): the rollout is still scored and trained on. A sandbox that cannot start python3 is an infrastructure
error; a runtime this host lacks, or limits it cannot enforce (`egress`, `strict_caps`), are refused before any
rollout starts (`runtimes.preflight`), naming them; a rollout run alone (`run_rollout`) fails at `setup` instead.
"""

from __future__ import annotations

import json
import random
import re
import secrets
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from pydantic import ValidationError, ValidationInfo, field_validator

from tracegym.core.errors import ErrorKind, FailureKind, TraceError
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import metric, reward
from tracegym.envs.task import EnvResponse, Task
from tracegym.envs.task_sandbox import how_it_failed
from tracegym.envs.taskset import Taskset, TasksetConfig
from tracegym.runtimes.catalog import RUNTIMES, runtime_for
from tracegym.runtimes.sandbox import Limits, ProgramResult, Runtime
from tracegym.tasksets.function_problems import FAMILIES, FunctionTest

CHECKER = files("tracegym.tasksets").joinpath("data/check_solution.py").read_text()
SYSTEM = ("You are an expert Python programmer. Answer with the complete function in one ```python code block. "
          "Use only the standard library.")
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
FEEDBACK_CHARS = 1500
"""Most characters of a program's stderr a feedback message quotes."""


class PythonFunctionsConfig(TasksetConfig):
    """Options of python-functions."""

    num_tasks: int = 300
    """How many problems to generate (the kinds of function are cycled through in a seeded order)."""
    tests_per_task: int = 8
    """Hidden tests per problem (the example in the prompt is another call)."""
    attempts: int = 1
    """Replies the model may make: 1 is single-turn; more gives it the first failing test's output after a failed
    reply."""
    runtime: str = "bubblewrap"
    """Where the code runs: subprocess, bubblewrap or container."""
    wall_seconds: float = 10.0
    """Wall-clock limit of one run of the tests."""
    cpu_seconds: int = 5
    """CPU seconds a run's processes may each use."""
    memory_mb: int = 512
    """Address space of each process of a run."""
    processes: int = 32
    """Processes a run may have at once."""
    egress: list[str] = []
    """`HOST:PORT`s the code may still reach (the sandbox has no network otherwise; see `Limits.egress`): each
    hostname must resolve on this host, and the runtime must enforce it (bubblewrap, subprocess)."""
    read_only: list[str] = []
    """Host paths the code sees read-only (a library folder, say); each must exist (`Limits.read_only`)."""
    devices: list[str] = []
    """Host device nodes the sandbox shows (e.g. `/dev/nvidia0`); each must exist (`Limits.devices`)."""
    strict_caps: bool = False
    """Refuse to run where memory_mb, processes and the sandbox's disk cannot be capped per sandbox (no cgroup,
    not root), instead of per process with a warning (`Limits.strict_caps`)."""

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, value: str) -> str:
        if value not in RUNTIMES:
            raise ValueError(f"unknown runtime {value!r}; known: {', '.join(RUNTIMES)}")
        return value

    @field_validator("egress", "read_only", "devices")
    @classmethod
    def _valid_limit(cls, value: list[str], info: ValidationInfo) -> list[str]:
        try:
            Limits.model_validate({info.field_name: value})
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return value

    @field_validator("attempts", "tests_per_task")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    def limits(self) -> Limits:
        """The sandbox limits of one run."""
        return Limits(wall_seconds=self.wall_seconds, cpu_seconds=self.cpu_seconds, memory_mb=self.memory_mb,
                      processes=self.processes, output_bytes=200_000, egress=tuple(self.egress),
                      read_only=tuple(self.read_only), devices=tuple(self.devices), strict_caps=self.strict_caps)


class FunctionData(TaskData):
    """A function to write and its hidden tests."""

    function: str
    """The function's name."""
    signature: str
    tests: list[FunctionTest]
    """Hidden from the model: the calls and the values they must return."""


@dataclass(frozen=True)
class Grade:
    """How one reply's code did: tests passed, of how many, and what the first failure was."""

    passed: int
    total: int
    failure: str | None
    """The first failing test's call and outcome (what the multi-turn variant tells the model); None when all
    passed."""


def extract_code(text: str) -> str | None:
    """The last fenced python (or bare) code block of a reply, or None."""
    blocks = _BLOCK.findall(text)
    return blocks[-1] if blocks else None


def call_text(function: str, args: list[object]) -> str:
    return f"{function}({', '.join(repr(a) for a in args)})"


def grade(data: FunctionData, result: ProgramResult, sentinel: str) -> Grade:
    """Compare the values the checker printed with the hidden expected ones."""
    outcomes: dict[int, dict[str, object]] = {}
    for line in result.stdout.splitlines():
        if line.startswith(sentinel):
            try:
                outcome = json.loads(line[len(sentinel):])
                outcomes.setdefault(int(outcome["i"]), outcome)
            except (ValueError, KeyError, TypeError):
                continue
    passed, failure = 0, None
    for index, test in enumerate(data.tests):
        outcome = outcomes.get(index)
        call = call_text(data.function, test.args)
        if outcome is not None and "value" in outcome and outcome["value"] == test.expected:
            passed += 1
            continue
        if failure is None:
            if outcome is None:
                failure = f"The program stopped before {call} returned: it {how_it_failed(result)}"
            elif "error" in outcome:
                failure = f"{call} raised {outcome['error']}"
            else:
                failure = f"{call} returned {outcome['value']!r}, expected {test.expected!r}"
    return Grade(passed, len(data.tests), failure)


def misbehaviour(result: ProgramResult) -> str | None:
    """What went wrong with a run beyond failing tests (a trace error): it could not start, broke a limit, was
    killed by a signal, or left processes running; None for a run that ended on its own (passing or not)."""
    if result.start_error or result.limit or result.signal:
        return f"the solution {how_it_failed(result)}"
    if result.left_running:
        return f"the solution left {result.left_running} process(es) running; the sandbox killed them"
    return None


class PythonFunctionTask(Task[FunctionData, PythonFunctionsConfig]):
    """One function to write, checked in the rollout's sandbox."""

    def __init__(self, data: FunctionData, **options: Any) -> None:
        super().__init__(data, **options)
        if options.get("max_turns") is None:
            self.max_turns = self.config.attempts
        self._grades: dict[str | None, Grade] = {}

    def runtime(self) -> Runtime:
        return runtime_for(self.config.runtime, self.config.limits())

    async def setup(self) -> None:
        await self.sandbox()  # a runtime this host lacks fails here, at setup, naming it

    async def check(self, code: str | None, trace: Trace, stage: str) -> Grade:
        """Run `code` against the hidden tests (once per distinct code); a broken limit is recorded on `trace`."""
        if code not in self._grades:
            self._grades[code] = await self._run(code, trace, stage)
        return self._grades[code]

    async def _run(self, code: str | None, trace: Trace, stage: str) -> Grade:
        total = len(self.data.tests)
        if code is None:
            return Grade(0, total, "No code found: answer with the complete function in a ```python block.")
        sandbox = await self.sandbox()
        sentinel = f"<<tracegym-test-{secrets.token_hex(8)}>>"
        # never through a link: the previous attempt's code may have replaced these files by symlinks
        sandbox.write_file("solution.py", code)
        sandbox.write_file("check.py", CHECKER)
        sandbox.write_file("calls.json", json.dumps([t.args for t in self.data.tests]))
        result = await sandbox.run(["python3", "check.py", self.data.function, sentinel])
        misbehaved = misbehaviour(result)
        if misbehaved:
            turn = sum(m.role == "assistant" for m in trace.completion) - 1
            trace.errors.append(TraceError(kind=ErrorKind.INFRASTRUCTURE, stage=stage, message=misbehaved, turn=turn,
                                           failure=FailureKind.SANDBOX_ERROR) if result.start_error else
                                TraceError(kind=ErrorKind.MODEL, stage=stage, message=misbehaved, turn=turn))
        return grade(self.data, result, sentinel)

    async def env_response(self, trace: Trace) -> EnvResponse:
        graded = await self.check(extract_code(trace.last_reply), trace, "env_response")
        replies = sum(m.role == "assistant" for m in trace.completion)
        if graded.failure is None or replies >= self.config.attempts:
            return None
        return (f"{graded.passed}/{graded.total} hidden tests passed. First failure: "
                f"{graded.failure[-FEEDBACK_CHARS:]}\nFix the function and answer with the complete corrected code.")

    @reward
    async def passed(self, trace: Trace) -> float:
        graded = await self.check(extract_code(trace.last_reply), trace, "scoring:passed")
        return graded.passed / graded.total

    @metric
    async def solved(self, trace: Trace) -> float:
        graded = await self.check(extract_code(trace.last_reply), trace, "scoring:solved")
        return float(graded.failure is None)


def make_row(rng: random.Random, cfg: PythonFunctionsConfig, index: int) -> FunctionData:
    """One problem: a kind of function (cycled through in a seeded order), an example call and hidden tests."""
    family = FAMILIES[index % len(FAMILIES)] if index < len(FAMILIES) else rng.choice(FAMILIES)
    example = family.test(rng)
    prompt = (f"Write a Python function\n\n    def {family.signature}:\n\nthat returns {family.description}.\n\n"
              f"For example, {call_text(family.name, example.args)} returns {example.expected!r}.")
    return FunctionData(id=f"python-functions-{cfg.seed}-{index}", prompt=prompt, system_prompt=SYSTEM,
                        function=family.name, signature=family.signature,
                        tests=[family.test(rng) for _ in range(cfg.tests_per_task)])


class PythonFunctions(Taskset[PythonFunctionsConfig]):
    """Generated function-writing problems checked by hidden tests in a sandbox; reward: fraction passed."""

    id = "python-functions"
    description = ("Write a Python function; it runs in a sandbox against hidden unit tests "
                   "(reward: fraction passed; attempts > 1: feedback from the first failing test).")
    task_class = PythonFunctionTask
    row_maker = make_row
