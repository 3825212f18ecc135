"""Env client: runs rollouts on an env server through the in-process API (`run_rollout`, `run_group`,
`evaluate_iter`, `evaluate`, each with `envs.evaluate`'s arguments; the model is given as an Endpoint), and
episodes of a multi-agent taskset the same way (`run_episode`, `evaluate_episodes_iter`, `evaluate_episodes`).

Every request has a timeout. While requests are in flight the client checks the server is alive (a `health`
ping when it has been quiet for a second); when it stays silent for `liveness_timeout` every pending request
fails with an InfrastructureError instead of waiting. ZMQ reconnects by itself, so a restarted server at the
same address is used again. Cancelling an awaiting `run` (or its timeout) cancels the request on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Unpack

import zmq
import zmq.asyncio

from tracegym.core.episode import Episode
from tracegym.core.errors import ErrorKind, InfrastructureError, StageTimeout, UsageError
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.evaluate import (
    INFRA_RETRIES,
    EvaluateOptions,
    RolloutOptions,
    as_finished,
    check_options,
    check_single_agent,
    failed_episode,
    failed_trace,
    in_order,
    in_task_order,
    multi_agent_class,
    plan,
)
from tracegym.envs.rollout import Timeouts
from tracegym.envs.seats import Seats, bind, wire_seats
from tracegym.envs.taskset import Taskset
from tracegym.models.endpoint import Endpoint
from tracegym.serve.curve import HANDSHAKE_FAILED, guard_client, refusal, shared_secret
from tracegym.serve.wire import MAX_FRAME_BYTES, RemoteError, decode_reply, encode_request

PING_AFTER = 1.0
"""Seconds of silence, with requests in flight, after which the client pings the server."""


class EnvClient:
    """`async with EnvClient("tcp://127.0.0.1:5555") as env: await env.evaluate(taskset, endpoint, rollouts=4)`.
    `per_request`: how many rollouts of one task `evaluate_iter` puts in one request."""

    def __init__(self, address: str, *, secret: str | None = None, request_timeout: float = 3600.0,
                 liveness_timeout: float = 10.0, max_request_bytes: int = MAX_FRAME_BYTES,
                 per_request: int = 8) -> None:
        if per_request < 1:
            raise UsageError(f"per_request must be at least 1, got {per_request}")
        self.address, self.request_timeout, self.liveness_timeout = address, request_timeout, liveness_timeout
        self.max_request_bytes, self.per_request = max_request_bytes, per_request
        self.secret = shared_secret(secret)
        self._ids = itertools.count()
        self._prefix = f"{os.getpid():x}-{id(self):x}-"
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._handshakes: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._heard = time.monotonic()
        self._checked: dict[tuple[str, str], asyncio.Future[None]] = {}

    # --- connection --------------------------------------------------------------------------------------
    def _connect(self) -> zmq.asyncio.Socket:
        if self._socket is None:
            self._ctx = zmq.asyncio.Context()
            self._socket = self._ctx.socket(zmq.DEALER)
            for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 100_000), (zmq.RCVHWM, 100_000)):
                self._socket.setsockopt(option, value)
            if self.secret:
                guard_client(self._socket, self.secret)
            self._handshakes = self._socket.get_monitor_socket(HANDSHAKE_FAILED)
            self._socket.connect(self.address)
            self._heard = time.monotonic()
            self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._watch()),
                           asyncio.create_task(self._watch_handshakes())]
        return self._socket

    async def aclose(self) -> None:
        """Fail whatever is still waiting, stop the background tasks and close the socket."""
        self._fail_all(InfrastructureError(f"env client for {self.address} closed"))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._socket is not None:
            self._socket.disable_monitor()
            self._handshakes.close(0)  # type: ignore[union-attr]
            self._socket.close(0)
            assert self._ctx is not None
            self._ctx.term()
        self._socket = self._ctx = self._handshakes = None

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _receive(self) -> None:
        assert self._socket is not None
        while True:
            batch = [await self._socket.recv_multipart()]
            with contextlib.suppress(zmq.Again):
                while len(batch) < 256:  # take whatever else has arrived without another trip through the loop
                    batch.append(self._socket.recv_multipart(zmq.NOBLOCK).result())
            self._heard = time.monotonic()
            for frames in batch:
                self._resolve(frames)

    def _resolve(self, frames: list[bytes]) -> None:
        try:
            request_id, result = decode_reply(frames)
        except Exception:  # one unreadable frame must not end the receive loop: the request it answered times out
            return
        future = self._waiting.pop(request_id, None) if isinstance(request_id, str) else None
        if future is not None and not future.done():
            future.set_result(result)

    async def _watch_handshakes(self) -> None:
        """Fail every waiting request when the server refuses our handshake (no, or another, shared secret; or no
        env server at all): ZMQ would retry the connection forever, or not at all, and the user must hear why. A
        request sent on a refused connection is lost to libzmq even if the next handshake succeeds, so waiting for
        one would save nothing."""
        assert self._handshakes is not None
        while True:
            await self._handshakes.recv_multipart()
            self._fail_all(refusal(self.address, bool(self.secret)))

    async def _watch(self) -> None:
        """Ping a quiet server while requests wait; fail them all when it stays silent too long."""
        while True:
            await asyncio.sleep(min(PING_AFTER, self.liveness_timeout) / 2)
            if not any(not k.startswith("ping") for k in self._waiting):
                self._heard = time.monotonic()
                continue
            quiet = time.monotonic() - self._heard
            if quiet >= self.liveness_timeout:
                self._fail_all(InfrastructureError(
                    f"env server at {self.address} did not answer for {quiet:.0f}s (is it running?)"))
            elif quiet >= PING_AFTER and not any(k.startswith("ping") for k in self._waiting):
                self._ping()

    def _ping(self) -> None:
        """Ask the server whether it is alive and which of our pending requests it has no record of (lost, e.g.
        to a server restart): those fail now instead of at their timeout. The server read them before the ping and
        answers in order, so a pending id it does not know has no reply on the way."""
        pending = [k for k in self._waiting if not k.startswith("ping")]
        ping = self._send_nowait("health", {"pending": pending}, f"ping{next(self._ids)}")
        ping.add_done_callback(lambda done: self._fail_unknown(done, set(pending)))

    def _fail_unknown(self, ping: asyncio.Future[Any], asked: set[str]) -> None:
        if ping.cancelled() or ping.exception() is not None or not isinstance(ping.result(), dict):
            return
        for request_id in ping.result().get("unknown") or []:
            future = self._waiting.pop(request_id, None) if request_id in asked else None
            if future is not None and not future.done():
                future.set_exception(InfrastructureError(
                    f"env server at {self.address} has no record of request {request_id} (lost; was it restarted?)"))

    def _fail_all(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)

    # --- requests ----------------------------------------------------------------------------------------
    def _send_nowait(self, method: str, payload: Any, request_id: str | None = None) -> asyncio.Future[Any]:
        socket = self._connect()
        request_id = request_id or self._prefix + str(next(self._ids))
        frames = encode_request(request_id, method, payload)
        if sum(len(f) for f in frames) > self.max_request_bytes:
            raise UsageError(f"{method} request is over the {self.max_request_bytes}-byte limit")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        future.request_id = request_id  # type: ignore[attr-defined]
        socket.send_multipart(frames, copy=len(frames[1]) < 65536)
        return future

    async def request(self, method: str, payload: Any = None, timeout: float | None = None,
                      request_id: str | None = None) -> Any:
        """Send one request and return its result; an error reply raises RemoteError, a timeout StageTimeout."""
        future = self._send_nowait(method, payload, request_id)
        request_id = future.request_id  # type: ignore[attr-defined]
        timeout = self.request_timeout if timeout is None else timeout
        timer = asyncio.get_running_loop().call_later(timeout, self._expire, request_id, method, timeout)
        try:
            result = await future
        except asyncio.CancelledError:
            self._abandon(request_id, method)
            raise
        finally:
            timer.cancel()
        if isinstance(result, RemoteError):
            raise result
        return result

    def _expire(self, request_id: str, method: str, timeout: float) -> None:
        future = self._waiting.get(request_id)
        self._abandon(request_id, method)
        if future is not None and not future.done():
            future.set_exception(StageTimeout(f"env server request {method} timed out after {timeout}s"))

    def _abandon(self, request_id: str, method: str) -> None:
        """Forget a request the caller no longer waits for; a `run` is cancelled on the server too."""
        if self._waiting.pop(request_id, None) is not None and method == "run" and self._socket is not None:
            with contextlib.suppress(Exception):
                self._send_nowait("cancel", {"id": request_id}).add_done_callback(_ignore)

    async def health(self) -> dict:
        """The server's liveness and load."""
        return await self.request("health")

    async def info(self) -> dict:
        """What the server runs: taskset id, task type, whether finite, workers, its request size limit (from then
        on this client's own when smaller)."""
        info = await self.request("info")
        limit = info.get("max_request_bytes")
        if isinstance(limit, int):  # a larger request would be cut unanswered or refused: refuse it here, at once
            self.max_request_bytes = min(self.max_request_bytes, limit)
        return info

    async def check_serves(self, taskset: Taskset) -> None:
        """A UsageError unless the server runs `taskset` with the same resolved config: tasks made here from
        one config and run there under another would be scored against the wrong rules, silently."""
        info = await self.info()
        if info.get("taskset") != taskset.id:
            raise UsageError(f"the env server at {self.address} serves taskset {info.get('taskset')!r}, "
                             f"not {taskset.id!r}")
        ours = taskset.config.model_dump(mode="json")
        differ = sorted(k for k in ours.keys() | info.get("config", {}).keys() if ours.get(k) != info["config"].get(k))
        if differ:
            shown = ", ".join(f"{k} = {info['config'].get(k)!r}, not {ours.get(k)!r}" for k in differ)
            raise UsageError(f"the env server at {self.address} runs {taskset.id!r} with {shown}; start it with "
                             "the same taskset options")

    async def cancel(self, request_id: str) -> bool:
        """Cancel a request by id; True when the server still had it."""
        return bool((await self.request("cancel", {"id": request_id})).get("cancelled"))

    async def run(self, data: TaskData, endpoint: Endpoint, sampling: Sampling | None = None, *,
                  rollout_indices: list[int] | None = None, timeouts: Timeouts | None = None,
                  infra_retries: int = INFRA_RETRIES, request_id: str | None = None) -> list[Trace]:
        """The `run` request itself: rollouts of one task (one per rollout index, default [0]); traces in index
        order. A rollout that fails is a trace with errors; a failed request (server gone, worker died too
        often) raises. `request_id` (unique among this client's requests) lets another task `cancel` it."""
        payload = _payload(data, endpoint, sampling, rollout_indices, timeouts, infra_retries)
        return [Trace.model_validate(t) for t in await self.request("run", payload, request_id=request_id)]

    # --- the in-process API, run on the server ------------------------------------------------------------
    async def run_rollout(self, taskset: Taskset, data: TaskData, model: Endpoint, *, rollout_index: int = 0,
                          **options: Unpack[RolloutOptions]) -> Trace:
        """As `envs.evaluate.run_rollout`, on the server; a failed request is a failed trace."""
        check_options(options)
        check_single_agent(taskset)
        await self._check_serves_once(taskset)
        [trace] = await self._traces(taskset.id, data, model, [rollout_index], options)
        return trace

    async def run_group(self, taskset: Taskset, data: TaskData, model: Endpoint, rollouts: int,
                        **options: Unpack[RolloutOptions]) -> list[Trace]:
        """As `envs.evaluate.run_group`, on the server, in one request; a failed request is a failed trace each."""
        check_options(options)
        check_single_agent(taskset)
        await self._check_serves_once(taskset)
        return await self._traces(taskset.id, data, model, list(range(rollouts)), options)

    async def evaluate_iter(self, taskset: str | Taskset, model: Endpoint,
                            **options: Unpack[EvaluateOptions]) -> AsyncIterator[Trace]:
        """As `envs.evaluate.evaluate_iter`, on the server; a failed request yields failed traces and the
        iteration goes on. Consecutive rollouts of the same task go in one request of up to `per_request`
        (their traces arrive together): fewer, larger messages cost the server path less per rollout."""
        work = plan(taskset, **options)
        endpoint = _endpoint(model)
        check_single_agent(work.taskset)
        await self._check_serves_once(work.taskset)

        async def one(group: list[tuple[TaskData, int]]) -> list[Trace]:
            indices = [index for _, index in group]
            return await self._traces(work.taskset.id, group[0][0], endpoint, indices, work.options)

        groups = same_task_runs(work.pairs, min(self.per_request, work.concurrency))
        async for traces in as_finished(groups, one, work.concurrency, size=len):
            for trace in traces:
                yield trace

    async def evaluate(self, taskset: str | Taskset, model: Endpoint,
                       **options: Unpack[EvaluateOptions]) -> list[Trace]:
        """As `envs.evaluate.evaluate`, on the server."""
        return await in_task_order(self.evaluate_iter, taskset, model, options)

    async def _traces(self, taskset_id: str, data: TaskData, model: Endpoint, indices: list[int],
                      options: RolloutOptions) -> list[Trace]:
        """The traces of one `run` request, a failed trace per rollout when the request failed."""
        request = self.run(data, _endpoint(model), rollout_indices=indices, **options)
        try:
            return await request
        except Exception as exc:  # the request is the boundary: whatever ended it (server gone, timed out, worker
            # died too often, refused) fails its rollouts only, as data, the way a failed rollout does in process
            return [failed_trace(data, taskset_id, i, exc, stage="env_server", kind=ErrorKind.INFRASTRUCTURE)
                    for i in indices]

    # --- episodes of a multi-agent taskset, run on the server ----------------------------------------------
    async def run_episodes(self, data: TaskData, endpoint: Endpoint, sampling: Sampling | None = None, *,
                           episode_indices: list[int] | None = None, seats: Seats | None = None,
                           timeouts: Timeouts | None = None, infra_retries: int = INFRA_RETRIES,
                           request_id: str | None = None) -> list[Episode]:
        """The `run` request for episodes of one task (one per episode index, default [0]), every member
        playing as `endpoint` unless `seats` binds it to another Endpoint; a failed request raises."""
        payload = _payload(data, endpoint, sampling, episode_indices, timeouts, infra_retries)
        payload.update(episodes=True, seats=wire_seats(seats))
        return [Episode.model_validate(e) for e in await self.request("run", payload, request_id=request_id)]

    async def run_episode(self, taskset: Taskset, data: TaskData, model: Endpoint, *, episode_index: int = 0,
                          seats: Seats | None = None, **options: Unpack[RolloutOptions]) -> Episode:
        """As `envs.evaluate.run_episode`, on the server; a failed request is a failed episode."""
        check_options(options)
        bind(multi_agent_class(taskset).seats, seats, taskset.id)
        await self._check_serves_once(taskset)
        [episode] = await self._episodes(taskset, data, model, [episode_index], seats, options)
        return episode

    async def evaluate_episodes_iter(self, taskset: str | Taskset, model: Endpoint, *, seats: Seats | None = None,
                                     **options: Unpack[EvaluateOptions]) -> AsyncIterator[Episode]:
        """As `envs.evaluate.evaluate_episodes_iter`, on the server; episodes of one task go `per_request` to a
        request, like rollouts."""
        work = plan(taskset, **options)
        bind(multi_agent_class(work.taskset).seats, seats, work.taskset.id)
        endpoint = _endpoint(model)
        await self._check_serves_once(work.taskset)

        async def one(group: list[tuple[TaskData, int]]) -> list[Episode]:
            indices = [index for _, index in group]
            return await self._episodes(work.taskset, group[0][0], endpoint, indices, seats, work.options)

        groups = same_task_runs(work.pairs, min(self.per_request, work.concurrency))
        async for episodes in as_finished(groups, one, work.concurrency, size=len):
            for episode in episodes:
                yield episode

    async def evaluate_episodes(self, taskset: str | Taskset, model: Endpoint, *, seats: Seats | None = None,
                                **options: Unpack[EvaluateOptions]) -> list[Episode]:
        """As `envs.evaluate.evaluate_episodes`, on the server."""
        return await in_order(self.evaluate_episodes_iter, taskset, model, options, seats=seats)

    async def _episodes(self, taskset: Taskset, data: TaskData, model: Endpoint, indices: list[int],
                        seats: Seats | None, options: RolloutOptions) -> list[Episode]:
        """The episodes of one request, a failed episode per index when the request failed."""
        try:
            return await self.run_episodes(data, _endpoint(model), episode_indices=indices, seats=seats, **options)
        except UsageError:
            raise
        except Exception as exc:  # the request is the boundary, as for rollouts: its episodes fail as data
            return [failed_episode(taskset, data, i, exc, stage="env_server", kind=ErrorKind.INFRASTRUCTURE)
                    for i in indices]

    async def _check_serves_once(self, taskset: Taskset) -> None:
        """`check_serves(taskset)` the first time this client runs that taskset with that config (callers at once
        share one check): a UsageError when the server runs another taskset, or this one with other options, so
        rollouts are never scored by the wrong rules. A server that did not answer is asked again next time; until
        then its run requests meet the same failure and fail as data."""
        key = (taskset.id, json.dumps(taskset.config.model_dump(mode="json"), sort_keys=True))
        check = self._checked.get(key)
        if check is None:
            check = self._checked[key] = asyncio.ensure_future(self.check_serves(taskset))
            check.add_done_callback(_ignore)  # a caller cancelled meanwhile leaves no unretrieved exception
        try:
            await asyncio.shield(check)
        except UsageError:
            raise
        except Exception:  # not answered (server gone, timed out): the run request below is the boundary for that
            if self._checked.get(key) is check:
                del self._checked[key]


