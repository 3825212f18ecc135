"""Bad input to the OpenEnv server: every kind is answered with OpenEnv's error frames while the session and the
others go on; the slow test hammers `tracegym serve --protocol openenv` with it for 30 s while valid sessions
complete, then checks that no session leaked."""

import asyncio
import json
import random
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tracegym import load_taskset
from tracegym.core.errors import UsageError
from tracegym.interop.openenv_server import OpenEnvServer
from tracegym.serve.local_server import local_server

BAD = [  # (frame, the error code it gets)
    ("not json {", "INVALID_JSON"),
    (b"\xff\xfe\x00garbage", "INVALID_JSON"),
    ("[1, 2]", "VALIDATION_ERROR"),
    ('{"type": "dance"}', "UNKNOWN_TYPE"),
    ('{"data": {}}', "UNKNOWN_TYPE"),
    ('{"type": "step", "data": {"message": "hi"}}', "EXECUTION_ERROR"),  # before any reset
    ('{"type": "reset", "data": {"index": -1}}', "VALIDATION_ERROR"),
    ('{"type": "reset", "data": {"index": 999999}}', "EXECUTION_ERROR"),
    ('{"type": "reset", "data": {}, "extra": 1}', "VALIDATION_ERROR"),
    ('{"type": "step"}', "VALIDATION_ERROR"),
    ('{"type": "mcp", "data": {"method": "tools/list"}}', "VALIDATION_ERROR"),
]
AFTER_RESET = [
    ('{"type": "step", "data": {}}', "VALIDATION_ERROR"),
    ('{"type": "step", "data": {"message": 5}}', "VALIDATION_ERROR"),
    ('{"type": "step", "data": {"tool_calls": [{"arguments": {}}]}}', "VALIDATION_ERROR"),
    ('{"type": "step", "data": {"message": "x", "reward": 1}}', "VALIDATION_ERROR"),
]


async def exchange(ws, frame):
    await ws.send(frame)
    return json.loads(await asyncio.wait_for(ws.recv(), 5))


async def episode(url, index=0):
    """One valid episode of reverse-text on its own session; its reward."""
    async with connect(f"{url}/ws", max_size=None) as ws:
        reset = await exchange(ws, json.dumps({"type": "reset", "data": {"index": index}}))
        prompt = reset["data"]["observation"]["messages"][-1]["content"]
        done = await exchange(ws, json.dumps({"type": "step", "data": {"message": prompt[::-1]}}))
        assert done["data"]["done"], done
        return done["data"]["reward"]


def test_each_kind_of_bad_input_gets_its_error_frame_and_the_session_goes_on():
    with OpenEnvServer(load_taskset("reverse-text"), max_frame_bytes=64 << 10, workers=0).running() as url:
        async def scenario():
            async with connect(f"{url}/ws", max_size=None) as ws:
                answers = [(await exchange(ws, frame))["data"]["code"] for frame, _ in BAD]
                oversized = await exchange(ws, json.dumps({"type": "step", "data": {"message": "x" * (100 << 10)}}))
                between = await episode(url)  # another session meanwhile
                await exchange(ws, json.dumps({"type": "reset", "data": {"index": 1}}))
                answers += [(await exchange(ws, frame))["data"]["code"] for frame, _ in AFTER_RESET]
                prompt = load_taskset("reverse-text")[1].prompt
                done = await exchange(ws, json.dumps({"type": "step", "data": {"message": prompt[::-1]}}))
                after_end = await exchange(ws, json.dumps({"type": "step", "data": {"message": "more"}}))
                await ws.send(json.dumps({"type": "close"}))
                await asyncio.wait_for(ws.wait_closed(), 5)
            return answers, oversized, between, done, after_end

        answers, oversized, between, done, after_end = asyncio.run(scenario())
    assert answers == [code for _, code in BAD + AFTER_RESET]
    assert oversized["data"] == {"message": f"frame of {(100 << 10) + 41} bytes is over this server's limit of "
                                            f"{64 << 10} bytes", "code": "VALIDATION_ERROR"}
    assert between == 1.0 and done["data"]["reward"] == 1.0
    assert after_end["data"]["code"] == "EXECUTION_ERROR" and "episode is over" in after_end["data"]["message"]


