"""Memory before authentication: a peer without the shared secret cannot make a server buffer its payload."""

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tracegym.serve import EnvClient, local_server
from tracegym.serve.wire import SECRET_ENV
from tracegym.testing.echo import SPEC

pytestmark = pytest.mark.slow

SECRET = "s3cret-s3cret-s3cret"
FRAME = 64 * 1024 * 1024
FRAMES = 16
"""A 1 GiB multipart burst, each frame within the server's per-frame cap."""
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for pid {pid}")


async def server_pid(address: str) -> int:
    async with EnvClient(address, secret=SECRET, request_timeout=10) as client:
        return (await client.health())["pid"]


def burst(address: str, within: float = 20.0) -> str:
    """Send 1 GiB as one multipart message without the secret; wait until the server answers or refuses the
    handshake (at most `within` seconds). Returns what happened."""
    payload = zmq.Frame(b"\0" * FRAME)
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        monitor = sock.get_monitor_socket(HANDSHAKE_FAILED)
        sock.connect(address)
        sock.send_multipart([payload] * FRAMES, copy=False)
        deadline = time.monotonic() + within
        try:
            while time.monotonic() < deadline:
                if sock.poll(50):
                    return "answered"
                if monitor.poll(0):
                    return f"refused ({recv_monitor_message(monitor)['event'].name})"
            return "silence"
        finally:
            sock.disable_monitor()
            monitor.close(0)


def raw_frame(address: str, size: int, within: float = 20.0) -> str:
    """Open a plain TCP connection, send a ZMTP 3 greeting asking for CURVE and one command frame of `size` bytes
    (what a peer can send before any key is checked), at most `within` seconds. Returns how it ended."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + b"\0" * 32
    header = b"\x06" + size.to_bytes(8, "big")  # a long command frame
    chunk, deadline = b"\0" * (1 << 20), time.monotonic() + within
    with socket.create_connection((host, int(port)), timeout=within) as sock:
        try:
            sock.sendall(greeting + header)
            for _ in range(size // len(chunk)):
                if time.monotonic() > deadline:
                    return "timed out"
                sock.sendall(chunk)
        except OSError as exc:  # the server cut the connection: the frame was refused as its header arrived
            return f"cut ({type(exc).__name__})"
        time.sleep(1)  # let the server take in what it was sent before its peak is read
        return "sent"


def assert_flat_and_serving(monkeypatch, attack: Callable[[str], str], within: float = 30.0) -> None:
    """Start a server under a secret, run `attack(address)` without it: the server's peak RSS stays under 100 MiB
    above idle, the attack ends within `within` seconds, and the server still serves a client with the secret."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with local_server(SPEC, {}, workers=1) as address:
        monkeypatch.delenv(SECRET_ENV)
        pid = asyncio.run(server_pid(address))
        idle = status_mib(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM (peak RSS) counts from here
        started = time.monotonic()
        outcome = attack(address)
        peak = status_mib(pid, "VmHWM")
        assert peak - idle < 100, f"server RSS rose {peak - idle:.0f} MiB above idle ({outcome})"
        assert time.monotonic() - started < within, outcome
        assert asyncio.run(server_pid(address)) == pid  # still serving, with the secret


def test_a_raw_peer_sending_one_long_frame_before_authentication_costs_at_most_the_size_limit(monkeypatch):
    assert_flat_and_serving(monkeypatch, lambda address: raw_frame(address, 120 * 1024 * 1024))


def test_an_unauthenticated_1gib_burst_leaves_server_memory_flat_and_it_keeps_serving(monkeypatch):
    assert_flat_and_serving(monkeypatch, burst)
