"""Detail traces: the traces and episodes the renderers' tests draw, made by the fakes through the rollout loop,
the episode driver and the graph's own methods, and a parser that checks a fragment is well-formed."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import tracegym as tg
from tracegym.core.messages import Message, assistant, system, user
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.evaluate import run_episode
from tracegym.envs.proxy import attach
from tracegym.envs.registry import load_taskset
from tracegym.tasksets.tool_calculator import add
from tracegym.testing import ScriptedModel, reply, tool_call
from tracegym.testing.scripted_model import encode, render, render_body
from tracegym.view.tokens_view import TokenText

SCRIPT = "<script>alert(1)</script>"
BYTES = TokenText({i: bytes([i]) for i in range(256)})
"""The scripted model's toy tokenizer (one token per UTF-8 byte) as a TokenText."""


def tree(fragment: str) -> ET.Element:
    """The fragment parsed as XML under one root: raises when a tag is unclosed or text is not escaped."""
    return ET.fromstring(f"<root>{fragment}</root>")


def text_of(element: ET.Element) -> str:
    return "".join(element.itertext())


@tg.reward
def correct(task, trace):
    return float(str(task.data.answer) in trace.last_reply)


async def tool_trace(last: str = f"3 {SCRIPT}", version: int | None = 4) -> Trace:
    """A rollout of the scripted model (exact toy tokens, logprob -0.5 each) that calls `add` and answers."""
    taskset = tg.Taskset(id="calc", data=[{"prompt": "1+2?", "answer": 3}], rewards=[correct], tools=[add])
    model = ScriptedModel([reply(None, tool_call("add", {"a": 1, "b": 2}, id="c1")), last], tokens=True)
    model.policy_version = version
    [trace] = await tg.evaluate(taskset, model, sampling=Sampling(temperature=1.0))
    return trace


def model_turn(trace: Trace, messages: list[Message], answer: str) -> None:
    """The head's conversation answered by the toy model, its tokens placed by the graph (forking if need be)."""
    prompt, completion = encode(render(messages)), encode(render_body(assistant(answer)))
    trace.graph.add_model_turn(assistant(answer), prompt_ids=prompt, completion_ids=completion,
                               completion_logprobs=[-0.5] * len(completion), temperature=1.0)


def retokenized_trace() -> Trace:
    """Two turns where the second prompt renders the first reply differently: the graph forks a copy."""
    trace = Trace(task=TaskData(prompt="hi"), model="scripted")
    trace.graph.add(user("hi"))
    model_turn(trace, trace.messages, "first")
    trace.graph.add(user("more"))
    drifted = [user("hi"), assistant("First"), user("more")]  # the template now capitalises the reply
    prompt, completion = encode(render(drifted)), encode(render_body(assistant("second")))
    trace.graph.add_model_turn(assistant("second"), prompt_ids=prompt, completion_ids=completion,
                               completion_logprobs=[-0.5] * len(completion), temperature=1.0)
    return trace


def proxy_trace() -> Trace:
    """An agent program's calls as the interception proxy records them: a resent history, a rewritten one, the
    same conversation again, and a new one."""
    trace = Trace(task=TaskData(prompt="task"), model="scripted")
    start = [system("s"), user("task")]
    edited = [*start, assistant(f"a shorter summary {SCRIPT}"), user("go on")]
    for messages in (start, [*start, assistant("reply 2"), user("go on")], edited, edited,
                     [system("other"), user("compacted")]):
        attach(trace.graph, messages)
        model_turn(trace, trace.graph.messages(), f"reply {len(trace.graph.nodes)}")
    return trace


def by_member(**replies: list[str]) -> ScriptedModel:
    """Each member answers from its own list in turn (the first member named in the system prompt)."""
    said = {member: iter(texts) for member, texts in replies.items()}
    return ScriptedModel(rule=lambda r: next(next(it for m, it in said.items() if m in r.messages[0].text)),
                         tokens=True)


async def debate_episode(judge: str | None = None) -> tg.Episode:
    """A one-round debate: debater_a thinks privately, both argue, the judge decides (right, unless `judge`)."""
    taskset = load_taskset("debate", {"rounds": 1})
    row = taskset[0]
    model = by_member(debater_a=[f"<think>secret plan {SCRIPT}</think>A is right"], debater_b=["B is right"],
                      judge=[judge or f"Convincing. VERDICT: {row.answer}"])
    return await run_episode(taskset, row, model)


async def poker_episode() -> tg.Episode:
    """A hand of Kuhn poker where player_0 leaves a `<think>` unclosed (a parse error) and then bets."""
    taskset = load_taskset("kuhn-poker")
    row = taskset.as_data({"prompt": "A new hand begins.", "cards": {"player_0": "K", "player_1": "Q"}, "id": "h"})
    return await run_episode(taskset, row, by_member(player_0=["bet <think>they fold"], player_1=["call"]))
