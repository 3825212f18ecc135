"""Quick start: define a tool-using taskset and evaluate a scripted model on it, in process.

The model here is tracegym.testing.ScriptedModel, a fake that needs no server, so the example runs anywhere in
a second; swap in `tg.ChatClient(tg.Endpoint(base_url=..., model=...))` for a real endpoint.
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


@tg.reward
def correct(task: tg.Task, trace: tg.Trace) -> float:
    return float(trace.last_reply.strip() == str(task.data.answer))


async def main() -> None:
    taskset = tg.Taskset(id="sums", data=[{"prompt": f"{i}+{i}?", "answer": 2 * i} for i in range(5)],
                         rewards=[correct], tools=[add])

    def rule(request: tg.ModelRequest) -> object:
        if request.messages[-1].role == "tool":
            return request.messages[-1].text
        n = int(request.messages[-1].text.split("+")[0])
        return reply(None, tool_call("add", {"a": n, "b": n}))

    traces = await tg.evaluate(taskset, ScriptedModel(rule=rule, tokens=True), rollouts=2)
    for trace in traces:
        print(trace.task.prompt, "->", trace.last_reply, "reward", trace.reward, trace.stop_reason.value)
    print(f"{len(traces)} traces, mean reward {sum(t.reward or 0 for t in traces) / len(traces):.2f}")


if __name__ == "__main__":
    asyncio.run(main())
