"""Env server: a ROUTER socket that answers `health`, `info`, `run` and `cancel` for one taskset.

The server process only routes and supervises. `run` payloads go unread to the least-loaded worker over a
backend ROUTER (ipc), and the worker's packed reply goes back to the client unread. Every request gets exactly
one reply, and a request counts against its client's byte budget and the server's until then (`serve.budget`).
A worker that dies is noticed on the next supervision tick (0.1 s); a warm spare takes its place at once and a
new spare starts (`serve.pool`). Which of its requests killed it is unknown, so each becomes a *suspect*: they
rerun together on a worker reserved for them (nothing else runs there: the spare, idle, takes them at once), and
should that worker die too, in two halves, each group on a worker of its own, so every further death narrows the
cause down until a request kills a worker it ran on alone. That poison request is answered with a `WorkerDied`
error (kind `task`: it is the task's code that ends its process) once it has done so `max_redispatch` + 1 times;
its neighbours finish, and the other workers keep serving new requests meanwhile. Busy workers are asked every
few seconds which requests they hold: one they lost is re-dispatched (at most `max_redispatch` times), and a
worker that leaves the question unanswered for `worker_timeout` is killed as hung, its requests then handled like
a dead worker's; a starting worker not ready within `worker_timeout` (at least 60 s) is killed as a failed start.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from pydantic import ValidationError
from zmq.utils.monitor import parse_monitor_message

from tracegym.core.errors import ErrorKind, UsageError
from tracegym.envs.evaluate import multi_agent_class
from tracegym.envs.group_scoring import group_scorers
from tracegym.envs.harness_choice import HarnessChoice
from tracegym.envs.multi_agent import is_multi_agent
from tracegym.envs.registry import load_taskset
from tracegym.envs.taskset import Taskset
from tracegym.runtimes.admission import AdmissionConfig, per_process_starts
from tracegym.runtimes.processes import Parent
from tracegym.serve.budget import MAX_OPEN_BYTES, MAX_PEER_BYTES, MAX_SERVER_BYTES, Budget
from tracegym.serve.curve import HANDSHAKE_FAILED, Gatekeeper, guard_server, shared_secret
from tracegym.serve.pool import MAX_ABANDONED_THREADS, START_TIMEOUT, PoolSize, WorkerHandle, WorkerPool
from tracegym.serve.task_rows import TaskRows
from tracegym.serve.wire import (
    MAX_FRAME_BYTES,
    MAX_PENDING_CHECK,
    OVER_BUDGET,
    PROTOCOL,
    SECRET_ENV,
    ZERO_COPY_BYTES,
    Request,
    WireError,
    decode_request,
    error_reply,
    is_loopback,
    ok_reply,
    unpack,
)
from tracegym.serve.worker_protocol import CANCEL, JOBS, JOBS_ASKED, READY, REPLACE, REPLY, RUN, STOP

SUPERVISE_EVERY = 0.1
"""Seconds between checks for dead workers and pool size."""
AUDIT_EVERY = 2.0
"""Most seconds between asking each busy worker which requests it still runs (a lost one is re-dispatched; a
worker that does not answer within `worker_timeout` is taken as hung and killed)."""
WORKER_TIMEOUT = 60.0
"""Default seconds a busy worker may leave "which requests do you hold?" unanswered before it is killed as hung."""
FRAME_MARGIN = 64 * 1024
"""Bytes past the request size limit a single frame may have before libzmq cuts its connection unanswered: room
for a request's envelope, so a request just over the limit is answered `TooLarge` rather than cut."""
HWM = 100_000
"""Queued messages per peer before ZMQ would drop (ROUTER) or block; far above any sane concurrency."""


@dataclass
class InFlight:
    """A `run` request the server owes a reply: who asked, what, and which worker has it (None: queued)."""

    client: bytes
    id: str
    payload: bytes | memoryview
    size: int = 0
    """Bytes it counts against its client's budget and the server's (header and payload, as received)."""
    worker: bytes | None = None
    kills: int = 0
    """Times a worker died (or hung) running it and nothing else: each names it as the cause."""
    lost: int = 0
    """Times a live worker lost it."""
    suspect: bool = False
    """It was on a worker that died: from then on it runs only in its group, on a worker reserved for it."""


