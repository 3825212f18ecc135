"""Shared secret: required off loopback; peers without it are refused; traffic is encrypted, replays run nothing."""

import asyncio
import select
import socket
import threading

import pytest
import zmq
from serve_helpers import running_server, task

from tracegym import UsageError
from tracegym.serve import AuthenticationError, EnvClient, EnvServer
from tracegym.serve.wire import SECRET_ENV
from tracegym.testing.echo import SPEC


def test_binding_off_loopback_without_a_secret_is_refused(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(UsageError, match=SECRET_ENV):
        EnvServer(SPEC, address="tcp://0.0.0.0:0")


@pytest.fixture(scope="module")
def guarded():
    with running_server(secret="s3cret") as server:
        yield server


async def test_a_request_without_the_secret_is_rejected(guarded, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    async with EnvClient(guarded.bound) as client:
        with pytest.raises(AuthenticationError, match="requires a shared secret"):
            await client.health()


async def test_a_request_with_a_wrong_secret_is_rejected(guarded):
    async with EnvClient(guarded.bound, secret="guess") as client:
        with pytest.raises(AuthenticationError, match="refused this client's shared secret"):
            await client.info()
    assert guarded.stats["handshakes_failed"] >= 1


async def test_a_client_with_a_secret_is_told_when_the_server_has_none(server):
    async with EnvClient(server.bound, secret="s3cret") as client:
        with pytest.raises(AuthenticationError, match="or unset it if the server has none"):
            await client.health()


async def test_a_request_with_the_secret_from_the_environment_is_served(guarded, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "s3cret")
    async with EnvClient(guarded.bound) as client:
        assert (await client.health())["ok"]


class Tap:
    """A TCP relay in front of a server that records what the client sends (a wire an attacker can read)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("tcp://").rsplit(":", 1)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent = bytearray()
        threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection((self.upstream[0], int(self.upstream[1])))
        peers = {client: server, server: client}
        while True:
            ready, _, _ = select.select(list(peers), [], [], 5)
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                if sock is client:
                    self.sent += data
                peers[sock].sendall(data)


def messages(stream: bytes) -> list[list[bytes]]:
    """The ZMTP 3 messages readable in a captured byte stream (commands, and whatever follows an encrypted
    handshake, are skipped: an attacker can only resend what it can read)."""
    found, frames, at = [], [], 64  # after the greeting
    while at < len(stream):
        flags, long = stream[at], stream[at] & 0x02
        size = int.from_bytes(stream[at + 1:at + 9], "big") if long else stream[at + 1]
        body_at = at + (9 if long else 2)
        body, at = stream[body_at:body_at + size], body_at + size
        if flags & 0x04:  # a command: READY, or CURVE's HELLO / INITIATE / MESSAGE boxes
            continue
        frames.append(body)
        if not flags & 0x01:
            found.append(frames)
            frames = []
    return found


def replay(address: str, captured: list[list[bytes]]) -> None:
    """Send captured messages to the server from a new connection without the secret, as an attacker would."""
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        for frames in captured:
            sock.send_multipart(frames)
        sock.poll(1000)


async def test_traffic_under_a_secret_is_encrypted_and_a_captured_session_replayed_runs_nothing(guarded, endpoint):
    tap = Tap(guarded.bound)
    async with EnvClient(tap.address, secret="s3cret") as client:
        [trace] = await client.run(task("confidential"), endpoint)
    assert trace.ok
    assert b"confidential" not in tap.sent
    runs = guarded.stats["run_requests"]
    await asyncio.to_thread(replay, guarded.bound, messages(bytes(tap.sent)))
    assert guarded.stats["run_requests"] == runs
