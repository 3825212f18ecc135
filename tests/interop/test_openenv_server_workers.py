"""Our OpenEnv server runs each session's rollouts in env-server worker processes: task code that ends its process
(a poison task's `os._exit`) costs its own session only; the sessions that shared the dead worker finish their
episodes without noticing the rerun (their earlier turns are replayed), and new sessions are served. A multi-agent
taskset is served one seat at a time, the other seats played by the configured opponent endpoint, or refused."""

import asyncio
import re

import pytest
from openenv.core.generic_client import GenericEnvClient

from tracegym import Endpoint
from tracegym.core.errors import UsageError
from tracegym.envs.registry import load_taskset
from tracegym.interop.openenv_server import OpenEnvServer
from tracegym.testing.echo import SPEC, Echo
from tracegym.testing.fake_server import FakeOpenAIServer

POISON = {"turns": 3, "poison_task": "echo-5"}


def word(result):
    return result.observation["messages"][-1]["content"].removeprefix("Say ").removesuffix(".")


async def episode_with_poison_alongside(url):
    """Four sessions each one step into a 3-turn episode, then a session resets the poison task (its worker
    dies); the four then play their episodes out."""
    clients = [GenericEnvClient(base_url=url, message_timeout_s=120) for _ in range(4)]
    words = []
    for index, client in enumerate(clients):
        words.append(word(await client.reset(index=index)))
        await client.step({"message": words[-1]})
    with pytest.raises(RuntimeError, match=r"EXECUTION_ERROR") as poisoned:
        await GenericEnvClient(base_url=url, message_timeout_s=120).reset(index=5)
    finals = []
    for client, said in zip(clients, words, strict=True):
        second = await client.step({"message": said})
        finals.append((second.done, await client.step({"message": said})))
        await client.close()
    after = GenericEnvClient(base_url=url, message_timeout_s=120)
    fresh = await after.reset(index=7)
    last = await after.step({"message": word(fresh)})
    await after.close()
    return str(poisoned.value), finals, last


@pytest.mark.slow
def test_a_poison_task_costs_its_own_session_and_the_sessions_sharing_its_worker_finish():
    server = OpenEnvServer(Echo(POISON), source=(SPEC, POISON), workers=1)
    with server.running() as url:
        poisoned, finals, last = asyncio.run(episode_with_poison_alongside(url))
    assert "worker died" in poisoned
    assert [done for done, _ in finals] == [False] * 4
    assert [(final.done, final.reward) for _, final in finals] == [(True, 1.0)] * 4
    assert not last.done  # a new session after the poison one is served as usual


@pytest.mark.slow
def test_a_poison_task_killing_its_worker_leaves_the_sessions_on_other_workers_alone_and_the_worker_is_replaced():
    options = {"turns": 2, "poison_task": "echo-5", "poison_how": "kill"}
    server = OpenEnvServer(Echo(options), source=(SPEC, options), workers=2)
    with server.running() as url:
        first_pids = [link.process.pid for link in server.workers.links]

        async def play():
            here, there = (GenericEnvClient(base_url=url, message_timeout_s=120) for _ in range(2))
            said = [word(await here.reset(index=0)), word(await there.reset(index=1))]  # one on each worker
            with pytest.raises(RuntimeError, match=r"EXECUTION_ERROR") as poisoned:  # on `here`'s worker
                await GenericEnvClient(base_url=url, message_timeout_s=120).reset(index=5)
            finals = [await client.step({"message": w}) for client, w in zip([here, there], said, strict=True)]
            finals = [await client.step({"message": w}) for client, w in zip([here, there], said, strict=True)]
            await here.close()
            await there.close()
            return str(poisoned.value), finals
        poisoned, finals = asyncio.run(play())
        pids, deaths = [link.process.pid for link in server.workers.links], server.workers.deaths
    assert "signal SIGKILL" in poisoned
    assert [(final.done, final.reward) for final in finals] == [(True, 1.0)] * 2
    assert deaths == 2 and pids[1] == first_pids[1] and pids[0] not in first_pids  # the other worker never died


def test_a_sessions_frames_are_answered_in_a_worker_process():
    taskset = load_taskset("tool-calculator")
    row = taskset[0]
    server = OpenEnvServer(taskset, workers=1)
    with server.running() as url:
        async def play():
            async with GenericEnvClient(base_url=url, message_timeout_s=120) as client:
                await client.reset(index=0)
                tooled = await client.step({"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]})
                return tooled, await client.step({"message": f"The answer is {row.answer}"})
        tooled, answered = asyncio.run(play())
        asked = [link.asked for link in server.workers.links]
    assert asked == [4]  # the reset, both steps and the client's `close` were answered by the worker
    assert tooled.observation["messages"][0]["content"] == "5.0" and answered.reward == 1.0
    assert answered.observation["metrics"]["tool_calls"] == 1


def first_free_cell(text):
    """A tic-tac-toe policy: the first free cell on the last board shown."""
    board = text.rsplit("Board:", 1)[-1].split("You are")[0]
    return re.findall(r"[1-9]", board)[0]


def test_a_multi_agent_taskset_is_served_one_seat_with_the_others_played_by_the_opponent():
    taskset = load_taskset("tictactoe", {"max_opening": 0})
    with FakeOpenAIServer(rule=lambda request: first_free_cell(request.messages[-1].text)) as opponent:
        endpoint = Endpoint(base_url=opponent.base_url, model="fake-model", api_key_env=None, max_retries=0)
        server = OpenEnvServer(taskset, workers=1, seat="player_x", opponent=endpoint)
        with server.running() as url:
            async def play():
                async with GenericEnvClient(base_url=url, message_timeout_s=120) as env:
                    result = await env.reset(index=0)
                    moves = 0
                    while not result.done:
                        result = await env.step({"message": first_free_cell(result.observation["text"])})
                        moves += 1
                    return result, moves
            result, moves = asyncio.run(play())
        opponent_moves = len(opponent.requests)
    # both take the first free cell: X 1, O 2, X 3, O 4, X 5, O 6, X 7 (the 3-5-7 diagonal) wins on X's 4th move
    assert moves == 4 and opponent_moves == 3
    assert result.reward == 1.0 and result.observation["rewards"]["payoff"] == 1.0


def test_a_multi_agent_taskset_without_a_seat_and_opponent_is_refused_naming_its_seats():
    with pytest.raises(UsageError, match=r"multi-agent \(seats: player_x, player_o\).*--openenv.seat"):
        OpenEnvServer(load_taskset("tictactoe"))


def test_a_server_with_workers_runs_on_uvloop_and_one_running_tasks_itself_on_asyncios_loop():
    uvloop = pytest.importorskip("uvloop")
    taskset = load_taskset("reverse-text")
    assert OpenEnvServer(taskset, workers=1).loop_factory() is uvloop.new_event_loop
    assert OpenEnvServer(taskset, workers=0).loop_factory() is None  # a task's sandbox needs asyncio's subprocesses