class EnvServer:
    """`server = EnvServer("reverse-text"); address = server.bind(); server.serve()` (blocks until `stop()`)."""

    def __init__(self, taskset_id: str, taskset_options: dict[str, Any] | None = None, *,
                 address: str = "tcp://127.0.0.1:0", size: PoolSize | None = None, secret: str | None = None,
                 log_dir: Path | None = None, max_request_bytes: int = MAX_FRAME_BYTES, max_redispatch: int = 2,
                 worker_timeout: float = WORKER_TIMEOUT, exit_with_parent: bool = False,
                 max_abandoned_threads: int = MAX_ABANDONED_THREADS, max_open_bytes: int = MAX_OPEN_BYTES,
                 max_peer_bytes: int = MAX_PEER_BYTES, max_server_bytes: int = MAX_SERVER_BYTES,
                 sandbox: AdmissionConfig | None = None, runtime: str | None = None,
                 harness: HarnessChoice | None = None) -> None:
        self.options = dict(taskset_options or {})
        self.runtime = runtime
        """The runtime every task's sandbox opens in (`Taskset.with_runtime`); None: each task class's choice."""
        self.harness = harness
        """The program that drives every rollout (`Taskset.with_harness`); None: each task class's harness."""
        self.taskset = load_taskset(taskset_id, self.options or None).with_runtime(runtime).with_harness(harness)
        # (a bad taskset, option, runtime or harness fails here, before any worker starts)
        group_scorers(self.taskset)  # so does a group reward it cannot run (on a multi-agent taskset)
        self.rows = TaskRows(self.taskset)
        self.taskset_id, self.address, self.size = taskset_id, address, size or PoolSize.static()
        self.sandbox = sandbox
        """How the workers admit sandboxes, together (`runtimes.admission`); None: the host's defaults."""
        per_process_starts(sandbox or AdmissionConfig(), self.size.most)  # a cap too small to split fails here
        self.secret = shared_secret(secret)
        if not is_loopback(address) and not self.secret:
            raise UsageError(f"binding {address} (not loopback) needs a shared secret: set {SECRET_ENV}")
        self.log_dir, self.max_request_bytes, self.max_redispatch = log_dir, max_request_bytes, max_redispatch
        self.budget = Budget.for_server(secret=bool(self.secret), open_bytes=max_open_bytes, peer_bytes=max_peer_bytes,
                                        server_bytes=max_server_bytes)
        self.budget.check_fits(max_request_bytes)
        if worker_timeout <= 0:
            raise UsageError(f"worker_timeout must be positive, got {worker_timeout}")
        self.worker_timeout, self.max_abandoned_threads = worker_timeout, max_abandoned_threads
        self.start_timeout = max(worker_timeout, START_TIMEOUT)  # a short hang check must not cut a slow import
        self.stats = collections.Counter[str]()
        self.inflight: dict[bytes, InFlight] = {}
        self.index: dict[tuple[bytes, str], bytes] = {}
        self.pending: collections.deque[bytes] = collections.deque()
        self.suspects: collections.deque[list[bytes]] = collections.deque()
        """Groups of suspect requests waiting for a worker of their own, the next to run first."""
        self._keys = 0
        self._stopping = False
        self._parent = Parent() if exit_with_parent else None
        self._ctx: zmq.Context | None = None
        self._gatekeeper: Gatekeeper | None = None
        self._tmp: str | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    def bind(self) -> str:
        """Bind the client and worker sockets; returns the client address (a real port for port 0)."""
        self._ctx = zmq.Context()
        self.frontend = self._socket(zmq.ROUTER)
        # A frame past this hard cap (handshake commands included) is cut by libzmq as its header arrives, before
        # its sender is known or authenticated: it costs no memory and cannot be answered (it shows as a closed
        # connection). A frame within the margin past the limit is still answered (`TooLarge`). The cap is per
        # frame: libzmq takes in a message of many frames whole; only the handshake (a secret) keeps that out.
        self.frontend.setsockopt(zmq.MAXMSGSIZE, self.max_request_bytes + FRAME_MARGIN)
        if self.secret:  # peers without it are refused in the handshake: none of their messages is handed over
            self._gatekeeper = Gatekeeper(self._ctx, self.secret)
            guard_server(self.frontend, self.secret)
        self.connections = self.frontend.get_monitor_socket(HANDSHAKE_FAILED | zmq.EVENT_DISCONNECTED)
        host, _, port = self.address.rpartition(":")
        self.frontend.bind(f"{host}:*" if port == "0" else self.address)
        self.bound = self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)
        self.backend = self._socket(zmq.ROUTER)
        self.backend.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._tmp = tempfile.mkdtemp(prefix="tracegym-serve-")
        self.backend.bind(f"ipc://{self._tmp}/backend")
        self.pool = WorkerPool(self.taskset_id, self.options, f"ipc://{self._tmp}/backend", self.size, self.log_dir,
                               self.max_abandoned_threads, start_timeout=self.start_timeout, sandbox=self.sandbox,
                               runtime=self.runtime, harness=self.harness)
        return self.bound

    def _socket(self, kind: int) -> zmq.Socket:
        assert self._ctx is not None
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, HWM)
        sock.setsockopt(zmq.RCVHWM, HWM)
        return sock

    def stop(self) -> None:
        """Ask `serve()` to return (safe from a signal handler or another thread)."""
        self._stopping = True

    def serve(self) -> None:
        """Route and supervise until `stop()`; then stop every worker and close the sockets."""
        if self._ctx is None:
            self.bind()
        poller = zmq.Poller()
        poller.register(self.frontend, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        poller.register(self.connections, zmq.POLLIN)
        if self._gatekeeper is not None:
            poller.register(self._gatekeeper.socket, zmq.POLLIN)
        next_check = next_audit = 0.0
        try:
            while not self._stopping:
                events = dict(poller.poll(int(SUPERVISE_EVERY * 1000)))
                if self.backend in events:
                    self._drain(self.backend, self._on_worker)
                if self.frontend in events:
                    self._drain(self.frontend, self._on_client, copy=False)
                if self.connections in events:
                    self._drain(self.connections, self._on_connection)
                if self._gatekeeper is not None and self._gatekeeper.socket in events:
                    self._gatekeeper.answer()
                if time.monotonic() >= next_check:
                    self._supervise()
                    next_check = time.monotonic() + SUPERVISE_EVERY
                if time.monotonic() >= next_audit:
                    self._audit()
                    next_audit = time.monotonic() + min(AUDIT_EVERY, self.worker_timeout / 4)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self.pool.stop_all()
        self.frontend.disable_monitor()
        self.connections.close(0)
        self.frontend.close(0)
        self.backend.close(0)
        if self._gatekeeper is not None:
            self._gatekeeper.close()
        if self._ctx is not None:
            self._ctx.term()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    @staticmethod
    def _drain(sock: zmq.Socket, handle: Any, most: int = 1000, copy: bool = True) -> None:
        for _ in range(most):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                return
            handle(frames)

    # --- clients -----------------------------------------------------------------------------------------
    def _on_client(self, message: list[zmq.Frame]) -> None:
        """Answer (or route) one client message, its frames as libzmq holds them: a large payload is never copied,
        and one refused is freed as soon as it is dropped."""
        client = message[0].bytes
        frames = [f.bytes if len(f) < ZERO_COPY_BYTES else f.buffer for f in message[1:]]
        try:
            request = decode_request(frames, max_bytes=self.max_request_bytes)
        except WireError as exc:
            self.stats["oversized" if exc.error_type == "TooLarge" else "malformed"] += 1
            self._send(client, error_reply(exc.request_id, exc.error_type, str(exc), ErrorKind.TASK))
            return
        if request.method == "run":
            self._submit(client, request, len(frames[0]) + len(frames[1]))
        elif request.method == "cancel":
            self._cancel(client, request)
        elif request.method == "rows":
            self._send_rows(client, request)
        elif request.method == "health":
            self._send(client, ok_reply(request.id, {**self.health(), **self._unknown(client, request.payload)}))
        else:
            self._send(client, ok_reply(request.id, self.info()))

    def _send_rows(self, client: bytes, request: Request) -> None:
        """Answer a `rows` request: the taskset's rows at the positions it names (`TaskRows`)."""
        try:
            self._send(client, ok_reply(request.id, self.rows.rows(request.id, unpack(request.payload))))
        except (WireError, ValueError) as exc:  # a malformed payload is the client's error, never the server's end
            self._send(client, error_reply(request.id, "BadRequest", str(exc), ErrorKind.TASK))

    def _on_connection(self, frames: list[bytes]) -> None:
        """Count a connection event: a peer refused in its handshake (without the shared secret, or not speaking
        ZMTP), or a connection that ended (its peer left, or libzmq cut it over a frame past the hard cap)."""
        event = parse_monitor_message(frames)["event"]
        self.stats["connections_closed" if event == zmq.EVENT_DISCONNECTED else "handshakes_failed"] += 1

    def _send(self, client: bytes, frames: list[bytes]) -> None:
        try:
            self.frontend.send_multipart([client, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:
            self.stats["undeliverable"] += 1

    def health(self) -> dict[str, Any]:
        """Liveness and load: workers by state, requests in flight and queued, counters."""
        queued = len(self.pending) + sum(len(group) for group in self.suspects)
        suspects = sum(1 for record in self.inflight.values() if record.suspect)
        return {"ok": True, "pid": os.getpid(), "workers": self.pool.counts(), "pids": self.pool.pids(),
                "spares": self.pool.spare_pids(), "in_flight": len(self.inflight), "queued": queued,
                "suspects": suspects, "held_bytes": self.budget.held_total,
                "stats": {**self.stats, "spares_promoted": self.pool.promoted}}

    def _unknown(self, client: bytes, payload: bytes | memoryview) -> dict[str, Any]:
        """For a health ping listing the client's pending request ids: those this server has no record of."""
        try:
            pending = unpack(payload).get("pending")
        except Exception:  # a client's malformed payload must not kill the server
            return {}
        if not isinstance(pending, list):
            return {}
        return {"unknown": [i for i in pending[:MAX_PENDING_CHECK] if (client, i) not in self.index]}

    def info(self) -> dict[str, Any]:
        """What this server runs: taskset id and resolved config, task type, whether it is finite and its size
        (None: endless), a multi-agent taskset's members in seat order, the pool."""
        ts = self.taskset
        return {"protocol": PROTOCOL, "taskset": ts.id, "spec": self.taskset_id,
                "config": ts.config.model_dump(mode="json"), "task_type": _qualname(ts.task_class),
                "data_type": _qualname(ts.data_class), "finite": ts.bounded, **self.rows.describe(),
                "members": [m.id for m in multi_agent_class(ts).seats] if is_multi_agent(ts) else [],
                "capacity": _capacity(ts),
                "defaults": _defaults(ts),
                "description": ts.description,
                "workers": self.pool.counts()["ready"], "spare_workers": self.size.spares, "min_workers": self.size.min,
                "max_workers": self.size.max or self.size.min, "elastic": self.size.elastic,
                "max_request_bytes": self.max_request_bytes, "budget_bytes": self.budget.per_peer,
                "server_budget_bytes": self.budget.total}

    def _submit(self, client: bytes, request: Request, size: int) -> None:
        if (client, request.id) in self.index:
            self._send(client, error_reply(request.id, "BadRequest", "request id already in flight", ErrorKind.TASK))
            return
        if self.pool.failing and not self.pool.counts()["ready"]:
            self._send(client, error_reply(request.id, "WorkersFailing", self._failing_message()))
            return
        refusal = self.budget.refusal(client, size)
        if refusal is not None:  # dropped here: what the server holds stays within its budget
            self.stats["over_budget"] += 1
            self._send(client, error_reply(request.id, OVER_BUDGET, refusal))
            return
        self.stats["run_requests"] += 1
        self._keys += 1
        key = self._keys.to_bytes(8, "big")
        self.inflight[key] = InFlight(client, request.id, request.payload, size)
        self.budget.take(client, size)
        self.index[(client, request.id)] = key
        self._dispatch(key)

    def _cancel(self, client: bytes, request: Request) -> None:
        try:
            target = unpack(request.payload).get("id")
        except Exception:  # a client's malformed payload must not kill the server
            target = None
        key = self.index.get((client, target)) if isinstance(target, str) else None
        record = self.inflight.get(key) if key else None
        if key is not None and record is not None:
            if record.worker is None:
                self._answer(key, error_reply(record.id, "Cancelled", "the request was cancelled"))
            else:
                self._to_worker(record.worker, [CANCEL, key])
        self._send(client, ok_reply(request.id, {"cancelled": record is not None}))

    def _answer(self, key: bytes, frames: list[bytes]) -> None:
        record = self.inflight.pop(key)
        self.index.pop((record.client, record.id), None)
        self.budget.release(record.client, record.size)
        if record.worker is not None:
            self.pool.release(record.worker, key)
        else:  # queued (cancelled, or a dead worker's reply that arrived after its death was handled)
            self._unqueue(key)
        self._send(record.client, frames)

    def _unqueue(self, key: bytes) -> None:
        """Take a request out of the queue it waits in: pending, or its group of suspects."""
        for queue in (self.pending, *self.suspects):
            if key in queue:
                queue.remove(key)
                return

    # --- workers -----------------------------------------------------------------------------------------
    def _dispatch(self, key: bytes, *, first: bool = False) -> bool:
        """Send a request to the least-loaded worker; False when none took it (queued again, at the front when
        `first`)."""
        handle = self.pool.pick()
        if handle is None or not self._send_run(handle, key):
            if first:
                self.pending.appendleft(key)
            else:
                self.pending.append(key)
            return False
        return True

    def _send_run(self, handle: WorkerHandle, key: bytes) -> bool:
        record = self.inflight[key]
        if not self._to_worker(handle.name, [RUN, key, record.id.encode(), record.payload],
                               copy=len(record.payload) < ZERO_COPY_BYTES):
            return False
        record.worker = handle.name
        self.pool.assign(handle, key)
        return True

    def _to_worker(self, name: bytes, frames: list[bytes | memoryview], copy: bool = True) -> bool:
        try:
            self.backend.send_multipart([name, *frames], zmq.NOBLOCK, copy=copy)
            return True
        except zmq.ZMQError:  # the worker is gone (ROUTER_MANDATORY): supervision will notice
            return False

    def _flush_pending(self) -> None:
        """Start waiting groups of suspects, then dispatch queued requests in order; stop at the first refusal
        (a dead worker not reaped yet would otherwise be picked again and again)."""
        self._place_suspects()
        while self.pending and self.pool.pick() is not None:
            if not self._dispatch(self.pending.popleft(), first=True):
                return

    def _place_suspects(self) -> None:
        """Send each waiting group of suspects, the next first, to an idle worker reserved for it; once none waits,
        a reserved worker that runs no suspect (idle, or still draining) goes back to serving every request."""
        while self.suspects:
            if not self.suspects[0]:
                self.suspects.popleft()
                continue
            handle = self._isolation_worker()
            if handle is None:
                break
            group = self.suspects.popleft()
            self.stats["isolated_runs"] += 1
            for n, key in enumerate(group):
                if not self._send_run(handle, key):  # it is gone: supervision will notice
                    self.suspects.appendleft(group[n:])
                    return
        if not self.suspects:
            for handle in self.pool.workers.values():
                if handle.isolating and not self._runs_suspects(handle):
                    handle.isolating = False

    def _isolation_worker(self) -> WorkerHandle | None:
        """An idle worker for the next group of suspects: one reserved already, else a spare (promoted: it takes
        the place of the worker that died), else an idle one, reserved now (in place of a reserved worker still
        draining, when there is one). Failing those, while fewer than half the ready workers (at least one) are
        reserved, the least loaded is reserved to drain (nothing new is sent to it) and the group waits: for it,
        or for whichever worker comes idle first (a spare that starts, say). None: none idle yet."""
        reserved = [h for h in self.pool.workers.values() if h.isolating and h.ready and not h.retiring]
        idle = next((h for h in reserved if not h.jobs), None)
        if idle is not None:
            return idle
        handle = self.pool.take_spare() or self.pool.pick()
        draining = [h for h in reserved if not self._runs_suspects(h)]
        if handle is not None and not handle.jobs:
            for other in draining[:1]:
                other.isolating = False  # the idle one takes its turn: it goes back to serving
            handle.isolating = True
            return handle
        if handle is None or draining or len(reserved) >= max(1, self.pool.counts()["ready"] // 2):
            return None
        handle.isolating = True
        return None

    def _runs_suspects(self, handle: WorkerHandle) -> bool:
        return any((record := self.inflight.get(key)) is not None and record.suspect for key in handle.jobs)

    def _on_worker(self, frames: list[bytes]) -> None:
        name, kind = frames[0], frames[1] if len(frames) > 1 else b""
        if kind == REPLY and len(frames) == 5:
            record = self.inflight.get(frames[2])
            if record is None:
                return  # answered already (cancelled, or re-dispatched and answered elsewhere)
            if record.worker not in (None, name):
                self._to_worker(record.worker, [CANCEL, frames[2]])
            self.pool.release(name, frames[2])
            self._answer(frames[2], frames[3:])
            handle = self.pool.workers.get(name)
            if handle is not None and handle.isolating and not handle.jobs:
                self._flush_pending()  # its group is done: the next one (or queued requests) may go
            self._stop_if_drained(name)
        elif kind == JOBS:
            self._audited(name, set(frames[2:]))
        elif kind == REPLACE:
            self._replace(name)
        elif kind == READY:
            if not self.pool.mark_ready(name):
                self._to_worker(name, [STOP])
            self._flush_pending()

    def _replace(self, name: bytes) -> None:
        """A worker asked to be replaced (hung sync calls left it too many threads): it gets no new work, a
        replacement starts on the next supervision tick, and it is stopped once its requests are answered."""
        handle = self.pool.workers.get(name)
        if handle is None or handle.retiring:
            return
        self.stats["workers_recycled"] += 1
        handle.retiring = True
        self._stop_if_drained(name)

    def _stop_if_drained(self, name: bytes) -> None:
        handle = self.pool.workers.get(name)
        if handle is not None and handle.retiring and not handle.hung and not handle.jobs:
            self._to_worker(name, [STOP])

    def _supervise(self) -> None:
        if self._stopping:
            return  # a group SIGTERM reaches the workers too: their exits are no reason to start new ones
        if self._parent is not None and not self._parent.alive():
            self.stop()  # whoever started us (an eval, a trainer) is gone, even by kill -9
            return
        for handle in self.pool.reap():
            self._worker_exited(handle)
        for handle in self.pool.scale(len(self.inflight)):
            self._to_worker(handle.name, [STOP])
        if (self.pending or self.suspects) and self.pool.failing and not self.pool.counts()["ready"]:
            queued = [*self.pending, *(key for group in self.suspects for key in group)]
            self.pending.clear()
            self.suspects.clear()
            for key in queued:
                self._answer(key, error_reply(self.inflight[key].id, "WorkersFailing", self._failing_message()))
        self._flush_pending()

    def _audit(self) -> None:
        """Ask each busy worker which of its requests it still runs (the answer comes back as `jobs`); kill one
        that left the last question unanswered for `worker_timeout` (its event loop is stuck): supervision then
        re-dispatches its requests like a crashed worker's."""
        now = time.monotonic()
        for handle in self.pool.workers.values():
            if handle.audit is not None and now - handle.asked_at > self.worker_timeout and not handle.hung:
                self.stats["workers_hung"] += 1
                handle.retiring = handle.hung = True  # not replaced twice; reap() then frees its requests
                handle.proc.kill()
            elif handle.ready and handle.jobs and handle.audit is None and self._to_worker(handle.name, [JOBS_ASKED]):
                handle.audit, handle.asked_at = set(handle.jobs), now

    def _audited(self, name: bytes, held: set[bytes]) -> None:
        """A request the worker had when asked, has not answered and does not hold is lost: frames on one
        connection keep their order, so its reply cannot still be on the way. It is re-dispatched."""
        handle = self.pool.workers.get(name)
        if handle is None or handle.audit is None:
            return
        asked, handle.audit = handle.audit, None
        for key in sorted(asked - held):
            record = self.inflight.get(key)
            if record is not None and record.worker == name:
                self.stats["lost_by_worker"] += 1
                self.pool.release(name, key)
                record.worker, record.lost = None, record.lost + 1
                if record.lost > self.max_redispatch:
                    why = f"worker {name.decode()} lost the request, {record.lost} times"
                    self._answer(key, error_reply(record.id, "WorkerDied", why))
                else:
                    self._requeue([key])
        self._stop_if_drained(name)
        self._flush_pending()

    def _requeue(self, keys: list[bytes]) -> None:
        """Queue requests to be sent again, ahead of the others: suspects as one group, to run on a worker of
        their own; any other request to the front of the pending queue."""
        self.stats["redispatched"] += len(keys)
        if self.inflight[keys[0]].suspect:
            self.suspects.appendleft(keys)
        else:
            self.pending.extendleft(reversed(keys))

    def _worker_exited(self, handle: WorkerHandle) -> None:
        """Queue a dead (or hung, killed) worker's requests again as suspects. When it ran one request alone,
        that one is named as the cause and, past `max_redispatch` retries, answered with a task error. When it
        ran several, none is blamed: they rerun together on a reserved worker (most deaths are not their doing:
        the OOM killer, a kill -9, a lost node), and when they were suspects already (that worker died too), in
        two halves, each group alone on a reserved worker, so the next death narrows the cause down. Retries are
        counted per request: a neighbour's count never moves."""
        if handle.hung:  # counted in workers_hung when it was killed
            why = f"a worker hung (no answer for {self.worker_timeout:g} s, killed) running this request"
        else:
            self.stats["workers_retired" if handle.retiring else "workers_died"] += 1
            why = f"a worker died (exit {handle.proc.returncode}) running this request"
        keys = [k for k in sorted(handle.jobs) if (r := self.inflight.get(k)) is not None and r.worker == handle.name]
        suspected = any(self.inflight[key].suspect for key in keys)
        for key in keys:
            self.inflight[key].worker, self.inflight[key].suspect = None, True
        if keys == [handle.solo]:
            self._blame(keys[0], why)
        elif keys and not suspected:
            self._requeue(keys)
        elif keys:
            half = (len(keys) + 1) // 2
            for group in (keys[half:], keys[:half]):  # each to the front: the first half runs first
                if group:
                    self._requeue(group)

    def _blame(self, key: bytes, why: str) -> None:
        """A request killed a worker it ran on alone: run it alone again, or answer it after its retries."""
        record = self.inflight[key]
        record.kills += 1
        if record.kills <= self.max_redispatch:
            self._requeue([key])
            return
        self.stats["poison_requests"] += 1
        self._answer(key, error_reply(record.id, "WorkerDied", f"{why} alone, {record.kills} times", ErrorKind.TASK))

    def _failing_message(self) -> str:
        where = f" (logs: {self.log_dir})" if self.log_dir else " (see the server's stderr)"
        return (f"workers for taskset {self.taskset_id!r} keep failing to start (exiting, or not ready within "
                f"{self.start_timeout:g} s){where}")


def _capacity(taskset: Taskset) -> int | None:
    """The taskset's own limit on rollouts at once (`Taskset.capacity`), None when it has none or cannot say now."""
    try:
        return taskset.capacity()
    except Exception:  # a remote environment not answering: its rollouts will say so, one by one
        return None


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _defaults(taskset: Taskset) -> dict[str, Any]:
    """The taskset's options at their defaults (a client checks the options it did not give against them); empty
    when its config has a field without one."""
    try:
        return type(taskset).Config().model_dump(mode="json")
    except ValidationError:
        return {}
