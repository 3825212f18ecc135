"""tracegym tasksets served over OpenEnv, driven by the `openenv` package's own client: single-turn, multi-turn,
tool and class-based tasksets; tasks by index, seed or key; isolated concurrent sessions, capacity and idle timeout;
MCP `tools/list` and `tools/call`; the HTTP routes; and a TRL-style environment class wrapping that client. The tool
and MCP tests run their rollouts in a worker process (the default), the others in the server's (`workers=0`)."""

import asyncio
import json

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from websockets.asyncio.client import connect

from tracegym import load_taskset
from tracegym.envs.registry import load_taskset as registry_load
from tracegym.interop.openenv_server import OpenEnvServer


@pytest.fixture(scope="module")
def reverse_url():
    with OpenEnvServer(load_taskset("reverse-text"), max_concurrent_envs=64, workers=0).running() as url:
        yield url


def play(url, *steps, **reset):
    """Reset with `reset`, then take each step; every result (openenv's StepResult)."""
    async def run():
        async with GenericEnvClient(base_url=url) as client:
            results = [await client.reset(**reset)]
            for step in steps:
                results.append(await client.step(step(results[-1]) if callable(step) else step))
            return results
    return asyncio.run(run())


def reversed_prompt(result):
    return {"message": result.observation["messages"][-1]["content"][::-1]}


def test_a_single_turn_taskset_plays_with_openenvs_own_client(reverse_url):
    reset, answered = play(reverse_url, reversed_prompt, index=3)
    row = load_taskset("reverse-text")[3]
    assert reset.observation["task"] == row.key and not reset.done and reset.reward is None
    assert [m["role"] for m in reset.observation["messages"]] == ["system", "user"]
    assert reset.observation["text"].endswith(row.prompt) and reset.observation["tools"] == []
    assert answered.done and answered.reward == 1.0 and answered.observation["stop_reason"] == "completed"
    assert answered.observation["rewards"] == {"lcs": 1.0}


def test_reset_picks_a_task_by_index_seed_or_key_and_refuses_an_unknown_one(reverse_url):
    taskset = load_taskset("reverse-text")
    by_key = play(reverse_url, key=taskset[5].key)[0]
    by_seed = [play(reverse_url, seed=11)[0].observation["task"] for _ in range(2)]
    assert by_key.observation["task"] == taskset[5].key and by_seed[0] == by_seed[1]
    with pytest.raises(RuntimeError, match=r"no task with key 'nope'.*EXECUTION_ERROR"):
        play(reverse_url, key="nope")
    with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
        play(reverse_url, indx=1)


def test_a_multi_turn_taskset_answers_each_move_until_it_ends():
    word = registry_load("wordle")[0].answer
    assert "q" not in word
    with OpenEnvServer(registry_load("wordle"), workers=0).running() as url:
        results = play(url, {"message": "<guess>qqqqq</guess>"}, {"message": f"<guess>{word}</guess>"}, index=0)
    _, wrong, right = results
    assert not wrong.done and wrong.observation["text"] == "QQQQQ: X X X X X\n5 guesses left."
    assert [m["role"] for m in wrong.observation["messages"]] == ["user"]
    assert right.done and right.reward == 1.0 and right.observation["stop_reason"] == "stop_condition"


def test_tool_calls_run_the_tasks_tools_and_the_answer_is_scored():
    taskset = registry_load("tool-calculator")
    row = taskset[0]
    with OpenEnvServer(taskset).running() as url:
        reset, tooled, answered = play(
            url, {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}},
                                 {"name": "divide", "arguments": '{"a": 1, "b": 0}'}]},
            {"message": f"The answer is {row.answer}"}, index=0)
    assert {t["function"]["name"] for t in reset.observation["tools"]} == {"add", "subtract", "multiply", "divide"}
    results = [m for m in tooled.observation["messages"] if m["role"] == "tool"]
    assert results[0]["content"] == "5.0" and results[1]["content"].startswith("Error: ")
    assert not tooled.done and answered.done and answered.reward == 1.0
    assert answered.observation["metrics"]["tool_errors"] == 1


def test_a_class_based_environment_is_stepped_through_its_methods():
    taskset = registry_load("counter-env", {"max_step": 100})
    row = taskset[0]
    move = "increment" if row.target > row.start else "decrement"
    with OpenEnvServer(taskset, workers=0).running() as url:
        reset, moved, done = play(
            url, {"tool_calls": [{"name": move, "arguments": {"amount": abs(row.target - row.start)}}]},
            {"message": "done"}, key=row.key)
    assert f"starts at {row.start}" in reset.observation["text"]
    assert moved.observation["messages"][0]["content"] == f"The counter is now {row.target}."
    assert done.done and done.reward == 1.0


