"""OpenEnv servers as tasksets, against real reference servers (openenv's `create_app` under uvicorn on loopback):
a typed-action game and an MCP echo environment, every rollout an ordinary trace with exact tokens; refused actions
reach the model as tool errors; a full server and a dropped connection are infrastructure errors."""

import asyncio
import json
import re
import socket

import pytest
from openenv_reference import GUESSES, bisect, echo_server, guess_server, target_of

from tracegym import load_taskset, run_rollout
from tracegym.core.errors import ErrorKind, UsageError
from tracegym.core.messages import assistant
from tracegym.core.token_check import validate_tokens
from tracegym.envs.rollout import rollout
from tracegym.interop.openenv_connection import OpenEnvConnection
from tracegym.interop.openenv_taskset import OpenEnvTaskset
from tracegym.testing import ScriptedModel, Stall, reply, tool_call


@pytest.fixture(scope="module")
def guess_url():
    with guess_server() as url:
        yield url


@pytest.fixture(scope="module")
def echo_url():
    with echo_server() as url:
        yield url


def test_an_openenv_game_runs_as_a_taskset_id_with_its_action_schema_as_the_tool(guess_url):
    taskset = load_taskset(f"openenv:{guess_url}", {"num_tasks": 3, "seed": 5, "max_turns": GUESSES + 1})
    assert taskset.id == f"openenv:{guess_url}" and len(taskset) == 3
    model = ScriptedModel(rule=bisect, tokens=True)
    traces = [asyncio.run(run_rollout(taskset, row, model)) for row in taskset]
    for index, trace in enumerate(traces):
        assert trace.ok and trace.reward == 1.0 and trace.metrics["env_done"] == 1.0, trace.errors
        assert trace.stop_reason == "stop_condition" and trace.stopped_by == "said_done"
        guesses = [json.loads(m.tool_calls[0].arguments)["guess"] for m in trace.messages if m.tool_calls]
        assert guesses[-1] == target_of(5 + index) and trace.metrics["env_steps"] == len(guesses)
        assert "I am thinking of a number" in trace.prompt[-1].text  # the reset's observation is in the prompt
        assert validate_tokens(trace) == [] and all(n.token_ids for n in trace.graph.nodes if n.sampled)
    tools = model.requests[0].tools
    assert [t.name for t in tools] == ["act"]
    assert tools[0].parameters["properties"]["guess"] == {"type": "integer", "minimum": 1, "maximum": 100,
                                                          "description": "Your guess, from 1 to 100."}


def test_a_schema_invalid_action_goes_back_to_the_model_as_a_tool_error(guess_url):
    taskset = OpenEnvTaskset({"url": guess_url, "num_tasks": 1, "max_turns": 3})
    model = ScriptedModel([reply(None, tool_call("act", {"guess": 1000})), reply(None, tool_call("act", {"guess": 50})),
                           "stop"])
    trace = asyncio.run(run_rollout(taskset, taskset[0], model))
    refused, answered = [m.text for m in trace.messages if m.role == "tool"]
    assert refused.startswith("Error: ToolError: Invalid message: guess: Input should be less than or equal to 100")
    assert json.loads(answered)["feedback"] in ("higher", "lower", "correct")
    assert trace.ended_normally and trace.metrics["tool_errors"] == 1 and trace.metrics["env_steps"] == 1
    assert [e.kind for e in trace.errors] == [ErrorKind.TOOL]


def test_mcp_tools_are_offered_and_their_steps_give_the_reward(echo_url):
    taskset = OpenEnvTaskset({"url": echo_url, "num_tasks": 1})
    model = ScriptedModel([reply(None, tool_call("echo_message", {"message": "hello"})),
                           reply(None, tool_call("echo_message", {"mesage": "typo"})), "done"], tokens=True)
    trace = asyncio.run(run_rollout(taskset, taskset[0], model))
    assert [t.name for t in model.requests[0].tools] == ["echo_message"]
    echoed, refused = [m.text for m in trace.messages if m.role == "tool"]
    assert echoed == "hello" and refused.startswith("Error: ToolError:") and "message" in refused
    assert trace.ok and trace.reward == pytest.approx(0.5) and trace.stop_reason == "completed"
    assert validate_tokens(trace) == []


