"""Quick start: define a tool-using taskset the recommended way, then evaluate a scripted model on it in process.

The recommended shape (the README's too): a `Task` subclass holds the behaviour (rewards as decorated methods,
tools in `tools`), a `Taskset` subclass says where the rows come from and which Task runs them. The model here
is tracegym.testing.ScriptedModel, a fake that needs no server, so the example runs anywhere in a second; pass
`tg.Endpoint(base_url=..., model=...)` instead to evaluate a real endpoint.
"""

import asyncio

import tracegym as tg
from tracegym.testing import ScriptedModel, reply, tool_call


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


class Sum(tg.Task):
    tools = (add,)

    @tg.reward
    def correct(self, trace: tg.Trace) -> float:
        return float(trace.last_reply.strip() == str(self.data.answer))


class Sums(tg.Taskset):
    id = "sums"
    task_class = Sum

    def load(self) -> list[dict]:
        return [{"prompt": f"{i}+{i}?", "answer": 2 * i} for i in range(5)]


def rule(request: tg.ModelRequest) -> object:
    """The scripted model: ask `add` to double the question's number, then answer with what it returned."""
    if request.messages[-1].role == "tool":
        return request.messages[-1].text
    n = int(request.messages[-1].text.split("+")[0])
    return reply(None, tool_call("add", {"a": n, "b": n}))


async def main() -> None:
    traces = await tg.evaluate(Sums(), ScriptedModel(rule=rule, tokens=True), rollouts=2)
    for trace in traces:
        print(trace.task.prompt, "->", trace.last_reply, "reward", trace.reward, trace.stop_reason.value)
    print(f"{len(traces)} traces, mean reward {sum(t.reward or 0 for t in traces) / len(traces):.2f}")


if __name__ == "__main__":
    asyncio.run(main())