def test_a_frame_past_the_socket_limit_closes_only_that_socket():
    with OpenEnvServer(load_taskset("reverse-text"), max_frame_bytes=1024, workers=0).running() as url:
        async def scenario():
            with pytest.raises(ConnectionClosed) as closed:  # on the send, or on the read after it
                async with connect(f"{url}/ws", max_size=None) as ws:
                    await ws.send("x" * (17 << 20))
                    await asyncio.wait_for(ws.recv(), 10)
            return closed.value.rcvd.code, await episode(url)

        code, reward = asyncio.run(scenario())
    assert code == 1009 and reward == 1.0


def test_with_a_secret_only_clients_that_send_it_are_served():
    secret = "s" * 24
    server = OpenEnvServer(load_taskset("reverse-text"), secret=secret, workers=0)
    with server.running() as url:
        async def scenario():
            async with connect(f"{url}/ws") as ws:
                refused = json.loads(await ws.recv())
            async with connect(f"{url}/ws", additional_headers={"Authorization": f"Bearer {secret}"}) as ws:
                served = await exchange(ws, json.dumps({"type": "reset", "data": {}}))
            return refused, served

        refused, served = asyncio.run(scenario())
        http = url.replace("ws://", "http://")
        assert httpx.get(f"{http}/schema").status_code == 401 and httpx.get(f"{http}/health").status_code == 200
    assert refused["data"]["code"] == "SESSION_ERROR" and "unauthorized" in refused["data"]["message"]
    assert served["type"] == "observation"
    with pytest.raises(UsageError, match="needs a shared secret"):
        OpenEnvServer(load_taskset("reverse-text")).bind("0.0.0.0", 0)


# --- the 30 s hammer ------------------------------------------------------------------------------------------
MAX_SESSIONS = 32
HAMMERS = 12
VALID = 4


async def hammer(url, until, seen):
    """Open sessions and throw bad input at them: frames from BAD, oversized ones, steps abandoned mid-flight,
    sockets dropped without a close; every answer must be an error frame with the code expected."""
    rng = random.Random()
    while time.monotonic() < until:
        try:
            async with connect(f"{url}/ws", max_size=None) as ws:
                if rng.random() < 0.5:
                    await exchange(ws, json.dumps({"type": "reset", "data": {"seed": rng.randrange(100)}}))
                for _ in range(rng.randrange(1, 20)):
                    kind = rng.random()
                    if kind < 0.7:
                        frame, code = rng.choice(BAD[:5] + BAD[6:] + AFTER_RESET[:3])
                        said = (await exchange(ws, frame))["data"]["code"]
                        assert said == code, (frame, said)
                    elif kind < 0.8:
                        said = await exchange(ws, "{" + " " * (2 << 20) + "}")
                        assert said["data"]["code"] == "VALIDATION_ERROR"
                    elif kind < 0.9:
                        await ws.send(json.dumps({"type": "step", "data": {"message": "bye"}}))
                        break  # leave without reading the answer
                    else:
                        seen["dropped"] += 1
                        ws.transport.abort()  # no close handshake
                        break
                    seen["answered"] += 1
        except (ConnectionClosed, OSError):
            seen["closed"] += 1


async def valid_sessions(url, until, rewards):
    index = 0
    while time.monotonic() < until:
        rewards.append(await episode(url, index % 50))
        index += 1


@pytest.mark.slow
def test_a_30s_hammer_of_bad_input_leaves_valid_sessions_served_and_no_session_leaked():
    args = ["--protocol", "openenv", "--port", "0", "--openenv.max-concurrent-envs", str(MAX_SESSIONS),
            "--openenv.max-frame-bytes", str(1 << 20)]
    with local_server("reverse-text", extra_args=args) as url:
        async def scenario():
            until = time.monotonic() + 30
            seen = {"answered": 0, "dropped": 0, "closed": 0}
            rewards: list[float] = []
            await asyncio.gather(*(hammer(url, until, seen) for _ in range(HAMMERS)),
                                 *(valid_sessions(url, until, rewards) for _ in range(VALID)))
            await asyncio.sleep(0.5)  # the dropped sockets' sessions end server-side
            at_once = await asyncio.gather(*(episode(url, i) for i in range(MAX_SESSIONS)))
            return seen, rewards, at_once

        seen, rewards, at_once = asyncio.run(scenario())
        health = httpx.get(url.replace("ws://", "http://") + "/health").json()
    assert len(rewards) > 100 and set(rewards) == {1.0}, (len(rewards), set(rewards))
    assert seen["answered"] > 500 and seen["dropped"] > 10
    assert at_once == [1.0] * MAX_SESSIONS and health == {"status": "healthy"}
