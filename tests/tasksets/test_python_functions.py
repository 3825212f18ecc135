"""python-functions: generated problems, code run in a real sandbox against hidden tests, the fraction passed
as reward, feedback from the first failing test in the multi-turn variant, and a program's misbehaviour or a
missing runtime as classified errors on the trace."""

from __future__ import annotations

import json

import pytest

import tracegym as tg
from tracegym.core.errors import ErrorKind, UsageError
from tracegym.tasksets.function_problems import FAMILIES
from tracegym.tasksets.python_functions import FunctionData, PythonFunctions, extract_code
from tracegym.testing import ScriptedModel

QUICK = {"runtime": "subprocess", "wall_seconds": 3.0, "cpu_seconds": 2, "memory_mb": 256, "num_tasks": 20}


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```\nDone."


def oracle(row: FunctionData) -> str:
    """A solution that looks its answers up: right on every hidden test, whatever the kind of function."""
    table = {json.dumps(t.args): t.expected for t in row.tests}
    return f"import json\ndef {row.function}(*args):\n    return {table!r}[json.dumps(list(args))]"


async def run(options: dict, replies: list[str], asked: list[int] | None = None) -> tg.Trace:
    """One rollout of the first task (sum_digits), the model answering `replies` in turn (each request counted in
    `asked`, where given)."""
    answers = iter(replies)

    def reply(_: object) -> str:
        if asked is not None:
            asked.append(1)
        return next(answers)

    [trace] = await tg.evaluate(PythonFunctions({**QUICK, **options}).head(1), ScriptedModel(rule=reply),
                                num_tasks=1, rollouts=1)
    return trace


def test_rows_are_seeded_and_cover_every_kind_of_function() -> None:
    rows = list(PythonFunctions({"num_tasks": len(FAMILIES) + 5}))
    assert rows == list(PythonFunctions({"num_tasks": len(FAMILIES) + 5}))
    assert {r.function for r in rows[:len(FAMILIES)]} == {f.name for f in FAMILIES}
    assert all(len(r.tests) == 8 for r in rows)
    assert rows[0].prompt.startswith("Write a Python function\n\n    def sum_digits(n: int) -> int:")
    assert "expected" not in rows[0].prompt and str(rows[0].tests[0].expected) not in rows[0].prompt.split("returns")[0]


async def test_every_kind_of_function_round_trips_through_the_sandbox() -> None:
    taskset = PythonFunctions({**QUICK, "num_tasks": len(FAMILIES)})
    rows = {r.key: r for r in taskset}
    traces = await tg.evaluate(taskset, ScriptedModel(rule=lambda r: fenced(oracle(_row_of(r, rows)))),
                               num_tasks=len(FAMILIES), rollouts=1)
    assert [(t.task.function, t.reward, t.errors) for t in traces if t.reward != 1.0] == []


def _row_of(request: object, rows: dict[str, FunctionData]) -> FunctionData:
    prompt = request.messages[-1].text  # type: ignore[attr-defined]
    return next(r for r in rows.values() if r.prompt == prompt)


async def test_reward_is_the_fraction_of_hidden_tests_passed() -> None:
    right = await run({}, [fenced("def sum_digits(n):\n    return sum(int(d) for d in str(n))")])
    assert right.reward == 1.0 and right.metrics["solved"] == 1.0 and right.errors == []
    wrong = await run({}, [fenced("def sum_digits(n):\n    return -1")])
    assert wrong.reward == 0.0 and wrong.metrics["solved"] == 0.0
    row = PythonFunctions(QUICK)[0]
    small = [t for t in row.tests if t.args[0] < 10]
    partial = await run({}, [fenced("def sum_digits(n):\n    return n")])  # right only for one-digit numbers
    assert partial.reward == len(small) / len(row.tests)


async def test_no_code_block_scores_zero_without_an_error() -> None:
    trace = await run({}, ["I am not sure."])
    assert trace.reward == 0.0 and trace.errors == [] and trace.ok


async def test_multi_turn_feedback_names_the_first_failing_test() -> None:
    row = PythonFunctions(QUICK)[0]
    trace = await run({"attempts": 3}, [fenced("def sum_digits(n):\n    raise ValueError('nope')"),
                                        fenced("def sum_digits(n):\n    return 0"),
                                        fenced("def sum_digits(n):\n    return sum(map(int, str(n)))")])
    feedback = [m.text for m in trace.completion if m.role == "user"]
    first = f"sum_digits({row.tests[0].args[0]!r})"
    assert feedback[0].startswith(f"0/8 hidden tests passed. First failure: {first} raised ValueError: nope")
    wrong = next(t for t in row.tests if t.expected != 0)
    assert f"sum_digits({wrong.args[0]!r}) returned 0, expected {wrong.expected!r}" in feedback[1]
    assert len(feedback) == 2 and trace.reward == 1.0 and trace.stop_reason == tg.StopReason.COMPLETED


async def test_multi_turn_stops_after_its_attempts_and_scores_the_last() -> None:
    trace = await run({"attempts": 2}, [fenced("def sum_digits(n):\n    return 0")] * 2)
    assert sum(m.role == "assistant" for m in trace.completion) == 2 and trace.reward < 1.0


async def test_a_program_that_breaks_a_limit_is_the_models_error_and_still_trained() -> None:
    trace = await run({"attempts": 2}, [fenced("def sum_digits(n):\n    while True:\n        pass"),
                                        fenced("def sum_digits(n):\n    return sum(map(int, str(n)))")])
    assert [(e.kind, e.stage, e.turn) for e in trace.errors] == [(ErrorKind.MODEL, "env_response", 0)]
    assert "broke the sandbox's" in trace.errors[0].message
    feedback = next(m.text for m in trace.completion if m.role == "user")
    assert "The program stopped before sum_digits(" in feedback and "limit" in feedback
    assert trace.reward == 1.0 and trace.failure is None


async def test_a_runtime_the_host_lacks_is_refused_before_any_rollout() -> None:
    from tracegym.runtimes.catalog import runtime_for

    reason = runtime_for("container").unavailable()
    if reason is None:
        pytest.skip("this host has a working container engine")
    said = []
    with pytest.raises(UsageError) as refused:
        await run({"runtime": "container"}, [fenced("def sum_digits(n):\n    return 0")], said)
    assert str(refused.value) == f"taskset 'python-functions': runtime 'container' cannot run on this host: {reason}"
    assert said == []  # no rollout asked the model


def test_an_unknown_runtime_is_refused_naming_the_field() -> None:
    with pytest.raises(UsageError, match=r"field 'runtime': .*unknown runtime 'docker'; known: subprocess, "):
        tg.load_taskset("python-functions", {"runtime": "docker"})


def test_code_extraction_takes_the_last_block() -> None:
    assert extract_code("```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nc = 3\n```") == "c = 3\n"
    assert extract_code("no code") is None


@pytest.mark.parametrize("runtime", ["subprocess", "bubblewrap"])
async def test_a_symlink_left_by_one_attempt_never_makes_the_host_write_through_it(
        runtime: str, tmp_path: pytest.TempPathFactory) -> None:
    """The first attempt replaces solution.py by a link to a host file; the host's write of the second attempt
    replaces the link, never the file it points at."""
    from tracegym.runtimes.catalog import runtime_for
    if runtime_for(runtime).unavailable():
        pytest.skip(str(runtime_for(runtime).unavailable()))
    victim = tmp_path / "victim"  # type: ignore[operator]
    victim.write_text("ORIGINAL")
    victim.chmod(0o600)
    plant = fenced(f"import os\nos.remove('solution.py')\nos.symlink({str(victim)!r}, 'solution.py')")
    trace = await run({"attempts": 2, "runtime": runtime}, [plant, fenced("# written by the host")])
    assert victim.read_text() == "ORIGINAL"
    assert len([m for m in trace.completion if m.role == "assistant"]) == 2