async def check_env_server(address: str, taskset: Taskset, timeout_s: float = 30.0) -> None:
    """A UsageError unless the server at `address` runs `taskset` with its resolved config; an
    InfrastructureError when it does not answer within `timeout_s`."""
    async with EnvClient(address, request_timeout=timeout_s) as client:
        await client.check_serves(taskset)


def same_task_runs(pairs: Iterable[tuple[TaskData, int]], most: int) -> Iterator[list[tuple[TaskData, int]]]:
    """Consecutive (task, rollout index) pairs of the same task, in runs of at most `most`, drawn lazily."""
    run: list[tuple[TaskData, int]] = []
    for pair in pairs:
        if run and (len(run) >= most or not (pair[0] is run[0][0] or pair[0] == run[0][0])):
            yield run
            run = []
        run.append(pair)
    if run:
        yield run


def _payload(data: TaskData, endpoint: Endpoint, sampling: Sampling | None, indices: list[int] | None,
             timeouts: Timeouts | None, infra_retries: int) -> dict[str, Any]:
    """A `run` request's payload (`serve.run_request.RunRequest`'s fields as plain data)."""
    payload = {"data": data.model_dump(mode="json"), "endpoint": _dump(endpoint),
               "rollout_indices": list(indices or [0]), "infra_retries": infra_retries}
    if sampling is not None:
        payload["sampling"] = _dump(sampling)
    if timeouts is not None:
        payload["timeouts"] = _dump(timeouts)
    return payload


def _endpoint(model: object) -> Endpoint:
    """The model as the plain data a request carries; a live client cannot cross the wire."""
    if not isinstance(model, Endpoint):
        raise UsageError(f"an env server reaches the model through its Endpoint, not a {type(model).__name__}: "
                         "give the Endpoint the client was made from")
    return model


_dumped: dict[int, tuple[Any, dict[str, Any]]] = {}


def _dump(model: Any) -> dict[str, Any]:
    """A frozen config as plain data, remembered per object (the same endpoint goes with every request)."""
    hit = _dumped.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    if len(_dumped) > 256:
        _dumped.clear()
    value = model.model_dump(mode="json")
    _dumped[id(model)] = (model, value)
    return value


def _ignore(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()