def test_concurrent_sessions_are_isolated(reverse_url):
    taskset = load_taskset("reverse-text")

    async def one(index):
        async with GenericEnvClient(base_url=reverse_url) as client:
            reset = await client.reset(index=index)
            await asyncio.sleep(0.01 * (index % 3))
            prompt = reset.observation["messages"][-1]["content"]
            done = await client.step({"message": prompt[::-1] if index % 2 else "wrong"})
            return reset.observation["task"], done.reward

    async def many():
        return await asyncio.gather(*(one(i) for i in range(40)))

    results = asyncio.run(many())
    assert [key for key, _ in results] == [taskset[i].key for i in range(40)]
    assert [reward == 1.0 for _, reward in results] == [bool(i % 2) for i in range(40)]


def test_past_max_concurrent_envs_a_session_gets_capacity_reached_and_others_go_on():
    server = OpenEnvServer(load_taskset("reverse-text"), max_concurrent_envs=2, workers=0)
    with server.running() as url:
        async def scenario():
            held = [GenericEnvClient(base_url=url) for _ in range(2)]
            for client in held:
                await client.reset()
            with pytest.raises(RuntimeError, match=r"at capacity: 2/2.*CAPACITY_REACHED"):
                await GenericEnvClient(base_url=url).reset()
            answer = await held[0].step({"message": "x"})
            await held[1].close()
            await asyncio.sleep(0.05)
            freed = await GenericEnvClient(base_url=url).reset()
            await held[0].close()
            return answer, freed

        answer, freed = asyncio.run(scenario())
    assert answer.done and freed.observation["task"]


def test_an_idle_session_times_out_with_a_session_error_and_is_closed():
    with OpenEnvServer(load_taskset("reverse-text"), session_timeout=0.3, workers=0).running() as url:
        async def idle():
            async with connect(f"{url}/ws") as ws:
                await ws.send(json.dumps({"type": "reset", "data": {}}))
                await ws.recv()
                said = json.loads(await asyncio.wait_for(ws.recv(), 2))
                await asyncio.wait_for(ws.wait_closed(), 2)
            client = GenericEnvClient(base_url=url)  # openenv's client reconnects to a fresh session after a close
            await client.reset()
            await asyncio.sleep(0.6)
            with pytest.raises(RuntimeError, match="no episode: send `reset` first"):
                await client.step({"message": "late"})
            return said
        said = asyncio.run(idle())
    assert said == {"type": "error", "data": {"message": "session idle for more than 0.3 s: closed",
                                              "code": "SESSION_ERROR"}}


def test_a_session_that_keeps_talking_outlives_its_idle_timeout_many_times_over():
    with OpenEnvServer(load_taskset("reverse-text"), session_timeout=1.0, workers=0).running() as url:
        async def chatty():
            async with connect(f"{url}/ws") as ws:
                kinds = []
                for _ in range(10):  # 1.5 s in all, never 1 s quiet
                    await ws.send(json.dumps({"type": "state"}))
                    kinds.append(json.loads(await ws.recv())["type"])
                    await asyncio.sleep(0.15)  # (a client's pause: nothing to wait on)
                return kinds
        kinds = asyncio.run(chatty())
    assert kinds == ["state"] * 10


def test_mcp_lists_and_calls_the_tasks_tools_over_the_websocket():
    row = registry_load("counter-env")[0]
    with OpenEnvServer(registry_load("counter-env")).running() as url:
        async def session():
            async with connect(f"{url}/ws") as ws:
                async def send(frame):
                    await ws.send(json.dumps(frame))
                    return json.loads(await ws.recv())

                def rpc(method, params=None):
                    return {"type": "mcp",
                            "data": {"jsonrpc": "2.0", "id": 7, "method": method, "params": params or {}}}

                listed = await send(rpc("tools/list"))
                early = await send(rpc("tools/call", {"name": "get_count", "arguments": {}}))
                await send({"type": "reset", "data": {"key": row.key}})
                called = await send(rpc("tools/call", {"name": "increment", "arguments": {"amount": 1}}))
                refused = await send(rpc("tools/call", {"name": "increment", "arguments": {"amount": "x"}}))
                state = await send({"type": "state"})
                return listed, early, called, refused, state

        listed, early, called, refused, state = asyncio.run(session())
    assert sorted(t["name"] for t in listed["data"]["result"]["tools"]) == ["decrement", "get_count", "increment"]
    assert listed["data"]["result"]["tools"][0]["inputSchema"]["type"] == "object"
    assert "reset" in early["data"]["error"]["message"]
    said = f"The counter is now {row.start + 1}."
    assert called["data"]["result"] == {"content": [{"type": "text", "text": said}], "isError": False, "data": said,
                                        "done": False, "reward": None}
    assert called["data"]["id"] == 7 and refused["data"]["result"]["isError"] is True
    assert state["data"]["step_count"] == 2 and state["data"]["task"] == row.key and not state["data"]["done"]


