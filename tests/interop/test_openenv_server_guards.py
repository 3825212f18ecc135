"""Our OpenEnv server under hostile or careless clients: JSON nested past its depth limit gets an error frame (the
session goes on); an HTTP body over the limit gets 413 unread; a connection slow to send its headers is closed;
when full, the session idle longest gives its place; off loopback the secret never goes in clear (TLS, or refused);
and OpenEnv's own `MCPToolClient` and `GenericEnvClient` (http:// and ws:// URLs) work against it. The slow test
sends `tracegym serve --protocol openenv` a 1 GB body and 1,000 clients that never finish their headers."""

import asyncio
import contextlib
import json
import os
import re
import resource
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from websockets.asyncio.client import connect

from tracegym.core.errors import UsageError
from tracegym.envs.registry import load_taskset
from tracegym.interop.openenv_protocol import MAX_DEPTH
from tracegym.interop.openenv_server import OpenEnvServer

SECRET = "s" * 40


@pytest.fixture(scope="module")
def reverse_url():
    with OpenEnvServer(load_taskset("reverse-text"), workers=0, max_frame_bytes=64 << 10,
                       header_timeout=0.5).running() as url:
        yield url


async def exchange(url, *frames, headers=None, ssl_context=None):
    async with connect(f"{url}/ws", additional_headers=headers, ssl=ssl_context, open_timeout=60) as ws:
        answers = []
        for frame in frames:
            await ws.send(frame if isinstance(frame, str) else json.dumps(frame))
            answers.append(json.loads(await ws.recv()))
        return answers


async def refusal(url, ssl_context):
    """The frame a client without the secret gets (the server refuses it at once, then closes)."""
    async with connect(f"{url}/ws", ssl=ssl_context, open_timeout=60) as ws:
        return json.loads(await ws.recv())


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 2000, 30_000])
def test_json_nested_past_the_depth_limit_gets_an_error_frame_and_the_session_goes_on(reverse_url, depth):
    bomb = '{"type": "step", "data": {"message": "x", "tool_calls": ' + "[" * depth + "]" * depth + "}}"
    refused, reset = asyncio.run(exchange(reverse_url, bomb, {"type": "reset", "data": {"index": 0}}))
    assert refused["type"] == "error" and refused["data"]["code"] == "INVALID_JSON"
    assert "nested too deeply" in refused["data"]["message"]
    assert reset["type"] == "observation"


def test_an_http_body_over_the_limit_is_refused_413_whether_declared_or_streamed(reverse_url):
    http = reverse_url.replace("ws://", "http://")
    big = b'{"index": 0, "pad": "' + b"x" * (128 << 10) + b'"}'

    def chunks():
        yield big[:1000]
        yield big[1000:]
    with httpx.Client(base_url=http) as client:
        declared = client.post("/reset", content=big, headers={"content-type": "application/json"})
        streamed = client.post("/reset", content=chunks(), headers={"content-type": "application/json"})
        deep = client.post("/mcp", content="[" * 5000 + "]" * 5000)
        assert client.get("/health").status_code == 200
    assert declared.status_code == 413 and "limit of 65536 bytes" in declared.json()["detail"]
    assert streamed.status_code == 413
    assert deep.status_code == 400 and "nested too deeply" in deep.json()["detail"]


