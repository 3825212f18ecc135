"""OpenEnv workers: the worker processes (`openenv_worker`) an OpenEnv server keeps its sessions in, as the server
reaches them: each session lives in one worker, and the server passes its client's frames to it and its answers
back over the worker's socket, unread (`RemoteSession`).

So task code that ends its process (`os._exit`, a crash, the OOM killer) costs its own session only. The server
keeps each session's episode as the frames that replay it (its reset, pinned to its task, and the turns since); when
a worker dies, a new one takes its place and each of its sessions is replayed into the new one before its next
frame, so its client never notices (an episode whose task draws at random may draw otherwise the second time). A
frame that was being answered when a worker died is asked again with no other frame in flight on the new worker;
if that worker dies too, the frame is the cause: its client gets an EXECUTION_ERROR frame saying so, and the session
goes on without an episode.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from openenv.core.env_server.types import WSErrorCode

from tracegym.interop.openenv_protocol import error_frame
from tracegym.interop.openenv_settings import OpenEnvSettings
from tracegym.interop.openenv_worker import (
    ASK,
    DROP,
    GOES_ON,
    MOVES,
    PART,
    READY,
    STARTS,
    Wire,
    pack_frames,
)

log = logging.getLogger("tracegym.interop.openenv_workers")

MAX_DEATHS = 4
"""Worker deaths one frame may meet before its session is told its episode is lost, whatever the cause."""
STOP_S = 5.0
"""How long a worker may take to end once its socket is closed before it is killed."""


class WorkerDied(Exception):
    """The worker died: `sent` when the frame asked was in flight on it (else it was never sent)."""

    def __init__(self, why: str, sent: bool) -> None:
        super().__init__(why)
        self.why, self.sent = why, sent


class Process:
    """A started worker: how it ended, and how to end it."""

    def __init__(self, ended: Callable[[], Awaitable[str]], stop: Callable[[], Awaitable[None]],
                 pid: int | None = None) -> None:
        self.ended, self.stop, self.pid = ended, stop, pid


Start = Callable[["WorkerLink"], Awaitable[Process]]
"""Starts a worker whose socket's server end is the link (`loop.create_connection(lambda: link.wire, sock=...)`)."""


class WorkerLink:
    """The server's end of one worker: its asks in flight by number, and whether it is ready or dead. An ask
    `alone` waits until nothing else is in flight, and holds others back until it is answered."""

    def __init__(self) -> None:
        self.wire = Wire(self._receive, self._lost)
        self.pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.numbers = itertools.count(1)
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.death: str | None = None
        self.process: Process | None = None
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once the worker has died and every ask in flight on it has been told."""
        self.watch: asyncio.Task[None] | None = None
        self.dying: asyncio.Task[None] | None = None
        self.successor: asyncio.Future[WorkerLink] = asyncio.get_running_loop().create_future()
        """The worker that takes this one's place once it died."""
        self.sessions = 0
        self.asked = 0
        """Asks sent to the worker."""
        self.alone = asyncio.Lock()
        self.exclusive: asyncio.Future[None] | None = None
        """Set while an ask alone waits for quiet or is answered."""
        self.quiet: asyncio.Future[None] | None = None
        """Set when an ask alone waits for the asks in flight to be answered."""

    async def ask(self, sid: bytes, frames: list[bytes], alone: bool = False) -> tuple[int, bytes]:
        """The worker's answer (flags, body) to the last of `frames`; WorkerDied if it dies first."""
        if not self.ready.done():
            await asyncio.shield(self.ready)
        while self.exclusive is not None:
            await asyncio.shield(self.exclusive)
        if not alone:
            return await self._send(sid, frames)
        async with self.alone:
            self.exclusive = asyncio.get_running_loop().create_future()
            try:
                if self.pending:
                    self.quiet = asyncio.get_running_loop().create_future()
                    await self.quiet
                return await self._send(sid, frames)
            finally:
                self.exclusive.set_result(None)
                self.exclusive = None

    async def _send(self, sid: bytes, frames: list[bytes]) -> tuple[int, bytes]:
        if self.death is not None:
            raise WorkerDied(self.death, sent=False)
        number = next(self.numbers)
        self.asked += 1
        alone = not self.pending  # nothing else in flight: most likely one caller, so no batch to wait for
        self.pending[number] = future = asyncio.get_running_loop().create_future()
        self.wire.send(number, ASK, sid + pack_frames(frames), alone)
        return await future

    def drop(self, sid: bytes) -> None:
        if self.death is None:
            self.wire.send(0, DROP, sid)

    def _receive(self, number: int, code: int, body: bytes) -> None:
        if number == 0 and code == READY:
            if not self.ready.done():
                self.ready.set_result(None)
            return
        future = self.pending.pop(number, None)
        if future is not None and not future.done():
            future.set_result((code, body))
        if not self.pending and self.quiet is not None and not self.quiet.done():
            self.quiet.set_result(None)

    def _lost(self) -> None:
        if self.dying is not None:
            return
        if self.death is None:
            self.death = "its socket closed"
        self.dying = asyncio.get_running_loop().create_task(self._died())

    async def _died(self) -> None:
        if self.process is not None:
            self.death = await self.process.ended()
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(WorkerDied(self.death or "it died", sent=True))
        if self.quiet is not None and not self.quiet.done():
            self.quiet.set_result(None)
        if not self.ready.done():
            self.ready.set_result(None)  # its asks find it dead
        if not self.gone.done():
            self.gone.set_result(None)


