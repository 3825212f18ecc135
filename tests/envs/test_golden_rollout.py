"""Golden rollout: one rich scripted rollout's whole trace, pinned against tests/envs/data/golden_rollout.json.

The rollout: turn 0 makes two parallel tool calls, turn 1 a call with malformed JSON arguments (a tool error
the model sees), turn 2 answers and the task questions it, turn 3 answers again, the task acknowledges and a
stop fires; tokens are on, so every node carries its token ids, mask and logprobs. Volatile fields (ids, wall
clock, span times) are dropped; span names and turns stay.

A change to the rollout loop's semantics shows up here as a diff. When the change is intended, regenerate the
file and review its diff before committing:

    TRACEGYM_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/envs/test_golden_rollout.py
"""

import json
import os
import re
from pathlib import Path

import tracegym as tg
from tracegym.testing import ScriptedModel, reply, tool_call

GOLDEN = Path(__file__).parent / "data" / "golden_rollout.json"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


class Checked(tg.Task):
    """Questions an answer that does not say 'sure'; acknowledges one that does."""

    async def env_response(self, trace):
        return "Noted." if "sure" in trace.last_reply else "Are you sure?"

    @tg.stop
    def confident(self, trace):
        return "sure" in trace.last_reply

    @tg.reward
    def correct(self, trace):
        return float(trace.last_reply.startswith(str(self.data.answer)))

    @tg.metric
    def replies(self, trace):
        return trace.num_turns


class Golden(tg.Taskset):
    id = "golden"
    task_class = Checked


SCRIPT = [
    reply("Adding both.", tool_call("add", {"a": 1, "b": 2}, id="c1"), tool_call("add", {"a": 3, "b": 4}, id="c2")),
    reply(None, tool_call("add", '{"a": 3, "b":', id="c3")),
    "10",
    "10, I am sure.",
]


async def rich_trace() -> tg.Trace:
    taskset = Golden(data=[{"prompt": "Add 1+2 and 3+4, then sum them.", "answer": 10, "id": "g1"}],
                     tools=[add])
    [trace] = await tg.evaluate(taskset, ScriptedModel(SCRIPT, tokens=True), sampling=tg.Sampling(seed=3))
    return trace


def stable(trace: tg.Trace) -> dict:
    """The trace as JSON without the fields that change from run to run."""
    data = trace.model_dump(mode="json")
    del data["id"], data["started_at"]
    data["spans"] = [{"name": s["name"], "turn": s["turn"]} for s in data["spans"]]
    return data


def readable_json(data: dict) -> str:
    """Indented JSON with each list of numbers (token ids, masks, logprobs) on one line."""
    text = json.dumps(data, indent=1)
    return re.sub(r"\[\n\s*(-?[\d.e-]+(?:,\n\s*-?[\d.e-]+)*)\n\s*\]",  # a newline is never inside a string
                  lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text) + "\n"


async def test_rich_rollout_reproduces_the_golden_trace():
    got = stable(await rich_trace())
    if os.environ.get("TRACEGYM_REGENERATE_GOLDEN"):
        GOLDEN.write_text(readable_json(got))
    assert got == json.loads(GOLDEN.read_text())


async def test_golden_trace_has_the_shape_it_claims():
    """Guards the golden file itself: a regeneration that lost the rollout's features fails here."""
    trace = await rich_trace()
    assert [(m.role, m.text) for m in trace.messages] == [
        ("user", "Add 1+2 and 3+4, then sum them."),
        ("assistant", "Adding both."), ("tool", "3"), ("tool", "7"),
        ("assistant", ""), ("tool", trace.messages[5].text),
        ("assistant", "10"), ("user", "Are you sure?"),
        ("assistant", "10, I am sure."), ("user", "Noted.")]
    assert trace.messages[5].text.startswith("Error: ValueError: arguments of tool call 'add' are not valid JSON")
    assert (trace.stop_reason, trace.stopped_by) == (tg.StopReason.STOP_CONDITION, "confident")
    assert trace.metrics == {"tool_calls": 3, "tool_errors": 1, "replies": 4.0} and trace.reward == 1.0
    assert [(e.kind, e.stage, e.turn) for e in trace.errors] == [(tg.ErrorKind.TOOL, "tool:add", 1)]
    assert all(n.token_ids and len(n.token_ids) == len(n.mask) == len(n.logprobs)
               for n in trace.graph.nodes if n.sampled)
    assert len(trace.branches) == 1
