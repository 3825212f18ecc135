"""Every frame gets an answer or a counter: requests over the size limit, frames over the socket's hard cap."""

import pytest
import zmq
from serve_helpers import running_server, task, wait_for

from tracegym import TaskData, UsageError
from tracegym.serve import EnvClient, RemoteError
from tracegym.serve.wire import decode_reply, encode_request

LIMIT = 100_000


@pytest.fixture(scope="module")
def small():
    with running_server(max_request_bytes=LIMIT) as server:
        yield server


def send_raw(address: str, frames: list[bytes], wait_ms: int = 3000) -> list[bytes] | None:
    """Send one message from a bare DEALER; its reply, or None when none came within `wait_ms`."""
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        sock.send_multipart(frames)
        return sock.recv_multipart() if sock.poll(wait_ms) else None


def test_a_request_over_the_limit_is_answered_with_a_typed_error_and_counted(small):
    before = small.stats["oversized"]
    reply = send_raw(small.bound, encode_request("big-1", "run", {"blob": b"x" * (LIMIT + 10)}))
    assert reply is not None
    request_id, error = decode_reply(reply)
    assert request_id == "big-1" and isinstance(error, RemoteError) and error.type == "TooLarge"
    assert str(LIMIT) in str(error)
    assert small.stats["oversized"] == before + 1


def test_a_frame_over_the_sockets_hard_cap_is_counted_though_its_sender_cannot_be_answered():
    with running_server(max_request_bytes=LIMIT) as server, zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)  # its own server: no other connection's close can count
        cut = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.connect(server.bound)
        sock.send_multipart([b"\x80", b"x" * (4 * LIMIT)])
        assert cut.poll(5000), "the server did not cut the connection"  # this socket stays open: the server cut it
        assert wait_for(lambda: server.stats["connections_closed"] == 1, 5), server.stats
        assert not sock.poll(100)  # libzmq cut it before its sender was known: nothing to answer
        sock.disable_monitor()
        cut.close(0)


async def test_a_client_that_learned_the_servers_limit_refuses_a_larger_request_at_once(small, endpoint):
    async with EnvClient(small.bound, max_request_bytes=10**9, request_timeout=30) as client:
        assert (await client.info())["max_request_bytes"] == LIMIT
        with pytest.raises(UsageError, match=f"{LIMIT}-byte limit"):
            await client.run(TaskData(prompt="x" * (3 * LIMIT)), endpoint)
        assert (await client.run(task("fine"), endpoint))[0].ok
