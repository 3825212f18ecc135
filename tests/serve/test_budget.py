"""Byte budgets: what one connection and the whole server may hold in `run` requests received and not yet answered,
counted before the request is read and refused at once past either budget; control requests have a small cap."""

import asyncio
import doctest
from pathlib import Path

import pytest
import zmq
from serve_helpers import running_server, task, wait_for

from tracegym import Endpoint, InfrastructureError, TaskData, UsageError
from tracegym.serve import EnvClient, EnvServer, PoolSize, RemoteError, budget, local_server
from tracegym.serve.budget import Budget
from tracegym.serve.env_server_choice import WorkerPoolChoice
from tracegym.serve.run_request import RunRequest
from tracegym.serve.wire import MAX_CONTROL_BYTES, OVER_BUDGET, decode_reply, encode_request, pack
from tracegym.testing.echo import SPEC

SECRET = "budget-budget-budget-secret"
MB = 1_000_000


def test_the_modules_doctest_runs():
    assert doctest.testmod(budget).failed == 0


def test_a_budget_counts_per_peer_and_in_all_and_forgets_a_peer_holding_nothing():
    held = Budget(per_peer=100, total=150, peer_flag="--peer", total_flag="--total")
    held.take(b"a", 90)
    assert "--peer" in (held.refusal(b"a", 20) or "") and held.refusal(b"b", 60) is None
    held.take(b"b", 60)
    assert "--total" in (held.refusal(b"c", 1) or "")  # 150 held in all
    held.release(b"a", 90)
    assert held.refusal(b"c", 90) is None and held.held == {b"b": 60} and held.held_total == 60


def test_without_a_secret_one_smaller_budget_bounds_each_connection_and_all_of_them():
    open_, guarded = (Budget.for_server(secret=s, open_bytes=10, peer_bytes=100, server_bytes=400) for s in (0, 1))
    assert (open_.per_peer, open_.total, open_.peer_flag) == (10, 10, "--max-open-bytes")
    assert (guarded.per_peer, guarded.total, guarded.total_flag) == (100, 400, "--max-server-bytes")


def test_a_budget_below_the_request_size_limit_is_refused_at_start():
    with pytest.raises(UsageError, match=r"--max-open-bytes .* below the request size limit"):
        EnvServer(SPEC, {}, max_request_bytes=10 * MB, max_open_bytes=5 * MB)


def test_the_budgets_are_serve_flags_with_units_and_reach_the_servers_eval_and_rl_start():
    choice = WorkerPoolChoice(max_request_bytes="8MB", max_open_bytes="24MB")
    assert choice.serve_args() == ["--max-request-bytes", "8000000", "--max-open-bytes", "24000000"]


# --- the server's bookkeeping, driven by hand (no worker: requests stay queued, held) -------------------------
@pytest.fixture
def guarded(monkeypatch):
    """A server with the secret (per-connection 2,500 bytes, 4,000 in all), bound, not serving; its replies
    recorded as (client, error type) instead of sent."""
    server = EnvServer(SPEC, {}, size=PoolSize(min=1), secret=SECRET, max_request_bytes=1200, max_peer_bytes=2500,
                       max_server_bytes=4000)
    server.bind()
    replies: list[tuple[bytes, str | None]] = []

    def record(client: bytes, frames: list[bytes]) -> None:
        _, result = decode_reply(frames)
        replies.append((client, result.type if isinstance(result, RemoteError) else None))

    monkeypatch.setattr(server, "_send", record)
    server.replies = replies
    try:
        yield server
    finally:
        server._shutdown()


def run_frames(request_id: str, size: int) -> list[bytes]:
    return encode_request(request_id, "run", {"pad": "x" * size})


def message(client: bytes, frames: list[bytes]) -> list[zmq.Frame]:
    """A client's message as the server's socket hands it over."""
    return [zmq.Frame(f) for f in (client, *frames)]


def test_a_connection_past_its_budget_is_refused_at_once_and_others_still_get_in_until_the_servers(guarded):
    size = sum(len(f) for f in run_frames("a0", 1000))
    for n in range(3):  # two fit in 2,500 bytes, the third does not
        guarded._on_client(message(b"A", run_frames(f"a{n}", 1000)))
    assert guarded.replies == [(b"A", OVER_BUDGET)] and guarded.budget.held == {b"A": 2 * size}
    guarded._on_client(message(b"B", run_frames("b0", 1000)))  # another connection: 3 held, 4,000 in all
    guarded._on_client(message(b"C", run_frames("c0", 1000)))  # would be 4 in all
    assert guarded.replies[-1] == (b"C", OVER_BUDGET) and guarded.stats["over_budget"] == 2
    guarded._on_client(message(b"A", encode_request("x", "cancel", {"id": "a0"})))  # answered: its bytes are free
    assert guarded.budget.held == {b"A": size, b"B": size}
    guarded._on_client(message(b"C", run_frames("c0", 1000)))
    assert guarded.replies[-1] == (b"A", None) and guarded.budget.held_total == 3 * size  # c0 taken: no reply yet