def test_a_full_server_is_waited_for_within_capacity_wait_then_an_infrastructure_error():
    async def scenario(url):
        holder = OpenEnvConnection(url)
        await holder.open(seed=1)  # takes the only session
        refused = await run_rollout(OpenEnvTaskset({"url": url, "retries": 1, "backoff": 0.01, "capacity_wait": 0}),
                                    _row(url), _echo(), infra_retries=0)

        async def release():
            await asyncio.sleep(0.3)
            await holder.close()

        waited = asyncio.gather(run_rollout(OpenEnvTaskset({"url": url, "retries": 0, "backoff": 0.05}), _row(url),
                                            _echo(), infra_retries=0), release())  # the capacity wait, no retry
        return refused, (await waited)[0]

    with echo_server(max_concurrent_envs=1) as url:
        refused, served = asyncio.run(scenario(url))
    assert refused.failure == "env_unavailable" and refused.errors[0].stage == "setup"
    assert "CAPACITY_REACHED" in refused.errors[0].message and "gave up after 2 attempts" in refused.errors[0].message
    assert served.ok and served.reward == pytest.approx(0.2)


def test_a_connection_dropped_mid_episode_ends_the_rollout_as_an_infrastructure_error():
    with guess_server() as url:
        taskset = OpenEnvTaskset({"url": url, "num_tasks": 1, "retries": 0})
        stopped = {}

        def stop_the_server(request):
            stopped["now"] = True  # the test's `with` block ends: the server goes away before the next guess
            return Stall(0.5, reply(None, tool_call("act", {"guess": 50})))

        model = ScriptedModel([reply(None, tool_call("act", {"guess": 10})), stop_the_server, "done"])

        async def play():
            task = taskset.task(taskset[0])
            running = asyncio.create_task(rollout(task, model))
            while "now" not in stopped:
                await asyncio.sleep(0.01)
            return running

        loop = asyncio.new_event_loop()
        running = loop.run_until_complete(play())
    trace = loop.run_until_complete(running)
    loop.close()
    assert trace.failure == "env_unavailable" and trace.stop_reason == "error"
    assert [(e.kind, e.stage) for e in trace.errors] == [(ErrorKind.INFRASTRUCTURE, "stop:said_done")]
    assert "step failed" in trace.errors[0].message and trace.rewards["env_reward"].score is None


def test_an_id_and_its_url_option_must_agree():
    with pytest.raises(UsageError, match="differs from the id's"):
        load_taskset("openenv:ws://127.0.0.1:1", {"url": "ws://127.0.0.1:2"})
    with pytest.raises(UsageError, match="field 'url' is required"):
        OpenEnvTaskset()


def test_a_server_that_does_not_answer_is_named_before_the_first_task(unused_port):
    url = f"ws://127.0.0.1:{unused_port}"
    with pytest.raises(UsageError, match=rf"OpenEnv server {url} does not answer \(GET /health"):
        OpenEnvTaskset({"url": url})[0]


@pytest.fixture
def unused_port():
    with socket.socket() as sock:  # bound and closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _row(url):
    return OpenEnvTaskset({"url": url})[0]


def _echo():
    return ScriptedModel([reply(None, tool_call("echo_message", {"message": "hi"})), assistant("ok")])


