"""A minimal ReAct agent, written against the `openai` SDK as anyone would write one: ask the model, run the
tools it calls, send back their results, stop when it answers without a tool call, and write that answer to
`answer.txt` (and stdout).

It knows nothing of tracegym. Under a tracegym `ProgramHarness` the SDK's own environment variables point it at
the rollout's interception proxy (`OPENAI_BASE_URL`, `OPENAI_API_KEY`), `OPENAI_MODEL` names the model, and the
task's prompt comes as `TRACEGYM_MESSAGES` (else `--prompt` or `TRACEGYM_PROMPT`). Run it by hand against any
OpenAI-compatible endpoint the same way:

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=x OPENAI_MODEL=m python react_agent.py --prompt "2*21?"
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import sys
from pathlib import Path
from typing import Any

from openai import OpenAI

SYSTEM = ("You are a careful assistant. Use the tools when they help: `calculate` for arithmetic, the file tools "
          "for files in your working directory. When you know the answer, reply with it alone.")
TOOLS = [
    {"type": "function", "function": {
        "name": "calculate", "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file in the working directory.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a text file in the working directory.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "list_files", "description": "List the files in the working directory.",
        "parameters": {"type": "object", "properties": {}}}},
]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
        ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression (numbers and operators only; nothing else is evaluated)."""
    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.unparse(node)}")
    return str(value(ast.parse(expression, mode="eval").body))


def inside(path: str) -> Path:
    """`path` within the working directory (a path that leaves it is refused)."""
    full = (Path.cwd() / path).resolve()
    if not full.is_relative_to(Path.cwd().resolve()):
        raise ValueError(f"{path} is outside the working directory")
    return full


def run_tool(name: str, arguments: str) -> str:
    """Run one tool call; any failure is the answer the model sees."""
    try:
        args = json.loads(arguments or "{}")
        if name == "calculate":
            return calculate(args["expression"])
        if name == "read_file":
            return inside(args["path"]).read_text()
        if name == "write_file":
            inside(args["path"]).write_text(args["content"])
            return "written"
        if name == "list_files":
            return "\n".join(sorted(p.name for p in Path.cwd().iterdir())) or "(empty)"
        return f"Error: unknown tool {name}"
    except Exception as exc:  # the model is told, and the loop goes on
        return f"Error: {type(exc).__name__}: {exc}"


def ask(client: OpenAI, model: str, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """One model call; the assistant message as a dict to append to the history."""
    if not stream:
        message = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0].message
        return message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio", "function_call"})
    content, calls = "", {}
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            slot = calls.setdefault(call.index, {"id": "", "type": "function",
                                                 "function": {"name": "", "arguments": ""}})
            slot["id"] += call.id or ""
            slot["function"]["name"] += (call.function and call.function.name) or ""
            slot["function"]["arguments"] += (call.function and call.function.arguments) or ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def first_messages(prompt: str | None) -> list[dict[str, Any]]:
    """The conversation to start from: the task's own messages when tracegym gives them, else the prompt."""
    if prompt is None and os.environ.get("TRACEGYM_MESSAGES"):
        messages = json.loads(os.environ["TRACEGYM_MESSAGES"])
        return messages if messages and messages[0]["role"] == "system" else [
            {"role": "system", "content": SYSTEM}, *messages]
    text = prompt or os.environ.get("TRACEGYM_PROMPT")
    if not text:
        sys.exit("react_agent: no task: give --prompt, or set TRACEGYM_PROMPT or TRACEGYM_MESSAGES")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", help="the task (default: $TRACEGYM_MESSAGES or $TRACEGYM_PROMPT)")
    parser.add_argument("--max-steps", type=int, default=8, help="model calls at most")
    parser.add_argument("--stream", action="store_true", help="stream the replies, as chat UIs do")
    args = parser.parse_args(argv)
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ.get("OPENAI_MODEL", "default")
    messages = first_messages(args.prompt)
    answer = ""
    for _ in range(args.max_steps):
        message = ask(client, model, messages, args.stream)
        messages.append(message)
        answer = message.get("content") or ""
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            result = run_tool(call["function"]["name"], call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    Path("answer.txt").write_text(answer)
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
