"""Tests of the loop socket: messages handed over as they arrive, sends kept while ZMQ would block and sent in
order once it can take them, a failing handler that leaves the rest readable."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest
import zmq

from tracegym.serve.loop_socket import LoopSocket

_names = itertools.count()


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def pair(ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    """A bound PULL and a PUSH connected to it (inproc)."""
    address = f"inproc://loop-socket-{next(_names)}"
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(address)
    push.connect(address)
    return pull, push


async def until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    """Yield to the loop until `condition()` holds; fail past `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


async def test_messages_sent_before_the_loop_socket_existed_are_handed_over(ctx):
    pull, push = pair(ctx)
    for n in range(3):
        push.send_multipart([b"m", str(n).encode()])
    got: list[list[bytes]] = []
    link = LoopSocket(pull, got.append)
    await until(lambda: len(got) == 3)
    assert [frames[1] for frames in got] == [b"0", b"1", b"2"]
    link.close()


async def test_more_messages_than_one_batch_all_arrive_in_order(ctx):
    pull, push = pair(ctx)
    got: list[list[bytes]] = []
    link = LoopSocket(pull, got.append)
    for n in range(1000):
        push.send_multipart([str(n).encode()])
    await until(lambda: len(got) == 1000)
    assert [int(frames[0]) for frames in got] == list(range(1000))
    link.close()


async def test_sends_zmq_would_block_on_are_kept_and_go_out_in_order_once_a_peer_comes(ctx):
    address = f"inproc://loop-socket-{next(_names)}"
    push = ctx.socket(zmq.PUSH)
    push.bind(address)  # no peer yet: a send would block
    link = LoopSocket(push, lambda frames: None)
    for n in range(5):
        link.send([str(n).encode()])
    assert link.queued == 5
    pull = ctx.socket(zmq.PULL)
    pull.connect(address)
    await until(lambda: link.queued == 0)
    assert [int(pull.recv_multipart()[0]) for _ in range(5)] == list(range(5))
    link.close()


async def test_a_handler_that_raises_leaves_the_messages_after_it_to_be_handed_over(ctx):
    pull, push = pair(ctx)
    got: list[bytes] = []

    def handle(frames: list[bytes]) -> None:
        if frames[0] == b"bad":
            raise ValueError("a message this handler cannot read")
        got.append(frames[0])

    link = LoopSocket(pull, handle)
    for body in (b"a", b"bad", b"b"):
        push.send_multipart([body])
    await until(lambda: got == [b"a", b"b"])
    link.close()


async def test_close_stops_watching_the_socket_and_closes_it(ctx):
    pull, _ = pair(ctx)
    fd = pull.getsockopt(zmq.FD)
    link = LoopSocket(pull, lambda frames: None)
    link.close()
    assert pull.closed
    assert not asyncio.get_running_loop().remove_reader(fd)  # no longer watched