class SessionWorkers:
    """`async with SessionWorkers(id, options, settings).running() as workers:` `settings.workers` worker processes
    for the block, each dead one replaced; `workers.session()`: a new session in the one holding fewest."""

    def __init__(self, taskset_id: str, options: dict[str, Any], settings: OpenEnvSettings,
                 start: Start | None = None) -> None:
        self.settings = settings
        self.command = [sys.executable, "-m", "tracegym.interop.openenv_worker", "--taskset", taskset_id,
                        "--options", json.dumps(options), "--settings", settings.model_dump_json(),
                        "--share", str(settings.workers)]
        self.start = start or self._start_process
        self.links: list[WorkerLink] = []
        self.deaths = 0

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SessionWorkers]:
        try:
            self.links = [await self._launch() for _ in range(self.settings.workers)]
            await asyncio.gather(*(link.ready for link in self.links))
            dead = [link.death for link in self.links if link.death is not None]
            if dead:
                raise RuntimeError(f"an OpenEnv worker process did not start ({dead[0]}); see its log above")
            yield self
        finally:
            links, self.links = self.links, []
            await asyncio.gather(*(link.process.stop() for link in links if link.process is not None))
            await asyncio.gather(*(link.watch for link in links if link.watch is not None))  # each sees it stopped

    def session(self) -> RemoteSession:
        link = min(self.links, key=lambda link: link.sessions)
        return RemoteSession(link)

    async def _launch(self) -> WorkerLink:
        """A new worker, replaced once it dies while it serves."""
        link = WorkerLink()
        link.process = await self.start(link)
        link.watch = asyncio.get_running_loop().create_task(self._replace(link))
        return link

    async def _replace(self, link: WorkerLink) -> None:
        await asyncio.shield(link.gone)
        if link not in self.links:  # stopped with the server
            link.successor.set_exception(WorkerDied("the server is stopping", sent=False))
            link.successor.exception()  # (retrieved: nobody may be waiting)
            return
        self.deaths += 1
        log.warning("an OpenEnv worker died (%s) holding %d session(s): starting another", link.death, link.sessions)
        successor = WorkerLink()
        self.links[self.links.index(link)] = successor
        link.successor.set_result(successor)
        try:
            successor.process = await self.start(successor)
        except Exception as exc:  # (no process: its sessions' frames are answered with an error)
            log.error("could not start an OpenEnv worker in place of a dead one: %s", exc)
            successor.death = f"its replacement could not start: {exc}"
            successor.ready.set_result(None)
            successor.successor.set_exception(WorkerDied(successor.death, sent=False))
            successor.successor.exception()
            return
        successor.watch = asyncio.get_running_loop().create_task(self._replace(successor))

    async def _start_process(self, link: WorkerLink) -> Process:
        parent, child = socket.socketpair()
        # its own session: a signal to the server's process group (a terminal's, a supervisor's) is the server's to
        # handle, never a worker "death" to replace while the server stops; the server's end kills it (its parent
        # gone: SIGTERM, see `openenv_worker.main`)
        process = await asyncio.create_subprocess_exec(*self.command, "--fd", str(child.fileno()),
                                                       pass_fds=(child.fileno(),), start_new_session=True)
        child.close()
        await asyncio.get_running_loop().create_connection(lambda: link.wire, sock=parent)

        async def ended() -> str:
            code = await process.wait()
            return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

        async def stop() -> None:
            if link.wire.transport is not None:
                link.wire.transport.close()
            try:
                await asyncio.wait_for(process.wait(), STOP_S)
            except TimeoutError:
                process.kill()
                await process.wait()
        return Process(ended, stop, process.pid)


