"""Benchmark: an env server's memory under a flood of large requests (the audit's 16 x 60 MB), old code vs new.

Each flood goes to a fresh `tracegym serve` (echo taskset, one worker, no secret, on loopback) from bare ZMQ
sockets, as an attacker would send it:
  refused  16 requests of 60 MB (a payload that is no run request: the worker refuses it) on one connection;
  spread   the same 16 requests, one per connection;
  held     16 valid run requests of 6 MB, each stalling the model 30 s so every one taken stays in flight, against
           a 24 MB budget (`--max-open-bytes 24MB`; the old code has none);
  multipart one message of 16 frames of 60 MB (ZMQ takes a message in whole before the server sees it: only a
           shared secret keeps this out).
For each, the server process's RSS at idle, its peak during the flood (VmHWM) and 1 s after it, how many requests
were refused over budget, and how long a normal client's request then takes. The old code runs from `--old-src`
(a checkout's `src`, e.g. a `git worktree` of main before this change), in the same run.

    .venv/bin/python benchmarks/env_server_flood.py --old-src /tmp/old/src [--floods refused held]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import zmq
from old_code import code_from

from tracegym import Endpoint, TaskData
from tracegym.models.client import ModelRequest
from tracegym.serve import EnvClient, local_server
from tracegym.serve.run_request import RunRequest
from tracegym.serve.wire import OVER_BUDGET, decode_reply, encode_request, pack
from tracegym.testing import FakeOpenAIServer, Stall
from tracegym.testing.echo import SPEC
from tracegym.testing.script import Entry

MB = 1_000_000
REPLY_WAIT_S = 15.0
HELD_FLAGS = ["--max-open-bytes", "24MB", "--max-request-bytes", "8MB"]
"""The new server's budget for the `held` flood (the audit's flood scaled down by 10)."""


def reply(request: ModelRequest) -> Entry:
    """`Say sleep-S.` stalls S seconds; anything else is echoed at once."""
    word = request.messages[0].text.removeprefix("Say ").removesuffix(".")
    return Stall(float(word.removeprefix("sleep-")), then=word) if word.startswith("sleep-") else word


# --- what the attacker sends ---------------------------------------------------------------------------------
def send_requests(address: str, payload: bytes, count: int, connections: int, expect_refused: int) -> int:
    """`count` run requests carrying `payload`, spread over `connections` sockets; returns how many were refused
    over budget once every reply came (or `expect_refused` did, or REPLY_WAIT_S passed)."""
    with zmq.Context() as ctx:
        socks = [ctx.socket(zmq.DEALER) for _ in range(connections)]
        for sock in socks:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
        for n in range(count):
            socks[n % connections].send_multipart([encode_request(f"flood-{n}", "run")[0], payload], copy=False)
        return _collect(socks, count, expect_refused)


def _collect(socks: list[zmq.Socket], count: int, expect_refused: int) -> int:
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    answered = refused = 0
    deadline = time.monotonic() + REPLY_WAIT_S
    while answered < count and time.monotonic() < deadline and not (expect_refused and refused >= expect_refused):
        for sock, _ in poller.poll(100):
            _, result = decode_reply(sock.recv_multipart())
            answered += 1
            refused += getattr(result, "type", None) == OVER_BUDGET
    for sock in socks:
        sock.close(0)
    return refused


def send_multipart(address: str, frame: bytes, frames: int) -> int:
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        sock.send_multipart([frame] * frames, copy=False)
        sock.poll(int(REPLY_WAIT_S * 1000))
    return 0


def held_payload(endpoint: Endpoint, size: int) -> bytes:
    data = TaskData(id="flood", prompt="Say sleep-30.", answer="x", pad="x" * size)
    return pack(RunRequest(data=data, endpoint=endpoint).model_dump(mode="json"))


# --- measuring -----------------------------------------------------------------------------------------------
def status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _pid(address: str) -> int:
    async with EnvClient(address, request_timeout=60) as client:
        return (await client.health())["pid"]


async def _normal(address: str, endpoint: Endpoint) -> str:
    """A normal client's one request after the flood: its time, or why it failed."""
    start = time.monotonic()
    try:
        async with EnvClient(address, request_timeout=30) as client:
            [trace] = await client.run(TaskData(id="n", prompt="Say hello.", answer="hello"), endpoint)
        return f"{time.monotonic() - start:.2f}s" + ("" if trace.ok else " (failed)")
    except Exception as exc:  # reported, not raised: the server may be the one that fell over
        return f"{type(exc).__name__}"


def measure(src: str | None, extra: list[str], attack: Callable[[str], int], endpoint: Endpoint) -> str:
    with code_from(src), local_server(SPEC, {}, workers=1, extra_args=extra) as address:
        pid = asyncio.run(_pid(address))
        idle = status_mib(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM (peak RSS) counts from here
        refused = attack(address)
        peak = status_mib(pid, "VmHWM")
        time.sleep(1)
        after = status_mib(pid, "VmRSS")
        normal = asyncio.run(_normal(address, endpoint))
    return f"{idle:8.0f} | {peak:8.0f} | {after:8.0f} | {refused:>7} | {normal:>10}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-src", help="`src` of the old checkout to compare with (unset: new code only)")
    parser.add_argument("--floods", nargs="+", default=["refused", "spread", "held", "multipart"])
    parser.add_argument("--size-mb", type=int, default=60, help="size of each large frame (MB)")
    args = parser.parse_args()
    big = b"\x93" + b"\0" * (args.size_mb * MB)  # msgpack: an array, then junk: no run request
    with FakeOpenAIServer(rule=reply, model="m") as fake:
        endpoint = Endpoint(base_url=fake.base_url, model="m", api_key_env=None, max_retries=0)
        small = held_payload(endpoint, 6 * MB)
        floods: dict[str, tuple[list[str], Callable[[str], int]]] = {
            "refused": ([], lambda a: send_requests(a, big, 16, 1, 0)),
            "spread": ([], lambda a: send_requests(a, big, 16, 16, 0)),
            "held": (HELD_FLAGS, lambda a: send_requests(a, small, 16, 1, 13)),
            "multipart": ([], lambda a: send_multipart(a, big, 16)),
        }
        print(f"{args.size_mb} MB frames; server process RSS in MiB; 'normal': one small request after the flood")
        print("| flood | code | idle | peak | 1 s after | refused over budget | normal request |")
        print("|---|---|---|---|---|---|---|")
        sides = [("old", args.old_src), ("new", None)] if args.old_src else [("new", None)]
        for name in args.floods:
            extra, attack = floods[name]
            for side, src in sides:
                flags = extra if side == "new" else []
                print(f"| {name} | {side} | {measure(src, flags, attack, endpoint)} |", flush=True)


if __name__ == "__main__":
    main()
