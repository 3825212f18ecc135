"""Worker: one env-server worker process, running many rollouts at once on one asyncio loop.

It connects a DEALER socket to the server's backend (run by its event loop, `serve.loop_socket`), says `ready`,
then answers `run` frames with packed traces and obeys `cancel` and `stop`; these messages' names (the worker
protocol, which this module and `serve.env_server` speak) are the constants below. Once hung sync calls have left
it more than `max_abandoned_threads` threads, it says `replace` (once): the server sends it no more work and stops
it when its requests are done.
SIGINT is ignored (the server owns shutdown); SIGTERM, a `stop` frame or the server process disappearing end it
quietly. Started as `python -m tracegym.serve.worker ...` by the pool, on asyncio's own event loop: uvloop's
(0.18 ms less per rollout at c=1) hands `subprocess_exec` a transport that is no `asyncio.SubprocessTransport`,
and the sandboxes' programs are started through asyncio's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence

import zmq
from pydantic import ValidationError

from tracegym.core.episode import SOLO, Episode
from tracegym.core.errors import ErrorKind, UsageError
from tracegym.envs.canary import canary_model
from tracegym.envs.evaluate import check_single_agent, run_episode, scoring_timeout
from tracegym.envs.group_scoring import score_solo_group, scores_groups
from tracegym.envs.harness_choice import HarnessChoice
from tracegym.envs.registry import load_taskset
from tracegym.envs.seats import Seat
from tracegym.envs.taskset import Taskset
from tracegym.envs.thread_lane import TASK_CODE, TOOLS
from tracegym.models.client import ModelClient
from tracegym.models.connect import make_client
from tracegym.models.endpoint import Endpoint
from tracegym.runtimes import processes
from tracegym.runtimes.admission import AdmissionConfig, configure_admission
from tracegym.serve.loop_socket import LoopSocket
from tracegym.serve.model_clients import ModelClients
from tracegym.serve.pool import MAX_ABANDONED_THREADS
from tracegym.serve.run_request import RunRequest
from tracegym.serve.wire import ZERO_COPY_BYTES, error_reply, ok_header, pack, unpack
from tracegym.serve.worker_protocol import CANCEL, JOBS, JOBS_ASKED, READY, REPLACE, REPLY, RUN, STOP

log = logging.getLogger("tracegym.serve.worker")



def make_model(endpoint: Endpoint) -> ModelClient:
    """The live model client a worker builds from an endpoint: chat, or token-in/token-out (`endpoint.client`)."""
    return make_client(endpoint)


class Worker:
    """Runs `run` requests for one taskset; one model client per distinct endpoint (the most recently used kept)."""

    def __init__(self, taskset: Taskset, backend: str, name: str,
                 max_abandoned_threads: int = MAX_ABANDONED_THREADS) -> None:
        self.taskset, self.backend, self.name = taskset, backend, name
        self.max_abandoned_threads = max_abandoned_threads
        self.replacing = False
        """Whether it asked the server to replace it."""
        self.jobs: dict[bytes, asyncio.Task[None]] = {}
        self.cancelled: set[bytes] = set()
        """Jobs the server asked to cancel: the only cancellations answered (any other is this process ending:
        a stop, or its event loop torn down by task code's KeyboardInterrupt; the server reruns what a dead
        worker held, so a `Cancelled` reply would fail a request that did nothing wrong)."""
        self.models = ModelClients(make_model)
        self.stopped = asyncio.Event()
        self.socket: LoopSocket | None = None

    async def serve(self) -> None:
        """Connect, say ready, and handle frames until stopped."""
        ctx = zmq.Context()
        socket = ctx.socket(zmq.DEALER)
        socket.setsockopt(zmq.IDENTITY, self.name.encode())
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)  # replies never wait: what the server sent us bounds them
        socket.connect(self.backend)
        self.socket = LoopSocket(socket, self._handle)
        self.socket.send([READY, str(os.getpid()).encode()])
        await self.stopped.wait()
        for task in self.jobs.values():
            task.cancel()
        await asyncio.gather(*self.jobs.values(), return_exceptions=True)
        await self.models.aclose()
        self.socket.close()
        ctx.term()

    def _handle(self, frames: list[bytes]) -> None:
        assert self.socket is not None
        if self.stopped.is_set():
            return  # stopping: what the server sends now is its to run elsewhere
        kind = frames[0]
        if kind == RUN and len(frames) == 4:
            key, request_id = frames[1], frames[2].decode()
            job = asyncio.create_task(self._run(key, request_id, frames[3]))
            self.jobs[key] = job
            job.add_done_callback(functools.partial(self._finished, key, request_id))
        elif kind == CANCEL and len(frames) == 2 and (running := self.jobs.get(frames[1])):
            self.cancelled.add(frames[1])
            running.cancel()
        elif kind == JOBS_ASKED:  # the server checks that no request it gave us was lost
            self.socket.send([JOBS, *self.jobs])
        elif kind == STOP:
            self.stopped.set()

    def _finished(self, key: bytes, request_id: str, job: asyncio.Task[None]) -> None:
        """Forget a job; one cancelled before its first step (its `cancel` came in the same batch as its `run`)
        never ran `_run`'s handler, so it is answered here: every request gets exactly one reply."""
        self.jobs.pop(key, None)
        self._replace_if_leaking()
        answers = self._answers_cancel(key)  # called either way: it forgets the key
        if job.cancelled() and answers and self.socket is not None:
            reply = error_reply(request_id, "Cancelled", "the request was cancelled")
            self.socket.send([REPLY, key, *reply])

    def _replace_if_leaking(self) -> None:
        """Ask (once) to be replaced when hung sync calls have left too many threads behind."""
        if not self.replacing and TOOLS.abandoned + TASK_CODE.abandoned > self.max_abandoned_threads:
            self.replacing = True
            log.warning("%d threads of hung sync calls left behind; asking to be replaced",
                        TOOLS.abandoned + TASK_CODE.abandoned)
            assert self.socket is not None  # jobs (whose ends call this) run only once connected
            self.socket.send([REPLACE])

    async def _run(self, key: bytes, request_id: str, payload: bytes) -> None:
        assert self.socket is not None
        try:
            frames = [ok_header(request_id), pack(await self._traces(payload))]
        except asyncio.CancelledError:
            if not self._answers_cancel(key):
                raise
            frames = error_reply(request_id, "Cancelled", "the request was cancelled")
        except (ValidationError, ValueError, TypeError, UsageError) as exc:
            frames = error_reply(request_id, "BadRequest", f"bad run payload: {exc}", ErrorKind.TASK)
        except Exception as exc:  # the request boundary: a bug here must still answer, or the server waits for it
            log.exception("run %s failed", request_id)
            frames = error_reply(request_id, "WorkerError", f"{type(exc).__name__}: {exc}")
        self.socket.send([REPLY, key, *frames], copy=len(frames[1]) < ZERO_COPY_BYTES)

    def _answers_cancel(self, key: bytes) -> bool:
        """Whether a cancelled job gets a `Cancelled` reply: only when the server asked, and we are not stopping
        (asked at most once per job: the set forgets it)."""
        asked = key in self.cancelled
        self.cancelled.discard(key)
        return asked and not self.stopped.is_set()

    async def _traces(self, payload: bytes) -> list[dict]:
        """The request's episodes (with `episodes`), or for a plain rollout request each solo episode's trace."""
        request = RunRequest.model_validate(unpack(payload))
        if not request.episodes:
            check_single_agent(self.taskset)
        episodes = await self._episodes(request)
        if request.episodes:
            return [e.model_dump(mode="json") for e in episodes]
        return [e.traces[SOLO].model_dump(mode="json") for e in episodes]

    async def _episodes(self, request: RunRequest) -> list[Episode]:
        """The request's episodes (a single-agent taskset's are its rollouts), each seat's endpoint reached through
        this worker's shared clients; played by the request's canary agent instead, when it names one."""
        async with contextlib.AsyncExitStack() as stack:
            if request.agent is None:
                policy: ModelClient = await stack.enter_async_context(self.models.use(request.endpoint))
            elif (canary := canary_model(request.agent, self.taskset, request.data)) is not None:
                policy = canary
            else:
                return []  # `gold` on a task that has no gold replies: nothing to check
            seats = {}
            for member, seat in request.seats.items():
                model = seat.model if not isinstance(seat.model, Endpoint) else await stack.enter_async_context(
                    self.models.use(seat.model))
                seats[member] = Seat(model=model, script=seat.script, trainable=seat.trainable)
            indices = request.rollout_indices
            if len(indices) == 1:  # the common case: no child task, so no extra trip through the event loop
                done = [await self._one(request, policy, seats, indices[0])]
            else:
                done = list(await asyncio.gather(*(self._one(request, policy, seats, i) for i in indices)))
        if request.group and scores_groups(self.taskset):
            return await score_solo_group(self.taskset, done, scoring_timeout(request.timeouts))
        return done

    async def _one(self, request: RunRequest, policy: ModelClient, seats: dict[str, Seat], index: int) -> Episode:
        return await run_episode(self.taskset, request.data, policy, episode_index=index, seats=seats,
                                 sampling=request.sampling, timeouts=request.timeouts,
                                 infra_retries=request.infra_retries)


