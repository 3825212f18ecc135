"""Env client: runs rollouts on an env server through the in-process API (`run_rollout`, `run_group`,
`evaluate_iter`, `evaluate`, each with `envs.evaluate`'s arguments; the model is given as an Endpoint), and
episodes of a multi-agent taskset the same way (`run_episode`, `evaluate_episodes_iter`, `evaluate_episodes`).

Every request has a timeout. While requests are in flight the client checks the server is alive (a `health`
ping when it has been quiet for a second); when it stays silent for `liveness_timeout` every pending request
fails with an InfrastructureError instead of waiting (`serve.connection`). ZMQ reconnects by itself, so a
restarted server at the same address is used again. Cancelling an awaiting `run` (or its timeout) cancels the
request on the server. Given several addresses (one taskset served on several hosts), `run` requests go to the
least-loaded server, and when one is lost (silent, its link dropped, or it has no record of them) each is sent
to a server it has not been to yet: every rollout is answered once, from one server (a late reply from the lost
one is dropped).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar, Unpack

from pydantic import ValidationError

from tracegym.core.episode import SOLO, Episode
from tracegym.core.errors import ErrorKind, InfrastructureError, UsageError
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.canary import CanaryAgent
from tracegym.envs.evaluate import (
    INFRA_RETRIES,
    EvaluateOptions,
    RolloutOptions,
    as_finished,
    check_options,
    check_single_agent,
    failed_episode,
    in_order,
    in_task_order,
    members_of,
    plan,
    same_task_runs,
    seats_of,
)
from tracegym.envs.group_scoring import scores_groups
from tracegym.envs.registry import load_taskset
from tracegym.envs.rollout import Timeouts
from tracegym.envs.seats import Seats, bind
from tracegym.envs.taskset import Taskset
from tracegym.models.endpoint import Endpoint
from tracegym.serve.connection import Connection, HostLost
from tracegym.serve.curve import shared_secret
from tracegym.serve.run_request import RunRequest
from tracegym.serve.served_taskset import ServedTaskset
from tracegym.serve.task_rows import MAX_ROWS
from tracegym.serve.wire import MAX_FRAME_BYTES, OVER_BUDGET, RemoteError

log = logging.getLogger(__name__)
T = TypeVar("T")

MOVABLE = frozenset({"run"})
"""Methods whose requests may be re-sent to another env server when theirs is lost (running them there is as good;
no other server had them)."""


class EnvClient:
    """`async with EnvClient("tcp://127.0.0.1:5555") as env: await env.evaluate(taskset, endpoint, rollouts=4)`.
    Several addresses (env servers of the same taskset on other hosts): requests go to the least loaded, and those
    of a server that goes away are sent to another. `per_request`: how many rollouts of one task `evaluate_iter`
    puts in one request."""

    def __init__(self, address: str | Sequence[str], *, secret: str | None = None, request_timeout: float = 3600.0,
                 liveness_timeout: float = 10.0, max_request_bytes: int = MAX_FRAME_BYTES,
                 per_request: int = 8) -> None:
        if per_request < 1:
            raise UsageError(f"per_request must be at least 1, got {per_request}")
        self.addresses = distinct_addresses([address] if isinstance(address, str) else list(address))
        self.address = self.addresses[0]
        self.request_timeout, self.liveness_timeout = request_timeout, liveness_timeout
        self.max_request_bytes, self.per_request = max_request_bytes, per_request
        self.secret = shared_secret(secret)
        several = len(self.addresses) > 1
        self.hosts = [Connection(a, self.secret, liveness_timeout, moves=several) for a in self.addresses]
        """One connection per env server."""
        self.moved = 0
        """Requests re-sent to another server after theirs was lost."""
        self.resent = 0
        """Requests sent again after the server refused them as over its budget."""
        self._ids = itertools.count()
        self._prefix = f"{os.getpid():x}-{id(self):x}-"
        self._holding: dict[str, Connection] = {}
        self._checked: dict[tuple[str, str], asyncio.Future[None]] = {}

    async def aclose(self) -> None:
        """Fail whatever is still waiting, stop the background tasks and close the sockets."""
        for host in self.hosts:
            await host.aclose(f"env client for {host.address} closed")

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    # --- requests ----------------------------------------------------------------------------------------
    async def request(self, method: str, payload: Any = None, timeout: float | None = None,
                      request_id: str | None = None) -> Any:
        """Send one request and return its result; an error reply raises RemoteError, a timeout StageTimeout. A
        `MOVABLE` request whose server is lost goes to another (each server tried once), within the same timeout."""
        request_id = request_id or self._prefix + str(next(self._ids))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.request_timeout if timeout is None else timeout)
        tried: list[Connection] = []
        while True:
            host = self._pick(tried)
            tried.append(host)
            self._holding[request_id] = host
            try:
                result = await self._on(host, method, payload, request_id, deadline)
            except HostLost as exc:
                if method not in MOVABLE or len(tried) == len(self.hosts):
                    raise
                self.moved += 1
                log.warning("%s; sending request %s to another env server", exc, request_id)
                continue
            finally:
                self._holding.pop(request_id, None)
            if isinstance(result, RemoteError):
                raise result
            return result

    async def _on(self, host: Connection, method: str, payload: Any, request_id: str, deadline: float) -> Any:
        """One request's result from `host`; a request refused as over the server's budget while others of ours
        are out there is sent again once one of them is answered (the budget bounds what the server holds, and
        ours frees as it answers), until the deadline; one refused while others were out that have all been
        answered by the time the refusal is read is sent again at once, once."""
        loop = asyncio.get_running_loop()
        again_at_once = True
        while True:
            result = await host.request(method, payload, request_id, max(0.0, deadline - loop.time()),
                                        self.max_request_bytes)
            if not (isinstance(result, RemoteError) and result.type == OVER_BUDGET and loop.time() < deadline
                    and (host.load or again_at_once)):
                return result
            self.resent += 1
            if host.load:
                await host.answered(deadline - loop.time())
            else:
                again_at_once = False

    def _pick(self, tried: list[Connection]) -> Connection:
        """The least-loaded server not tried yet, preferring those whose link is up."""
        if len(self.hosts) == 1:
            return self.hosts[0]  # (its load, counted over every pending request, is not worth counting here)
        left = [h for h in self.hosts if h not in tried]
        return min([h for h in left if h.up] or left, key=lambda h: h.load)

    async def health(self) -> dict:
        """The server's liveness and load."""
        return await self.request("health")

    async def info(self, address: str | None = None) -> dict:
        """What the server at `address` (default: the least loaded) runs: taskset id, task type, whether finite,
        workers, its request size limit (from then on this client's own when smaller)."""
        host = self._pick([]) if address is None else self.hosts[self.addresses.index(address)]
        info = await host.request("info", None, self._prefix + str(next(self._ids)), self.request_timeout,
                                  self.max_request_bytes)
        if isinstance(info, RemoteError):
            raise info
        limit = info.get("max_request_bytes")
        if isinstance(limit, int):  # a larger request would be cut unanswered or refused: refuse it here, at once
            self.max_request_bytes = min(self.max_request_bytes, limit)
            host.server_limit = limit
        return info

    async def check_serves(self, taskset: Taskset) -> None:
        """A UsageError unless every server runs `taskset` with the same resolved config: tasks made here from
        one config and run there under another would be scored against the wrong rules, silently. Of several
        servers, one that does not answer is left out of new requests (with a warning) until its link is back;
        none answering is an InfrastructureError naming each."""
        await self._check_all(taskset.id, lambda info: taskset.config.model_dump(mode="json"))

    async def check_runs(self, taskset_id: str, options: dict[str, Any]) -> None:
        """As `check_serves`, without the taskset's code here: the server must run `taskset_id` with `options`,
        and every option not given at the taskset's default (as the server says it)."""
        await self._check_all(taskset_id, lambda info: {**(info.get("defaults") or {}), **options})

    async def _check_all(self, taskset_id: str, expected: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        outcomes = await asyncio.gather(*(self._check_host(h, taskset_id, expected) for h in self.hosts),
                                        return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, UsageError | asyncio.CancelledError):
                raise outcome
        failed = [(h, o) for h, o in zip(self.hosts, outcomes, strict=True) if isinstance(o, BaseException)]
        if len(failed) == len(self.hosts) == 1:
            raise failed[0][1]
        if len(failed) == len(self.hosts):
            raise InfrastructureError("no env server answers: " + "; ".join(f"{h.address}: {o}" for h, o in failed))
        for host, failure in failed:
            host.up = False
            log.warning("env server at %s left out for now: %s", host.address, failure)

    async def _check_host(self, host: Connection, taskset_id: str,
                          expected: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        info = await self.info(host.address)
        if taskset_id not in (info.get("taskset"), info.get("spec")):
            raise UsageError(f"the env server at {host.address} serves taskset {info.get('taskset')!r}, "
                             f"not {taskset_id!r}")
        ours, theirs = expected(info), info.get("config", {})
        differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        if differ:
            shown = ", ".join(f"{k} = {theirs.get(k)!r}, not {ours.get(k)!r}" for k in differ)
            raise UsageError(f"the env server at {host.address} runs {taskset_id!r} with {shown}; start it with "
                             "the same taskset options")

    async def cancel(self, request_id: str) -> bool:
        """Cancel a request by id; True when the server holding it still had it."""
        host = self._holding.get(request_id, self.hosts[0])
        reply = await host.request("cancel", {"id": request_id}, self._prefix + str(next(self._ids)),
                                   self.request_timeout, self.max_request_bytes)
        if isinstance(reply, RemoteError):
            raise reply
        return bool(reply.get("cancelled"))

    async def run(self, data: TaskData, endpoint: Endpoint, sampling: Sampling | None = None, *,
                  rollout_indices: list[int] | None = None, timeouts: Timeouts | None = None,
                  infra_retries: int = INFRA_RETRIES, request_id: str | None = None, group: bool = True,
                  agent: CanaryAgent | None = None) -> list[Trace]:
        """The `run` request itself: rollouts of one task (one per rollout index, default [0]); traces in index
        order. A rollout that fails is a trace with errors; a failed request (server gone, worker died too
        often) raises. `request_id` (unique among this client's requests) lets another task `cancel` it; `group`:
        the rollouts are one group of the task, scored together by its group rewards (`RunRequest.group`);
        `agent`: played by that canary agent, not the endpoint's model (none for `gold` on a task without gold)."""
        payload = _payload(data=data, endpoint=endpoint, sampling=sampling, rollout_indices=rollout_indices or [0],
                           timeouts=timeouts, infra_retries=infra_retries, group=group, agent=agent)
        return [Trace.model_validate(t) for t in await self.request("run", payload, request_id=request_id)]

    # --- the in-process API, run on the server ------------------------------------------------------------
    async def run_rollout(self, taskset: Taskset, data: TaskData, model: Endpoint, *, rollout_index: int = 0,
                          **options: Unpack[RolloutOptions]) -> Trace:
        """As `envs.evaluate.run_rollout`, on the server; a failed request is a failed trace."""
        check_options(options)
        check_single_agent(taskset)
        await self._check_serves_once(taskset)
        [trace] = await self._traces(taskset.id, data, model, [rollout_index], options, group=False)
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
        """As `envs.evaluate.evaluate_iter`, on the server: the traces of `evaluate_episodes_iter`'s solo episodes
        (a failed request yields failed traces and the iteration goes on)."""
        ts = load_taskset(taskset)
        check_single_agent(ts)
        async for episode in self.evaluate_episodes_iter(ts, model, **options):
            yield episode.traces[SOLO]

    async def evaluate(self, taskset: str | Taskset, model: Endpoint,
                       **options: Unpack[EvaluateOptions]) -> list[Trace]:
        """As `envs.evaluate.evaluate`, on the server."""
        return await in_task_order(self.evaluate_iter, taskset, model, options)

    async def _traces(self, taskset_id: str, data: TaskData, model: Endpoint, indices: list[int],
                      options: RolloutOptions, group: bool = True) -> list[Trace]:
        """The rollouts of one request, as the traces of its solo episodes (a failed request: a failed trace each);
        `group`: as `run`'s."""
        episodes = await self._episodes(taskset_id, [SOLO], data, model, indices, None, options, group=group)
        return [e.traces[SOLO] for e in episodes]

    # --- a served taskset's rows and runs, without its code -----------------------------------------------
    async def rows(self, indices: Sequence[int]) -> list[TaskData]:
        """The server's task rows at these positions (`serve.task_rows`), in that order."""
        out: list[TaskData] = []
        for start in range(0, len(indices), MAX_ROWS):
            chunk = list(indices[start:start + MAX_ROWS])
            out += [TaskData.model_validate(row) for row in await self.request("rows", {"indices": chunk})]
        return out

    async def rollouts(self, served: ServedTaskset, data: TaskData, model: Endpoint, indices: list[int],
                       **options: Unpack[RolloutOptions]) -> list[Trace]:
        """Rollouts of one of the served taskset's tasks (one per index) in one request; a failed request is a
        failed trace each. Nothing of the taskset's code runs here."""
        check_options(options)
        if served.multi_agent:
            raise UsageError(f"taskset {served.id!r} is multi-agent: run episodes, not rollouts")
        return await self._traces(served.id, data, model, indices, options)

    async def episodes(self, served: ServedTaskset, data: TaskData, model: Endpoint, indices: list[int], *,
                       seats: Seats | None = None, **options: Unpack[RolloutOptions]) -> list[Episode]:
        """Episodes of one of the served taskset's tasks (one per index) in one request, its members seated by
        `seats` (the rest play as `model`); a failed request is a failed episode each."""
        check_options(options)
        unknown = sorted(set(seats or {}) - set(served.members))
        if unknown:
            raise UsageError(f"seat {unknown[0]!r}: taskset {served.id!r} has no such seat (seats: "
                             f"{', '.join(served.members) or 'none: it is single-agent'})")
        return await self._episodes(served.id, served.members or [SOLO], data, model, indices, seats, options)

    # --- episodes of a multi-agent taskset, run on the server ----------------------------------------------
    async def run_episodes(self, data: TaskData, endpoint: Endpoint, sampling: Sampling | None = None, *,
                           episode_indices: list[int] | None = None, seats: Seats | None = None,
                           timeouts: Timeouts | None = None, infra_retries: int = INFRA_RETRIES,
                           request_id: str | None = None, group: bool = True) -> list[Episode]:
        """The `run` request for episodes of one task (one per episode index, default [0]), every member
        playing as `endpoint` unless `seats` binds it to another Endpoint; a failed request raises. `group`: as
        `run`'s."""
        payload = _payload(data=data, endpoint=endpoint, sampling=sampling, rollout_indices=episode_indices or [0],
                           timeouts=timeouts, infra_retries=infra_retries, episodes=True, seats=dict(seats or {}),
                           group=group)
        return [Episode.model_validate(e) for e in await self.request("run", payload, request_id=request_id)]

    async def run_episode(self, taskset: Taskset, data: TaskData, model: Endpoint, *, episode_index: int = 0,
                          seats: Seats | None = None, **options: Unpack[RolloutOptions]) -> Episode:
        """As `envs.evaluate.run_episode`, on the server; a failed request is a failed episode."""
        check_options(options)
        bind(seats_of(taskset), seats, taskset.id)
        await self._check_serves_once(taskset)
        [episode] = await self._episodes(taskset.id, members_of(taskset), data, model, [episode_index], seats, options)
        return episode

    async def evaluate_episodes_iter(self, taskset: str | Taskset, model: Endpoint, *, seats: Seats | None = None,
                                     **options: Unpack[EvaluateOptions]) -> AsyncIterator[Episode]:
        """As `envs.evaluate.evaluate_episodes_iter`, on the server; episodes of one task go `per_request` to a
        request, like rollouts."""
        work = plan(taskset, **options)
        bind(seats_of(work.taskset), seats, work.taskset.id)
        endpoint = _endpoint(model)
        await self._check_serves_once(work.taskset)

        members = members_of(work.taskset)

        async def one(group: list[tuple[TaskData, int]]) -> list[Episode]:
            indices = [index for _, index in group]
            return await self._episodes(work.taskset.id, members, group[0][0], endpoint, indices, seats,
                                        work.options)

        most = None if scores_groups(work.taskset) else min(self.per_request, work.concurrency)  # a group whole
        groups = same_task_runs(work.pairs, most)
        async for episodes in as_finished(groups, one, work.concurrency, size=len):
            for episode in episodes:
                yield episode

    async def evaluate_episodes(self, taskset: str | Taskset, model: Endpoint, *, seats: Seats | None = None,
                                **options: Unpack[EvaluateOptions]) -> list[Episode]:
        """As `envs.evaluate.evaluate_episodes`, on the server."""
        return await in_order(self.evaluate_episodes_iter, taskset, model, options, seats=seats)

    async def _episodes(self, taskset_id: str, members: list[str], data: TaskData, model: Endpoint,
                        indices: list[int], seats: Seats | None, options: RolloutOptions,
                        group: bool = True) -> list[Episode]:
        """The episodes of one request, a failed episode per index when the request failed; `group`: as `run`'s."""
        try:
            return await self.run_episodes(data, _endpoint(model), episode_indices=indices, seats=seats,
                                           group=group, **options)
        except UsageError:
            raise
        except Exception as exc:  # the request is the boundary, as for rollouts: its episodes fail as data
            return [failed_episode(taskset_id, members, data, i, exc, stage="env_server",
                                   kind=ErrorKind.INFRASTRUCTURE) for i in indices]

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


async def check_env_server(address: str | Sequence[str], taskset: Taskset, timeout_s: float = 30.0) -> None:
    """A UsageError unless the server at `address` (each of several: a host that does not resolve is named) runs
    `taskset` with its resolved config; an InfrastructureError when it does not answer within `timeout_s` (of
    several, when none does: the others are named in warnings)."""
    async with _resolved_client(address, timeout_s) as client:
        await client.check_serves(taskset)


async def check_env_server_runs(address: str | Sequence[str], taskset_id: str, options: dict[str, Any],
                                timeout_s: float = 30.0) -> None:
    """As `check_env_server`, without the taskset's code here (`EnvClient.check_runs`)."""
    async with _resolved_client(address, timeout_s) as client:
        await client.check_runs(taskset_id, options)


def _resolved_client(address: str | Sequence[str], timeout_s: float) -> EnvClient:
    """A client of the servers at `address`, each host checked to resolve first (`check_resolves`)."""
    addresses = [address] if isinstance(address, str) else list(address)
    for one in addresses:
        check_resolves(one)
    return EnvClient(addresses, request_timeout=timeout_s)


def check_resolves(address: str) -> None:
    """A UsageError naming the host of a `tcp://host:port` address that does not resolve (ZMQ would retry it
    silently forever)."""
    if not address.startswith("tcp://"):
        return
    host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host == "*":
        return
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"the host {host!r} of env server address {address} does not resolve ({exc})") from None


def distinct_addresses(addresses: list[str]) -> list[str]:
    """`addresses` without repeats, each repeat named in a warning; a UsageError when there are none."""
    if not addresses:
        raise UsageError("an env client needs at least one env server address")
    kept = list(dict.fromkeys(addresses))
    if len(kept) < len(addresses):
        log.warning("env server addresses %s list one more than once; using each once", ", ".join(addresses))
    return kept


def _payload(**fields: Any) -> dict[str, Any]:
    """A `run` request's payload: `RunRequest` made from `fields` (checked here, as the worker will check it) as
    plain data; a field it refuses is a UsageError naming it."""
    try:
        request = RunRequest(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise UsageError(f"run request {where}: {error['msg'].removeprefix('Value error, ')}") from None
    return request.model_dump(mode="json")


def _endpoint(model: object) -> Endpoint:
    """The model as the plain data a request carries; a live client cannot cross the wire."""
    if not isinstance(model, Endpoint):
        raise UsageError(f"an env server reaches the model through its Endpoint, not a {type(model).__name__}: "
                         "give the Endpoint the client was made from")
    return model


def _ignore(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def ask(address: str | Sequence[str], question: Callable[[EnvClient], Awaitable[T]], timeout_s: float = 60.0) -> T:
    """`question(client)` put to the env server at `address` (the least loaded, of several) through a client of
    its own; blocks until answered, from any thread, inside an event loop or not (it asks from an event loop of its
    own, on a thread of its own)."""

    async def put() -> T:
        async with EnvClient(address, request_timeout=timeout_s) as client:
            return await question(client)

    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, put()).result()


def describe(address: str | Sequence[str], timeout_s: float = 60.0) -> ServedTaskset:
    """What the env server at `address` runs (`ask`)."""

    async def info(client: EnvClient) -> ServedTaskset:
        return ServedTaskset.from_info(await client.info(), client.address)

    return ask(address, info, timeout_s)
