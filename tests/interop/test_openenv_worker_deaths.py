"""What our OpenEnv server does when a worker holding sessions dies, with its workers played in this process (a
`SessionHost` over a socket pair, whose "death" is its socket closing when it receives a chosen frame): the sessions
it held are replayed into its replacement and play on; a frame that kills a worker on its own is answered with an
error naming the death; a frame that was merely in flight beside it is answered as usual."""

import asyncio
import json
import socket

from tracegym.interop.openenv_settings import OpenEnvSettings
from tracegym.interop.openenv_worker import HEAD, SessionHost, Wire, pack_frames, unpack_frames
from tracegym.interop.openenv_workers import Process, RemoteSession, SessionWorkers, WorkerLink
from tracegym.testing.echo import SPEC, Echo

OPTIONS = {"turns": 3}
POISON = b'"poison"'
"""A frame holding this kills the worker that receives it (in a reset's `episode_id`)."""


class DyingHost(SessionHost):
    """A worker that dies (its socket closes at once) on receiving a poison frame; with `hold`, it answers nothing
    before it has seen one, so that other frames are still in flight when it dies."""

    def __init__(self, deaths: list[int], hold: bool) -> None:
        super().__init__(Echo(OPTIONS), OpenEnvSettings())
        self.deaths, self.hold = deaths, hold
        self.poisoned = asyncio.Event()

    def receive(self, number: int, code: int, body: bytes) -> None:
        if POISON in body and self.deaths[0] > 0:
            self.deaths[0] -= 1
            self.poisoned.set()
            assert self.wire.transport is not None
            self.wire.transport.abort()
            return
        super().receive(number, code, body)

    async def _ask(self, number: int, sid: bytes, frames: list[bytes]) -> None:
        if self.hold and not self.poisoned.is_set():
            await self.poisoned.wait()
            return  # dead by now: nothing goes back
        await super()._ask(number, sid, frames)


def in_process_workers(deaths: int, hold: bool = False) -> tuple[SessionWorkers, list[DyingHost]]:
    """A pool whose workers are DyingHosts, the poison killing `deaths` of them in all (each its first time)."""
    left, hosts = [deaths], []

    async def start(link: WorkerLink) -> Process:
        parent, child = socket.socketpair()
        host = DyingHost(left, hold=hold and not hosts)  # only the first worker holds its answers
        hosts.append(host)
        await asyncio.get_running_loop().create_connection(lambda: link.wire, sock=parent)
        serving = asyncio.get_running_loop().create_task(host.serve(child))

        async def ended() -> str:
            return "closed by the test"

        async def stop() -> None:
            if host.wire.transport is not None:
                host.wire.transport.close()
            await serving
        return Process(ended, stop)
    return SessionWorkers(SPEC, OPTIONS, OpenEnvSettings(workers=1), start=start), hosts


def frame(kind: str, **data: object) -> bytes:
    return json.dumps({"type": kind, "data": data}).encode()


async def say(session: RemoteSession, kind: str, **data: object) -> dict:
    text, _ = await session.answer(frame(kind, **data))
    assert text is not None
    return json.loads(text)


def word(reply: dict) -> str:
    return reply["data"]["observation"]["messages"][-1]["content"].removeprefix("Say ").removesuffix(".")


def test_a_session_whose_worker_died_is_replayed_into_its_replacement_and_plays_its_episode_out():
    async def play():
        workers, hosts = in_process_workers(deaths=1)
        async with workers.running():
            first, second, poison = workers.session(), workers.session(), workers.session()
            await say(first, "reset")  # takes the first task in turn: `second` gets the next one
            said = word(await say(second, "reset"))
            await say(second, "step", message=said)
            answered = await say(poison, "reset", index=7, episode_id="poison")  # kills the worker once
            again = await say(second, "step", message=said)
            last = await say(second, "step", message=said)
            return hosts, workers, answered, again, last
    hosts, workers, answered, again, last = asyncio.run(play())
    assert len(hosts) == 2 and workers.deaths == 1
    assert answered["type"] == "observation"  # the poison's frame, asked again alone, did not kill the new worker
    assert again["data"]["done"] is False
    assert (last["data"]["done"], last["data"]["reward"]) == (True, 1.0)  # the same task: its word still scores


def test_a_frame_that_kills_a_worker_on_its_own_gets_an_error_naming_the_death_and_its_session_goes_on():
    async def play():
        workers, hosts = in_process_workers(deaths=2)
        async with workers.running():
            poison = workers.session()
            refused = await say(poison, "reset", episode_id="poison")
            fresh = await say(poison, "reset", index=4)
            return hosts, workers, refused, fresh, len(workers.links)
    hosts, workers, refused, fresh, serving = asyncio.run(play())
    assert refused["type"] == "error" and refused["data"]["code"] == "EXECUTION_ERROR"
    assert "worker died (closed by the test)" in refused["data"]["message"]
    assert "taken for the cause" in refused["data"]["message"]
    assert fresh["type"] == "observation" and fresh["data"]["observation"]["task"] == "echo-4"
    assert len(hosts) == 3 and workers.deaths == 2 and serving == 1  # each dead worker replaced


def test_a_frame_in_flight_beside_the_poison_when_its_worker_dies_is_answered_not_blamed():
    async def play():
        workers, _ = in_process_workers(deaths=2, hold=True)
        async with workers.running():
            innocent, poison = workers.session(), workers.session()
            return await asyncio.gather(say(innocent, "reset", index=1), say(poison, "reset", episode_id="poison"))
    innocent, poison = asyncio.run(play())
    assert innocent["type"] == "observation" and innocent["data"]["observation"]["task"] == "echo-1"
    assert poison["type"] == "error" and "taken for the cause" in poison["data"]["message"]


def test_the_wire_reassembles_messages_split_and_joined_anyhow():
    got = []
    wire = Wire(lambda number, code, body: got.append((number, code, unpack_frames(body))), lambda: None)
    stream = b"".join(HEAD.pack(len(body), n, 1) + body
                      for n, body in enumerate([pack_frames([b"one", b""]), b"", pack_frames([b"x" * 300])]))
    for at in range(0, len(stream), 7):
        wire.data_received(stream[at:at + 7])
    assert got == [(0, 1, [b"one", b""]), (1, 1, []), (2, 1, [b"x" * 300])]


def test_a_message_sent_alone_is_written_before_the_loops_next_turn_and_after_those_queued():
    async def send() -> tuple[bytes, bytes, bytes]:
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        wire = Wire(lambda *_: None, lambda: None)
        await asyncio.get_running_loop().create_connection(lambda: wire, sock=ours)
        wire.send(1, 0, b"alone", alone=True)
        at_once = theirs.recv(1 << 16)  # (no await since: the loop has not turned)
        wire.send(2, 0, b"queued")
        wire.send(3, 0, b"alone too", alone=True)  # behind the queued one: waits for it, in order
        unsent = theirs.recv(1 << 16) if _readable(theirs) else b""
        await asyncio.sleep(0)  # one turn of the loop: the queue goes out
        later = theirs.recv(1 << 16)
        wire.transport.close()
        theirs.close()
        return at_once, unsent, later
    at_once, unsent, later = asyncio.run(send())
    assert at_once == HEAD.pack(5, 1, 0) + b"alone"
    assert unsent == b""
    assert later == HEAD.pack(6, 2, 0) + b"queued" + HEAD.pack(9, 3, 0) + b"alone too"


def _readable(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
