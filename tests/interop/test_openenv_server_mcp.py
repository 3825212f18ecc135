"""MCP on our OpenEnv server, as OpenEnv's own clients and our OpenEnv taskset drive it: a `tools/call` turn that
ends the episode says `done` and the reward (in the JSON-RPC result, and as a CallToolObservation step, as
openenv's servers answer one), every `tools/call` is a step the client counts, and a tool's image travels as an
MCP image block (one given by URL is refused, naming the tool)."""

import asyncio
import base64
import json

import httpx
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.mcp_client import MCPToolClient

from tracegym import run_rollout
from tracegym.core.image_ref import data_uri
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.scorers import reward, stop
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset, TasksetConfig
from tracegym.interop.openenv_server import OpenEnvServer
from tracegym.interop.openenv_taskset import OpenEnvTaskset
from tracegym.testing import ScriptedModel, reply, tool_call
from tracegym.testing.images import png

RED = png((255, 0, 0))


def submit(answer: int) -> str:
    """Submit the final answer; the episode ends.

    Args:
        answer: The answer.
    """
    return f"submitted {answer}"


def note(text: str) -> str:
    """Write a note; the episode goes on.

    Args:
        text: The note.
    """
    return f"noted: {text}"


def look() -> list:
    """Look at the picture."""
    return [{"type": "image_url", "image_url": {"url": data_uri("image/png", RED)}},
            {"type": "text", "text": "a red square"}]


def look_far() -> list:
    """Look at a picture elsewhere."""
    return [{"type": "image_url", "image_url": {"url": "https://example.com/red.png"}}]


class SubmitTask(Task[TaskData, TasksetConfig]):
    """Answer by calling `submit`, which ends the episode."""

    tools = (submit, note, look, look_far)

    @stop
    def submitted(self, trace: Trace) -> bool:
        return any(call.name == "submit" for m in trace.messages for call in m.tool_calls)

    @reward
    def correct(self, trace: Trace) -> float:
        calls = [c for m in trace.messages for c in m.tool_calls if c.name == "submit"]
        return float(bool(calls) and json.loads(calls[-1].arguments).get("answer") == self.data.answer)


class Submit(Taskset[TasksetConfig]):
    id = "submit-test"
    task_class = SubmitTask

    def load(self):
        yield TaskData(id="six-times-seven", prompt="What is 6 x 7? Submit it.", answer=42)


def rpc(url, method, params, request_id=1):
    body = {"jsonrpc": "2.0", "method": method, "params": params, "id": request_id}
    return httpx.post(url.replace("ws://", "http://") + "/mcp", json=body, timeout=30).json()


def test_a_tool_call_that_ends_the_episode_says_done_and_the_reward_in_its_json_rpc_result():
    with OpenEnvServer(Submit(), workers=0).running() as url:
        async def play():
            async with MCPToolClient(base_url=url.replace("ws://", "http://")) as env:
                await env.reset(index=0)
                session = env._production_session_id
                noted = rpc(url, "tools/call", {"name": "note", "arguments": {"text": "hm"}, "session_id": session})
                said = rpc(url, "tools/call", {"name": "submit", "arguments": {"answer": 42}, "session_id": session})
            return noted["result"], said["result"]
        noted, said = asyncio.run(play())
    assert (noted["done"], noted["reward"], noted["data"]) == (False, None, "noted: hm")
    assert (said["done"], said["reward"], said["data"]) == (True, 1.0, "submitted 42")
    assert said["metadata"]["stop_reason"] == "stop_condition" and said["metadata"]["rewards"] == {"correct": 1.0}


def test_openenvs_mcp_tool_client_steps_a_call_tool_action_and_reads_done_from_it():
    with OpenEnvServer(Submit(), workers=0).running() as url:
        async def play():
            async with MCPToolClient(base_url=url.replace("ws://", "http://")) as env:
                await env.reset(index=0)
                tools = await env.list_tools()
                first = await env.step(CallToolAction(tool_name="note", arguments={"text": "hm"}))
                last = await env.step(CallToolAction(tool_name="submit", arguments={"answer": 41}))
            return tools, first, last
        tools, first, last = asyncio.run(play())
    assert [t.name for t in tools] == ["submit", "note", "look", "look_far"]
    assert isinstance(first.observation, CallToolObservation) and not first.done
    assert first.observation.result["data"] == "noted: hm"
    assert isinstance(last.observation, CallToolObservation) and last.done and last.reward == 0.0
    assert last.observation.result["content"] == [{"type": "text", "text": "submitted 41"}]


def test_mcp_tool_calls_count_as_env_steps_and_a_stop_they_reach_ends_the_clients_rollout():
    model = ScriptedModel([reply(None, tool_call("note", {"text": "thinking"})),
                           reply(None, tool_call("submit", {"answer": 42})), "never asked"])
    with OpenEnvServer(Submit(), workers=0).running() as url:
        taskset = OpenEnvTaskset({"url": url, "num_tasks": 1, "reset_args": {"index": 0}})
        trace = asyncio.run(run_rollout(taskset, taskset[0], model))
    assert trace.ok and trace.reward == 1.0, trace.errors
    assert trace.metrics["env_steps"] == 2.0 and trace.metrics["env_done"] == 1.0
    assert trace.stopped_by == "said_done" and len(model.requests) == 2


def call_in_a_session(tool: str) -> dict:
    """`tools/call` of `tool` in a session openenv's own MCP client opened (and reset) on a fresh server."""
    with OpenEnvServer(Submit(), workers=0).running() as url:
        async def play():
            async with MCPToolClient(base_url=url.replace("ws://", "http://")) as env:
                await env.reset(index=0)
                session = env._production_session_id
                return rpc(url, "tools/call", {"name": tool, "arguments": {}, "session_id": session})
        return asyncio.run(play())


def test_a_tools_image_reaches_an_mcp_client_as_an_image_block():
    said = call_in_a_session("look")
    image, text = said["result"]["content"]
    assert image["type"] == "image" and image["mimeType"] == "image/png"
    assert base64.b64decode(image["data"]) == RED and text == {"type": "text", "text": "a red square"}


def test_a_tools_image_given_by_url_is_refused_naming_the_tool_not_dropped():
    said = call_in_a_session("look_far")
    assert "tool 'look_far'" in said["error"]["message"] and "https://example.com/red.png" in said["error"]["message"]


def test_a_tools_image_reaches_a_websocket_client_in_the_steps_messages():
    from openenv.core.generic_client import GenericEnvClient

    with OpenEnvServer(Submit(), workers=0).running() as url:
        async def play():
            async with GenericEnvClient(base_url=url) as env:
                await env.reset(index=0)
                return await env.step({"tool_calls": [{"name": "look", "arguments": {}}]})
        result = asyncio.run(play())
    [message] = result.observation["messages"]
    image, text = message["content"]
    assert image == {"type": "image_url", "image_url": {"url": data_uri("image/png", RED)}}
    assert text["text"] == "a red square" and result.observation["text"] == "a red square"