def test_the_refusal_names_the_budget_and_the_option_that_sets_it(guarded):
    for n in range(3):
        guarded._on_client(message(b"A", run_frames(f"a{n}", 1000)))
    sent: list[list[bytes]] = []
    guarded._send = lambda client, frames: sent.append(frames)  # type: ignore[method-assign]
    guarded._on_client(message(b"A", run_frames("a9", 1000)))
    _, error = decode_reply(sent[0])
    assert isinstance(error, RemoteError) and error.type == OVER_BUDGET
    assert "2500 bytes per connection (--max-peer-bytes)" in str(error)


def test_a_control_request_with_a_large_payload_is_refused_before_it_is_read(guarded):
    pending = ["x" * 100] * (MAX_CONTROL_BYTES // 100)
    guarded._on_client(message(b"A", encode_request("h", "health", {"pending": pending})))
    assert guarded.replies == [(b"A", "TooLarge")] and guarded.stats["oversized"] == 1


# --- real processes -------------------------------------------------------------------------------------------
def status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for pid {pid}")


def flood(address: str, endpoint: Endpoint, requests: int, size: int) -> list[str | None]:
    """Send `requests` valid `run` requests of about `size` bytes each at once from one bare connection (each
    stalls the fake model 30 s, so every one taken stays held); the error type of each reply that comes within
    20 s (None: a success, which none should be)."""
    data = TaskData(id="flood", prompt="Say sleep-30.", answer="x", pad="x" * size)
    payload = pack(RunRequest(data=data, endpoint=endpoint).model_dump(mode="json"))
    outcomes: list[str | None] = []
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        for n in range(requests):
            sock.send_multipart([encode_request(f"flood-{n}", "run")[0], payload], copy=False)
        while sock.poll(20_000) and len(outcomes) < requests:
            _, result = decode_reply(sock.recv_multipart())
            outcomes.append(result.type if isinstance(result, RemoteError) else None)
            if outcomes.count(OVER_BUDGET) == requests - 3:
                break
    return outcomes


@pytest.mark.slow
def test_a_flood_of_large_requests_is_held_to_the_budget_and_the_server_keeps_serving(endpoint):
    """The audit's flood, scaled down: 16 requests of 6 MB from one connection against a 24 MB budget: three are
    held (the fourth would pass 24 MB), thirteen are refused at once; the server's peak RSS rises by the budget and
    a frame or two, not by the 96 MB sent, and a normal client is still served meanwhile."""
    pool = WorkerPoolChoice(workers=1, max_request_bytes="8MB", max_open_bytes="24MB")
    with local_server(SPEC, {}, pool=pool) as address:
        pid = asyncio.run(_health(address))["pid"]
        idle = status_mib(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM (peak RSS) counts from here
        outcomes = flood(address, endpoint, 16, 6 * MB)
        peak = status_mib(pid, "VmHWM")
        health = asyncio.run(_health(address))
        assert outcomes.count(OVER_BUDGET) == 13 and None not in outcomes, outcomes
        assert health["held_bytes"] <= 24 * MB and health["in_flight"] == 3
        assert peak - idle < 24 + 2 * 6 + 20, f"server RSS rose {peak - idle:.0f} MiB above idle"

        async def normal() -> list:
            async with EnvClient(address, request_timeout=30) as client:
                return await client.run(task("hello"), endpoint)

        assert asyncio.run(normal())[0].ok


async def _health(address: str) -> dict:
    async with EnvClient(address, request_timeout=30) as client:
        return await client.health()


async def test_a_client_refused_for_the_budget_sends_again_once_one_of_its_requests_is_answered(endpoint):
    with running_server(max_request_bytes=300_000, max_open_bytes=700_000) as server:
        async with EnvClient(server.bound, request_timeout=30) as client:
            rows = [TaskData(id=f"t{n}", prompt="Say sleep-0.3.", answer="x", pad="x" * 250_000) for n in range(5)]
            traces = await asyncio.gather(*(client.run(row, endpoint) for row in rows))
        assert all(t[0].ok for t in traces) and client.resent >= 1
        assert server.stats["over_budget"] >= 1 and wait_for(lambda: server.budget.held_total == 0, 5)


async def test_a_request_over_the_servers_size_limit_is_refused_by_the_client_before_it_is_sent(endpoint):
    with running_server(max_request_bytes=100_000) as small:  # ZMQ would cut a frame 64 KiB past it unanswered
        async with EnvClient(small.bound, request_timeout=30) as client:
            with pytest.raises(UsageError, match="100000-byte limit"):
                await client.run(TaskData(prompt="x" * 300_000), endpoint)
            assert (await client.run(task("fine"), endpoint))[0].ok
            assert small.stats["connections_closed"] == 0  # nothing was cut: it never left the client


async def test_a_request_the_server_cuts_unanswered_ends_at_the_next_ping_rather_than_hang(endpoint):
    with running_server(max_request_bytes=100_000) as small:
        async with EnvClient(small.bound, request_timeout=60, liveness_timeout=30) as client:
            client.hosts[0].server_limit = 10**9  # as if it had not asked: the frame leaves, and ZMQ cuts it
            with pytest.raises(InfrastructureError, match=r"no record .* cut the connection"):
                await asyncio.wait_for(client.run(TaskData(prompt="x" * 300_000), endpoint), 20)
            assert (await client.run(task("after"), endpoint))[0].ok  # the link is back
        assert small.stats["connections_closed"] >= 1