class RemoteSession:
    """A session held by a worker: its client's frames go there and its answers come back, unread, as text; its
    episode is kept as the frames that replay it."""

    def __init__(self, link: WorkerLink) -> None:
        self.link = link
        self.sid = uuid.uuid4().hex.encode()
        self.episode: list[bytes] = []
        """The frames that replay the session's episode (its pinned reset, then its turns)."""
        self.moved = False
        """Whether the session's worker was replaced since its last answer (its episode is replayed first)."""
        link.sessions += 1

    async def answer(self, frame: bytes) -> tuple[str | None, bool]:
        """The reply's JSON text (None: none) to one frame, and whether the session goes on."""
        alone = False
        for _ in range(MAX_DEATHS):
            try:
                await self._follow()
                flags, body = await self.link.ask(self.sid, [*self.episode, frame] if self.moved else [frame], alone)
            except WorkerDied as died:
                if died.sent and alone:
                    self.episode, self.moved = [], True
                    return json.dumps(error_frame(WSErrorCode.EXECUTION_ERROR, (
                        f"this session's worker died ({died.why}) answering this frame, then a new worker died too "
                        "answering it alone: the frame is taken for the cause and the episode is lost (send `reset` "
                        "to start another); the server's other sessions go on"))), True
                alone = alone or died.sent
                continue
            self.moved = False
            return self._kept(frame, flags, body), bool(flags & GOES_ON)
        self.episode, self.moved = [], True
        lost = (f"this session's worker died {MAX_DEATHS} times answering this frame: the episode is lost (send "
                "`reset` to start another)")
        return json.dumps(error_frame(WSErrorCode.EXECUTION_ERROR, lost)), True

    async def rpc(self, request: dict[str, Any]) -> dict[str, Any]:
        """One MCP JSON-RPC call in the session (over HTTP): its JSON-RPC answer (an error frame's as an error)."""
        text, _ = await self.answer(json.dumps({"type": "mcp", "data": request}).encode())
        reply = json.loads(text or "{}")
        if reply.get("type") == "mcp":
            return dict(reply["data"])
        return {"jsonrpc": "2.0", "id": request.get("id"), "error": {"code": -32603, "message": str(
            reply.get("data", {}).get("message", reply))}}

    async def close(self) -> None:
        """End the session in its worker."""
        self.link.drop(self.sid)
        self.link.sessions -= 1

    async def _follow(self) -> None:
        """Move to the worker that replaced this session's dead one (its episode to be replayed there)."""
        link = self.link
        while link.death is not None:
            link = await asyncio.shield(link.successor)
        if link is not self.link:
            self.link.sessions -= 1
            self.link, self.moved = link, True
            link.sessions += 1

    def _kept(self, frame: bytes, flags: int, body: bytes) -> str | None:
        """The reply's text, keeping the episode's frames as the flags say."""
        if flags & STARTS:
            (length,) = PART.unpack_from(body)
            self.episode = [body[PART.size:PART.size + length]]
            body = body[PART.size + length:]
        elif flags & MOVES:
            self.episode.append(frame)
        return body.decode() if body else None
