"""Shared secret: required off loopback; peers without it are refused; traffic is encrypted, replays run nothing."""

import asyncio
import contextlib
import hashlib
import select
import socket
import threading

import pytest
import zmq
from serve_helpers import running_server, task, wait_for
from zmq.utils import z85

from tracegym import UsageError
from tracegym.serve import AuthenticationError, EnvClient, EnvServer, curve
from tracegym.serve.wire import SECRET_ENV
from tracegym.testing.echo import SPEC


def test_binding_off_loopback_without_a_secret_is_refused(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(UsageError, match=SECRET_ENV):
        EnvServer(SPEC, address="tcp://0.0.0.0:0")


@pytest.mark.parametrize("side", ["server", "client"])
def test_a_secret_shorter_than_16_characters_is_refused_naming_where_it_comes_from(side, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "short-secret")
    with pytest.raises(UsageError, match=f"{SECRET_ENV}.*at least 16 characters"):
        EnvServer(SPEC) if side == "server" else EnvClient("tcp://127.0.0.1:1")


def test_the_curve_keys_are_derived_from_the_secret_by_scrypt_with_the_documented_salt():
    secret = "s3cret-s3cret-s3cret"
    derived = hashlib.scrypt(secret.encode(), salt=curve.SALT, n=2**14, r=8, p=1, dklen=64)
    server, client = curve.key_pairs(secret)
    assert server[1] == z85.encode(derived[:32]) and client[1] == z85.encode(derived[32:])
    assert server[0] == zmq.curve_public(server[1]) and client[0] == zmq.curve_public(client[1])
    assert curve.key_pairs(secret) is curve.key_pairs(secret)  # derived once per process


@pytest.fixture(scope="module")
def guarded():
    with running_server(secret="s3cret-s3cret-s3cret") as server:
        yield server


async def test_a_request_without_the_secret_is_rejected(guarded, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    async with EnvClient(guarded.bound) as client:
        with pytest.raises(AuthenticationError, match="requires a shared secret"):
            await client.health()


async def test_a_request_with_a_wrong_secret_is_rejected(guarded):
    async with EnvClient(guarded.bound, secret="a-wrong-guess-of-it") as client:
        with pytest.raises(AuthenticationError, match="its shared secret differs from this client's"):
            await client.info()
    assert guarded.stats["handshakes_failed"] >= 1


async def test_a_client_with_a_secret_is_told_when_the_server_has_none(server):
    async with EnvClient(server.bound, secret="s3cret-s3cret-s3cret") as client:
        with pytest.raises(AuthenticationError, match="or unset it if the server has none"):
            await client.health()


async def test_a_request_with_the_secret_from_the_environment_is_served(guarded, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "s3cret-s3cret-s3cret")
    async with EnvClient(guarded.bound) as client:
        assert (await client.health())["ok"]


GREETING = 64
"""Bytes of a ZMTP 3 greeting, the first thing each side sends."""


class Tap:
    """A TCP relay in front of a server that records what its clients send (a wire an attacker can read); the
    first `refuse` connections it answers the way an HTTP server would, then hangs up."""

    def __init__(self, upstream: str, refuse: int = 0) -> None:
        self.upstream = upstream.removeprefix("tcp://").rsplit(":", 1)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent, self.refuse = bytearray(), refuse
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            if self.refuse:
                self.refuse -= 1
                with client:
                    client.recv(GREETING)
                    client.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                continue
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
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


async def test_a_client_of_something_not_an_env_server_hears_its_handshake_was_refused():
    not_ours = Tap("tcp://127.0.0.1:1", refuse=10**6)
    async with EnvClient(not_ours.address, request_timeout=10) as client:
        with pytest.raises(AuthenticationError, match=f"handshake refused by {not_ours.address}: not a tracegym env "
                                                      "server, or"):
            await client.health()


def replay(address: str, captured: bytes) -> None:
    """Send a captured byte stream verbatim over a new TCP connection, as an attacker on the wire would: its
    greeting, then (once the server's greeting is in, the pace of a real peer: libzmq refuses a greeting run
    together with what follows) the rest. Returns when the server hangs up, or after 5 s."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(captured[:GREETING])
        heard = b""
        while len(heard) < GREETING and (chunk := sock.recv(GREETING - len(heard))):
            heard += chunk
        sock.sendall(captured[GREETING:])
        with contextlib.suppress(OSError):
            while sock.recv(65536):
                pass


async def test_traffic_under_a_secret_is_encrypted_and_a_captured_session_replayed_runs_nothing(guarded, endpoint):
    tap = Tap(guarded.bound)
    async with EnvClient(tap.address, secret="s3cret-s3cret-s3cret") as client:
        [trace] = await client.run(task("confidential"), endpoint)
    assert trace.ok
    assert b"confidential" not in tap.sent
    runs, refused = guarded.stats["run_requests"], guarded.stats["handshakes_failed"]
    await asyncio.to_thread(replay, guarded.bound, bytes(tap.sent))
    assert await asyncio.to_thread(wait_for, lambda: guarded.stats["handshakes_failed"] > refused, 5)
    assert guarded.stats["run_requests"] == runs
