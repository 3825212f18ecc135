"""tool-calculator: generated expressions, tools derived from plain functions, the result reward, tool metrics."""

import ast
import operator

import pytest

import tracegym as tg
from tracegym.testing import ScriptedModel, reply, tool_call

TOOLS = {ast.Add: ("add", operator.add), ast.Sub: ("subtract", operator.sub),
         ast.Mult: ("multiply", operator.mul), ast.Div: ("divide", operator.truediv)}


def expression_in(request) -> str:
    text = request.messages[1].text
    return text.removeprefix("Compute ").removesuffix(" with the calculator tools and give the result.")


def plan(expression: str) -> list[tuple[str, float, float]]:
    """The tool calls that compute `expression`, innermost operation first."""
    calls = []

    def walk(node: ast.expr) -> float:
        if isinstance(node, ast.Constant):
            return float(node.value)
        assert isinstance(node, ast.BinOp)
        a, b = walk(node.left), walk(node.right)
        name, fn = TOOLS[type(node.op)]
        calls.append((name, a, b))
        return fn(a, b)

    walk(ast.parse(expression, mode="eval").body)
    return calls


def uses_the_tools(request):
    """One tool call per turn following the plan, then the last tool result as the answer."""
    results = [m.text for m in request.messages if m.role == "tool"]
    steps = plan(expression_in(request))
    if len(results) < len(steps):
        name, a, b = steps[len(results)]
        return reply(None, tool_call(name, {"a": a, "b": b}))
    return f"The result is {results[-1]}."


def test_tasks_are_deterministic_for_a_seed():
    first = [d.expression for d in tg.load_taskset("tool-calculator").head(5)]
    assert first == [d.expression for d in tg.load_taskset("tool-calculator").head(5)]
    assert first != [d.expression for d in tg.load_taskset("tool-calculator", {"seed": 1}).head(5)]


def test_expressions_need_two_to_three_operations_and_match_their_value():
    for data in tg.load_taskset("tool-calculator").head(50):
        assert 2 <= len(plan(data.expression)) <= 3
        assert eval(data.expression) == pytest.approx(data.answer)  # a generated expression: digits and + - * /


def test_tools_are_the_four_operations_with_number_arguments():
    task = tg.load_taskset("tool-calculator").task(next(iter(tg.load_taskset("tool-calculator"))))
    specs = {s.name: s for s in task.tool_specs()}
    assert set(specs) == {"add", "subtract", "multiply", "divide"}
    assert specs["divide"].parameters["properties"]["b"] == {"type": "number", "description": "The divisor."}
    assert specs["subtract"].parameters["required"] == ["a", "b"]


async def test_computing_with_the_tools_scores_one():
    traces = await tg.evaluate("tool-calculator", ScriptedModel(rule=uses_the_tools), num_tasks=3, rollouts=2)
    assert [t.reward for t in traces] == [1.0] * 6
    assert all(t.metrics["used_tools"] == 1.0 and t.metrics["tool_calls"] >= 2 for t in traces)
    assert all(t.errors == [] for t in traces)


async def test_right_answer_without_tools_scores_one_with_used_tools_zero():
    model = ScriptedModel(rule=lambda r: f"It is {eval(expression_in(r)):.2f}")
    traces = await tg.evaluate("tool-calculator", model, num_tasks=3)
    assert [t.reward for t in traces] == [1.0] * 3
    assert [t.metrics["used_tools"] for t in traces] == [0.0] * 3


async def test_wrong_answer_scores_zero():
    model = ScriptedModel(rule=lambda r: f"It is {eval(expression_in(r)) + 0.02}")
    traces = await tg.evaluate("tool-calculator", model, num_tasks=3)
    assert [t.reward for t in traces] == [0.0] * 3


async def test_divide_by_zero_is_a_tool_error_and_the_rollout_goes_on():
    model = ScriptedModel([reply(None, tool_call("divide", {"a": 1, "b": 0}))], rule=uses_the_tools)
    [trace] = await tg.evaluate("tool-calculator", model, num_tasks=1)
    assert trace.messages[3].role == "tool" and "ZeroDivisionError" in trace.messages[3].text
    assert trace.metrics["tool_errors"] == 1 and trace.errors[0].kind == tg.ErrorKind.TOOL
    assert trace.ok and trace.reward == 1.0
