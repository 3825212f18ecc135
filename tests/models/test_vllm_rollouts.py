"""Slow: `tracegym inference` serves the embedded model on real vLLM; rollouts through the chat client carry its
exact tokens and logprobs; a tool-call turn and its result render; SIGTERM to the command leaves no process
behind."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tracegym as tg
from tracegym.core.messages import ToolCall, assistant, tool, user
from tracegym.envs.tools import Tool
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelRequest
from tracegym.models.embedded import SERVED_MODEL_NAME
from tracegym.runtimes.processes import process_alive

pytestmark = pytest.mark.slow


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, found through /proc parent links."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.fixture(scope="module")
def inference():
    """The `tracegym inference` command, running until its endpoint line appears."""
    proc = subprocess.Popen([sys.executable, "-m", "tracegym.cli.main", "inference", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base_url, seen = None, []
    deadline = time.monotonic() + 400
    while base_url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if line.startswith("endpoint:"):
            base_url = line.split()[1]
    if base_url is None:
        proc.kill()
        pytest.fail("tracegym inference did not print its endpoint:\n" + "".join(seen[-30:]))
    yield proc, base_url
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@pytest.fixture
async def client(inference):
    _, base_url = inference
    async with ChatClient(tg.Endpoint(base_url=base_url, model=SERVED_MODEL_NAME, api_key_env=None)) as client:
        yield client


async def test_rollouts_on_real_vllm_have_replies_tokens_and_logprobs(client):
    traces = await tg.evaluate("reverse-text", client, num_tasks=3, rollouts=2,
                               sampling=tg.Sampling(max_tokens=24, temperature=0.7))
    assert len(traces) == 6
    for trace in traces:
        assert not trace.errors, trace.errors
        assert trace.last_reply.strip()
        reply = trace.graph.nodes[-1]
        assert reply.sampled and reply.token_ids and len(reply.logprobs) == len(reply.token_ids)
        assert all(lp <= 0.0 for lp in reply.logprobs)
        assert trace.rewards["lcs"].score is not None


async def test_branch_tokens_are_the_prompt_then_the_sampled_completion(client):
    [trace] = await tg.evaluate("reverse-text", client, num_tasks=1, rollouts=1,
                                sampling=tg.Sampling(max_tokens=16, temperature=0.0))
    tokens = trace.graph.tokens()
    reply = trace.graph.nodes[-1]
    assert tokens[-len(reply.token_ids):] == reply.token_ids
    assert len(tokens) == trace.usage.prompt_tokens + trace.usage.completion_tokens


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: first.
        b: second.
    """
    return a + b


async def test_a_tool_call_turn_and_its_result_are_accepted_by_the_chat_template(client):
    call = ToolCall(id="call_1", name="add", arguments='{"a": 2, "b": 3}')
    messages = [user("What is 2 + 3? Use the add tool."), assistant(None, [call]), tool("5", "call_1", "add")]
    request = ModelRequest(messages=messages, tools=[Tool.from_function(add).spec],
                           sampling=tg.Sampling(max_tokens=32, temperature=0.0))
    response = await client.complete(request)  # a template that cannot render content None answers HTTP 400
    assert response.message.text.strip() or response.message.tool_calls


def test_sigterm_to_the_inference_command_leaves_no_process_behind(inference):
    proc, _ = inference
    family = descendants(proc.pid)
    assert family, "the command started no server process"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 0
    deadline = time.monotonic() + 30
    while any(process_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [p for p in family if process_alive(p)] == []