@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nHost: x\r\n"])
def test_a_connection_that_does_not_finish_its_headers_in_time_is_closed(reverse_url, sent):
    port = int(reverse_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(sent)
        sock.settimeout(30)
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server, without an answer
    assert time.monotonic() - started < 25


def test_when_full_the_session_idle_longest_gives_its_place_to_a_new_one():
    server = OpenEnvServer(load_taskset("reverse-text"), workers=0, max_concurrent_envs=2, reap_idle_after=0.05)
    with server.running() as url:
        async def scenario():
            async with connect(f"{url}/ws") as first, connect(f"{url}/ws") as second:
                for ws in (first, second):
                    await ws.send(json.dumps({"type": "reset", "data": {}}))
                    await ws.recv()
                await second.send(json.dumps({"type": "state"}))  # the second was active last
                await second.recv()
                await asyncio.sleep(0.1)  # both idle past reap_idle_after (time must pass: nothing to wait on)
                newcomer = GenericEnvClient(base_url=url)
                reset = await newcomer.reset(index=1)
                told = json.loads(await asyncio.wait_for(first.recv(), 10))
                await newcomer.close()
                await second.send(json.dumps({"type": "state"}))
                return reset, told, json.loads(await second.recv())
        reset, told, still = asyncio.run(scenario())
    assert reset.observation["task"] and still["type"] == "state"
    assert told["data"]["code"] == "SESSION_ERROR" and "while the server was full" in told["data"]["message"]


def test_off_loopback_plain_http_is_refused_naming_tls(monkeypatch):
    server = OpenEnvServer(load_taskset("reverse-text"), workers=0, secret=SECRET)
    with pytest.raises(UsageError, match=r"in clear: give --openenv.tls-certfile"):
        server.bind("0.0.0.0", 0)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_with_tls_the_secret_travels_encrypted_and_is_required(certificate):
    cert, key = certificate
    server = OpenEnvServer(load_taskset("reverse-text"), workers=0, secret=SECRET, tls_certfile=cert, tls_keyfile=key)
    server.bind("0.0.0.0", 0).close()  # off loopback: allowed with TLS
    context = ssl.create_default_context(cafile=str(cert))
    with server.running() as url:
        assert url.startswith("wss://")
        [reset] = asyncio.run(exchange(url, {"type": "reset", "data": {"index": 0}}, ssl_context=context,
                                       headers={"Authorization": f"Bearer {SECRET}"}))
        refused = asyncio.run(refusal(url, context))
        with pytest.raises(httpx.TransportError):  # plain HTTP is not spoken on that port
            httpx.get(url.replace("wss://", "http://") + "/health", timeout=10)
    assert reset["type"] == "observation"
    assert refused["data"]["code"] == "SESSION_ERROR" and "unauthorized" in refused["data"]["message"]


def test_openenvs_mcp_tool_client_lists_and_calls_tools_in_its_own_session():
    taskset = load_taskset("counter-env")
    row = taskset[0]
    server = OpenEnvServer(taskset, workers=0)
    with server.running() as url:
        async def session():
            async with MCPToolClient(base_url=url.replace("ws://", "http://")) as env:
                await env.reset(key=row.key)
                tools = await env.list_tools()
                said = await env.call_tool("increment", amount=2)
                held = server.active
            return tools, said, held, server.active
        tools, said, held, after = asyncio.run(session())
    assert sorted(t.name for t in tools) == ["decrement", "get_count", "increment"]
    assert said == f"The counter is now {row.start + 2}."
    assert held == 1 and after == 0  # one session for the WebSocket and the HTTP calls; closed with the client


@pytest.mark.parametrize("scheme", ["http", "ws"])
def test_openenvs_generic_client_plays_from_an_http_or_ws_url(reverse_url, scheme):
    row = load_taskset("reverse-text")[2]

    async def play():
        async with GenericEnvClient(base_url=reverse_url.replace("ws://", f"{scheme}://")) as env:
            await env.reset(index=2)
            return await env.step({"message": row.prompt[::-1]})
    assert asyncio.run(play()).reward == 1.0


def rss_kib(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_until(condition, seconds):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_huge_body_and_a_thousand_slow_header_clients_cost_the_server_neither_memory_nor_sockets():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
    command = [sys.executable, "-m", "tracegym.cli.main", "serve", "reverse-text", "--protocol", "openenv", "--port",
               "0", "--openenv.workers", "0", "--openenv.header-timeout", "3", "--exit-with-parent"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        port = int(proc.stdout.readline().decode().rsplit(":", 1)[1])
        fds, rss = open_fds(proc.pid), rss_kib(proc.pid)
        with socket.create_connection(("127.0.0.1", port)) as sock:  # a 1 GB body: refused before it is read
            sock.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000000\r\n\r\n")
            with contextlib.suppress(OSError):  # the server may close while we still send
                for _ in range(64):
                    sock.sendall(b"x" * (1 << 20))
            sock.settimeout(30)
            assert sock.recv(64).startswith(b"HTTP/1.1 413")
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(1000)]
        for sock in slow:
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # headers never finished
        wait_until(lambda: open_fds(proc.pid) <= fds + 5, 60)  # each closed by the server after 3 s
        for sock in slow:
            sock.close()
        assert rss_kib(proc.pid) - rss < 64 << 10  # not the GB it was sent (a little for 1,000 connections)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