def test_the_http_routes_answer_as_openenvs_do(reverse_url):
    http = reverse_url.replace("ws://", "http://")
    with httpx.Client(base_url=http) as client:
        assert client.get("/health").json() == {"status": "healthy"}
        schema = client.get("/schema").json()
        assert {"message", "tool_calls"} <= set(schema["action"]["properties"]) and "text" in schema["observation"][
            "properties"]
        reset = client.post("/reset", json={"index": 2}).json()
        assert reset["observation"]["task"] == load_taskset("reverse-text")[2].key and reset["done"] is False
        assert client.post("/step", json={"action": {"message": "x"}}).status_code == 409
        assert client.post("/step", json={"action": {"nonsense": 1}}).status_code == 422
        assert client.get("/metadata").json()["name"] == "reverse-text"
        tools = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).json()
        assert tools["result"] == {"tools": []}


class ReverseTextEnv:
    """A TRL `environment_factory` class over an OpenEnv server, in the shape TRL's OpenEnv docs teach: a client made
    in `__init__`, `reset(**row)` returning the observation, a tool that steps, the reward kept for `reward_func`."""

    url = ""

    def __init__(self):
        self.client = GenericEnvClient(base_url=self.url).sync()
        self.reward = 0.0
        self.done = False

    def reset(self, **kwargs) -> str | None:
        result = self.client.reset(key=kwargs["id"])
        self.reward, self.done = 0.0, False
        return result.observation["text"]

    def answer(self, text: str) -> str:
        """
        Give the final answer.

        Args:
            text: The reversed text.

        Returns:
            What the environment says back.
        """
        if self.done:
            raise ValueError("Game over.")
        result = self.client.step({"message": text})
        self.reward, self.done = result.reward or 0.0, result.done
        return result.observation["text"] or "ok"


def reward_func(environments, **kwargs) -> list[float]:
    return [env.reward for env in environments]


def test_a_trl_style_environment_class_wrapping_openenvs_client_plays_and_is_rewarded(reverse_url):
    from transformers.utils import get_json_schema

    ReverseTextEnv.url = reverse_url
    rows = [{"id": row.key, "prompt": row.prompt} for row in load_taskset("reverse-text").head(3)]
    environments = [ReverseTextEnv() for _ in rows]
    try:
        for env, row in zip(environments, rows, strict=True):
            observation = env.reset(**row)
            assert row["prompt"] in observation
            env.answer(row["prompt"][::-1] if row is not rows[1] else "wrong")
        with pytest.raises(ValueError, match="Game over"):
            environments[0].answer("again")
        assert reward_func(environments) == [1.0, pytest.approx(reward_func(environments)[1]), 1.0]
        assert reward_func(environments)[1] < 1.0
        assert get_json_schema(ReverseTextEnv.answer)["function"]["parameters"]["required"] == ["text"]
    finally:
        for env in environments:
            env.client.close()


def test_a_taskset_as_an_openenv_environment_runs_on_openenvs_own_create_app():
    from openenv.core.env_server.http_server import create_app

    from tracegym.interop.openenv_environment import TasksetEnvironment
    from tracegym.interop.openenv_protocol import TasksetAction, TasksetObservation, TasksetState
    from tracegym.interop.openenv_server import serving

    taskset = registry_load("tool-calculator")
    app = create_app(TasksetEnvironment.of(taskset), TasksetAction, TasksetObservation, max_concurrent_envs=4,
                     state_cls=TasksetState)
    with serving(app) as url:
        reset, tooled, answered = play(url, {"tool_calls": [{"name": "multiply", "arguments": {"a": 6, "b": 7}}]},
                                       {"message": f"It is {taskset[1].answer}"}, index=1)
        with httpx.Client(base_url=url.replace("ws://", "http://")) as client:
            assert client.get("/metadata").json()["name"] == "tool-calculator"
    assert reset.observation["task"] == taskset[1].key and len(reset.observation["tools"]) == 4
    assert tooled.observation["messages"][0]["content"] == "42.0"
    assert answered.done and answered.reward == 1.0


def test_a_taskset_environments_rubric_names_its_rewards_and_scores_the_episode():
    from tracegym.interop.openenv_environment import TasksetEnvironment
    from tracegym.interop.openenv_protocol import TasksetAction

    taskset = registry_load("reverse-text", {"num_tasks": 2})
    env = TasksetEnvironment.of(taskset)()

    async def play() -> object:
        await env.reset_async(index=0)
        return await env.step_async(TasksetAction(message=taskset[0].answer))

    done = asyncio.run(play())
    names = [name for name, _ in env.rubric.named_rubrics()]
    assert names == list(done.rewards) and names
    assert [child.last_score for child in env.rubric.children()] == [done.rewards[n] for n in names]
    assert env.rubric.last_score == done.reward
