"""OpenEnv worker: one worker process of an OpenEnv server, holding sessions (`TasksetSession`) and answering the
frames their clients sent, which the server passes to it over one socket (`Wire`) without reading them.

The server and its workers speak length-prefixed messages (`HEAD`: the length of the rest, a request number, a
code). The server's `ASK` carries a session id (`SID_BYTES`) and one frame or more (each length-prefixed), to be
answered in order, the session made on its first frame; the worker answers the last with the reply's JSON and the
flags `GOES_ON` (the session goes on), `STARTS` (the frame started an episode: the frame that replays it comes
first, its task pinned by index where the client left the choice to the server) and `MOVES` (the frame played a turn
of the episode), so the server keeps each session's episode as the frames that replay it, without parsing them.
`DROP` closes a session; `READY` (number 0) is the worker's first message, once its taskset is loaded. A worker ends
when its socket closes (or the server process does); SIGINT is the server's to handle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from tracegym.envs.registry import load_taskset
from tracegym.envs.taskset import Taskset
from tracegym.interop.openenv_answers import SessionAnswers
from tracegym.interop.openenv_session import Runner, TaskPicker, TasksetSession, in_episodes
from tracegym.interop.openenv_settings import OpenEnvSettings
from tracegym.runtimes import processes
from tracegym.runtimes.admission import configure_admission

log = logging.getLogger("tracegym.interop.openenv_worker")

HEAD = struct.Struct("!IQB")
"""A message's head: the length of what follows, its request number, its code (an op, or a reply's flags)."""
PART = struct.Struct("!I")
"""The length of one frame within a message."""
SID_BYTES = 32
"""A session id's length (uuid4 hex)."""
ASK, DROP = 1, 2
"""The server's ops."""
GOES_ON, STARTS, MOVES, READY = 1, 2, 4, 8
"""A reply's flags (READY: the worker's first message)."""


class Wire(asyncio.Protocol):
    """One end of the server-worker socket: each whole message in goes to `receive(number, code, body)`; `lost()`
    when the socket closes."""

    def __init__(self, receive: Callable[[int, int, bytes], None], lost: Callable[[], None]) -> None:
        self.receive, self.lost = receive, lost
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.outgoing: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is one, though no subclass of it)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        at, size = 0, len(buffer)
        while size - at >= HEAD.size:
            length, number, code = HEAD.unpack_from(buffer, at)
            end = at + HEAD.size + length
            if end > size:
                break
            self.receive(number, code, bytes(buffer[at + HEAD.size:end]))
            at = end
        if at:
            del buffer[:at]

    def send(self, number: int, code: int, body: bytes, alone: bool = False) -> None:
        """Queue a message: those sent in one turn of the event loop go out in one write (one system call). `alone`:
        the sender knows of no other message due this turn, so it goes out now (unless some are queued already),
        sparing the loop a turn."""
        if not self.outgoing:
            if alone:
                transport = self.transport
                if transport is not None and not transport.is_closing():
                    transport.write(HEAD.pack(len(body), number, code) + body)
                return
            asyncio.get_running_loop().call_soon(self._flush)
        self.outgoing += (HEAD.pack(len(body), number, code), body)

    def _flush(self) -> None:
        outgoing, self.outgoing = self.outgoing, []
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(b"".join(outgoing))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.lost()


def pack_frames(frames: Sequence[bytes]) -> bytes:
    return b"".join(PART.pack(len(f)) + f for f in frames)


def unpack_frames(body: bytes | memoryview) -> list[bytes]:
    frames, at = [], 0
    while at < len(body):
        (length,) = PART.unpack_from(body, at)
        frames.append(bytes(body[at + PART.size:at + PART.size + length]))
        at += PART.size + length
    return frames


class SessionHost:
    """The sessions of one worker, by id, answering their frames (`answers`); `wire` is its socket to the server."""

    def __init__(self, taskset: Taskset, settings: OpenEnvSettings, runner: Runner | None = None) -> None:
        self.taskset, self.picker = taskset, TaskPicker(taskset)
        self.answers = SessionAnswers(self.picker, settings.max_frame_bytes)
        self.runner = runner
        self.sessions: dict[bytes, TasksetSession] = {}
        self.jobs: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()
        self.wire = Wire(self.receive, self.closed.set)

    def receive(self, number: int, code: int, body: bytes) -> None:
        sid = body[:SID_BYTES]
        if code == DROP:
            session = self.sessions.pop(sid, None)
            if session is not None:
                self._spawn(session.close())
        else:
            self._spawn(self._ask(number, sid, unpack_frames(memoryview(body)[SID_BYTES:])))

    def _spawn(self, job: Any) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self.jobs.add(task)
        task.add_done_callback(self.jobs.discard)

    async def _ask(self, number: int, sid: bytes, frames: list[bytes]) -> None:
        session = self.sessions.get(sid)
        if session is None:
            session = self.sessions[sid] = TasksetSession(self.taskset, self.picker, runner=self.runner)
        flags, body = 0, b""
        for frame in frames:
            flags, body = await self._one(session, frame)
        self.wire.send(number, flags, body, alone=len(self.jobs) == 1)  # (this job the only one: one caller)

    async def _one(self, session: TasksetSession, frame: bytes) -> tuple[int, bytes]:
        episodes, moves = session.episodes, session.moves
        reply, goes_on = await self.answers.answer(session, frame)
        body = b"" if reply is None else json.dumps(reply).encode()
        flags = GOES_ON if goes_on else 0
        if session.episodes != episodes and session.choice is not None:
            pinned = json.dumps({"type": "reset", "data": session.choice.model_dump(exclude_none=True)}).encode()
            return flags | STARTS, PART.pack(len(pinned)) + pinned + body
        return flags | (MOVES if session.moves != moves else 0), body

    async def serve(self, sock: socket.socket) -> None:
        """Answer on `sock` until it closes."""
        await asyncio.get_running_loop().create_connection(lambda: self.wire, sock=sock)
        self.wire.send(0, READY, b"")
        await self.closed.wait()
        for session in list(self.sessions.values()):
            await session.close()


def runner_for(taskset: Taskset, settings: OpenEnvSettings) -> Runner | None:
    """A multi-agent taskset's episodes with the agent in `settings.seat` (None: a single-agent one's rollouts)."""
    from tracegym.interop.openenv_server import opponent_seats  # the refusal of a taskset it cannot serve, one place

    others = opponent_seats(taskset, settings)
    return in_episodes(taskset, settings.seat, others) if others and settings.seat else None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of a worker process (`python -m tracegym.interop.openenv_worker`, started by its server)."""
    parser = argparse.ArgumentParser(prog="tracegym.interop.openenv_worker")
    parser.add_argument("--fd", type=int, required=True, help="the socket to the server")
    parser.add_argument("--taskset", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--settings", default="{}", help="the server's OpenEnvSettings, JSON")
    parser.add_argument("--share", type=int, default=1, help="worker processes sharing the host's sandbox limits")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    processes.die_with_parent(signal.SIGTERM)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s openenv-worker %(levelname)s %(message)s")
    configure_admission(None, args.share)
    taskset = load_taskset(args.taskset, json.loads(args.options) or None)
    settings = OpenEnvSettings.model_validate_json(args.settings)
    host = SessionHost(taskset, settings, runner_for(taskset, settings))
    log.info("OpenEnv worker (pid %d) serving %s", os.getpid(), taskset.id)
    with asyncio.Runner() as loop:
        loop.run(host.serve(socket.socket(fileno=args.fd)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