async def _serve_until_sigterm(worker: Worker) -> None:
    """The worker process's own loop: SIGTERM (from the server, or for its death) stops the worker quietly."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stopped.set)
    await worker.serve()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of a worker process."""
    parser = argparse.ArgumentParser(prog="tracegym.serve.worker")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--taskset", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--max-abandoned-threads", type=int, default=MAX_ABANDONED_THREADS)
    parser.add_argument("--sandbox", default="{}", help="the server's AdmissionConfig, JSON")
    parser.add_argument("--sandbox-share", type=int, default=1, help="worker processes sharing it")
    parser.add_argument("--runtime", default=None, help="the runtime every task's sandbox opens in")
    parser.add_argument("--harness", default=None, help="the program that drives every rollout, JSON")
    args = parser.parse_args(argv)
    configure_admission(AdmissionConfig.model_validate_json(args.sandbox), args.sandbox_share)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # this process's own entry point: its handlers are ours
    processes.die_with_parent(signal.SIGTERM)  # the server gone (even by kill -9): SIGTERM, handled as a stop
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    options = json.loads(args.options)
    harness = HarnessChoice.model_validate_json(args.harness) if args.harness else None
    taskset = load_taskset(args.taskset, options or None).with_runtime(args.runtime).with_harness(harness)
    log.info("worker %s (pid %d) serving %s", args.name, os.getpid(), taskset.id)
    with asyncio.Runner() as runner:
        runner.run(_serve_until_sigterm(Worker(taskset, args.backend, args.name, args.max_abandoned_threads)))
    log.info("worker %s stopped", args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