def test_tool_result_content_reads_mcp_content_parts():
    from tracegym.interop.openenv_taskset import tool_result_content
    assert tool_result_content({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == "ab"
    assert tool_result_content({"data": 3}) == "3" and tool_result_content("x") == "x"
    with pytest.raises(Exception, match="boom"):
        tool_result_content({"content": [{"type": "text", "text": "boom"}], "isError": True})
    assert re.fullmatch(r"\d+", tool_result_content(7))


def test_an_mcp_image_block_becomes_an_image_part_beside_the_text():
    from tracegym.core.messages import ImagePart, TextPart
    from tracegym.interop.openenv_taskset import tool_result_content
    result = {"content": [{"type": "text", "text": "the board:"},
                          {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]}
    assert tool_result_content(result) == [TextPart(text="the board:"),
                                           ImagePart(image_url={"url": "data:image/png;base64,iVBORw0KGgo="})]


def test_a_tracegym_taskset_served_over_openenv_runs_back_as_an_openenv_taskset():
    """Both directions at once: reverse-text (a chat: the reply is the action) and tool-calculator (MCP tools, then
    the answer as the action) on our OpenEnv server, evaluated through `openenv:URL` with the scores it gives."""
    from tracegym.interop.openenv_server import OpenEnvServer

    def reverse(request):
        return request.messages[-1].text.splitlines()[-1][::-1]

    answer = float(load_taskset("tool-calculator")[0].answer)

    def calculate(request):
        if request.messages[-1].role == "tool":
            return f"The answer is {request.messages[-1].text}"
        return reply(None, tool_call("multiply", {"a": answer, "b": 1}))

    options = {"text_action": "message", "observation_field": "text", "instructions": "", "num_tasks": 2}
    with OpenEnvServer(load_taskset("reverse-text")).running() as url:
        chat = OpenEnvTaskset({"url": url, **options, "reset_args": {"index": 4}})
        chats = [asyncio.run(run_rollout(chat, row, ScriptedModel(rule=reverse))) for row in chat]
    with OpenEnvServer(load_taskset("tool-calculator")).running() as url:
        tools = OpenEnvTaskset({"url": url, **options, "reset_args": {"index": 0}})
        model = ScriptedModel(rule=calculate)
        calc = asyncio.run(run_rollout(tools, tools[0], model))
    assert [t.reward for t in chats] == [1.0, 1.0] and chats[0].prompt[-1].text.endswith(
        load_taskset("reverse-text")[4].prompt)
    assert [t.name for t in model.requests[0].tools] == ["add", "subtract", "multiply", "divide"]
    assert [m.text for m in calc.messages if m.role == "tool"] == [str(answer)]
    assert calc.ok and calc.reward == 1.0 and calc.metrics["env_done"] == 1.0
    assert calc.metrics["env_steps"] == 2  # the tool call (over MCP) and the answer


def test_rescoring_a_stored_trace_says_the_reward_was_the_servers_instead_of_scoring_zero(guess_url):
    from tracegym.envs.rollout import Timeouts
    from tracegym.eval.rescore import rescore_trace

    taskset = OpenEnvTaskset({"url": guess_url, "num_tasks": 1, "max_turns": GUESSES + 1})
    trace = asyncio.run(run_rollout(taskset, taskset[0], ScriptedModel(rule=bisect)))
    assert trace.reward == 1.0
    again = asyncio.run(rescore_trace(taskset, trace, Timeouts()))
    assert again.rewards["env_reward"].score is None and again.reward is None
    assert "cannot be rescored" in again.errors[-1].message


def test_a_server_behind_a_secret_is_reached_with_the_token_named_by_token_env(monkeypatch):
    from tracegym.interop.openenv_server import OpenEnvServer

    secret = "t" * 24
    monkeypatch.setenv("MY_OPENENV_TOKEN", secret)
    options = {"text_action": "message", "observation_field": "text", "num_tasks": 1, "retries": 0}
    with OpenEnvServer(load_taskset("reverse-text"), secret=secret).running() as url:
        allowed = OpenEnvTaskset({"url": url, **options, "token_env": "MY_OPENENV_TOKEN"})
        served = asyncio.run(run_rollout(allowed, allowed[0], ScriptedModel(["x"]), infra_retries=0))
        with pytest.raises(UsageError, match=rf"OpenEnv server {url}: GET /schema failed .*401 Unauthorized"):
            OpenEnvTaskset({"url": url, **options})[0]  # refused before the first rollout, naming the server
        with pytest.raises(UsageError, match="MY_OTHER_TOKEN"):
            asyncio.run(OpenEnvTaskset({"url": url, "token_env": "MY_OTHER_TOKEN"}).task(allowed[0]).setup())
    assert served.ok and served.reward is not None
