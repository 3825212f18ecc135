"""Env server choice: the env-server section `tracegym eval` (`[env]`, `--env.*`) and each `tracegym rl` environment
share: the env servers already running at `address`, or how to start one here (its worker pool and worker limits,
named as `tracegym serve`'s own flags, which `WorkerPoolChoice` also declares).

>>> EnvServerChoice(elastic=True, grow_at=16).serve_args()
['--elastic', '--grow-at', '16.0']
>>> EnvServerChoice(sandbox={"max_starting": 12, "warm_pool": 2}).serve_args()
['--sandbox.max-starting', '12', '--sandbox.warm-pool', '2']
>>> EnvServerChoice(address="tcp://host:5555").address
['tcp://host:5555']
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationInfo, field_validator

from tracegym.envs.harness_choice import HarnessChoice
from tracegym.runtimes.admission import AdmissionConfig, split_refusal
from tracegym.runtimes.catalog import RUNTIMES
from tracegym.serve.budget import MAX_OPEN_BYTES, MAX_PEER_BYTES, MAX_SERVER_BYTES
from tracegym.serve.env_server import WORKER_TIMEOUT
from tracegym.serve.pool import MAX_ABANDONED_THREADS, PoolSize
from tracegym.serve.wire import MAX_FRAME_BYTES, Addresses

ELASTIC_ONLY = ("max_workers", "idle_seconds", "grow_at")
"""Options of an elastic pool only (a static pool has none of them)."""


class WorkerPoolChoice(BaseModel):
    """The worker pool of an env server, its workers' limits and the bytes of requests it takes in: `tracegym
    serve`'s `--workers`, `--elastic`, `--max-request-bytes`, ..., and the same keys in the sections of the commands
    that start env servers. Byte sizes take units: `64MiB`, `1GiB`."""

    model_config = ConfigDict(extra="forbid")
    workers: int | None = Field(default=None, gt=0)
    """Worker processes of a static pool; unset: one per CPU core (at most 8)."""
    elastic: bool = False
    """Grow the pool with load (up to `max_workers`) and retire idle workers, instead of a static pool."""
    max_workers: int | None = Field(default=None, gt=0)
    """Most workers of an elastic pool; unset: one per CPU core (at least 2)."""
    idle_seconds: float = Field(default=PoolSize.model_fields["idle_s"].default, ge=0)
    """Seconds an elastic pool's worker stays idle before it is retired."""
    grow_at: float = Field(default=PoolSize.model_fields["grow_at"].default, gt=0)
    """Requests in flight per worker past which an elastic pool starts another worker; requests past it wait at
    the server for the new worker (rather than crowd the busy ones) while the pool can still grow."""
    spare_workers: int = Field(default=PoolSize.model_fields["spares"].default, ge=0)
    """Warm workers kept ready beside the pool (given no work): when a worker dies (or an elastic pool grows), a
    spare takes its place, and the dead worker's requests, at once instead of after a worker's start (a second or
    more), while a new spare starts behind it. Each costs a worker's memory at idle."""
    worker_timeout: float = Field(default=WORKER_TIMEOUT, gt=0)
    """Seconds a busy worker may leave the server's "which requests do you hold?" unanswered (its event loop
    blocked, e.g. by an async tool that blocks) before it is taken as hung, killed and replaced, and its requests
    re-dispatched; also, when over 60, the most seconds a starting worker may take to say ready (past them it is
    killed as a failed start)."""
    max_abandoned_threads: int = Field(default=MAX_ABANDONED_THREADS, ge=0)
    """Threads of hung sync calls (tools, scorers past their timeout) a worker may hold before it is replaced,
    once its requests are answered."""
    max_request_bytes: ByteSize = Field(default=ByteSize(MAX_FRAME_BYTES), gt=0)
    """Largest request (64 MiB: a task row with a long document is about 1 MB, a 2-megapixel image 3-5 MB as a
    data URL); a larger one is answered `TooLarge`, and a frame more than 64 KiB past it is cut by ZMQ as its
    header arrives, before the server reads it."""
    max_open_bytes: ByteSize = Field(default=ByteSize(MAX_OPEN_BYTES), gt=0)
    """Without a shared secret (any local process may connect, as often as it likes): the most bytes of `run`
    requests received and not yet answered the server holds, per connection and in all; one past it is answered
    `OverBudget` at once (an env client with other requests out waits for one to be answered and sends it again)."""
    max_peer_bytes: ByteSize = Field(default=ByteSize(MAX_PEER_BYTES), gt=0)
    """With a shared secret: the most bytes of `run` requests not yet answered the server holds per connection
    (every connection proved the secret in its handshake)."""
    max_server_bytes: ByteSize = Field(default=ByteSize(MAX_SERVER_BYTES), gt=0)
    """With a shared secret: the most bytes of `run` requests not yet answered the server holds in all."""
    runtime: str | None = None
    """The runtime every task's sandboxed tools and agent program run in (`subprocess`, `bubblewrap`,
    `container`, `process-group`: `runtimes.catalog`), under the limits the task gives them, whatever runtime its
    task class chooses (`Task.runtime`); unset: the task class's choice. prime-rl's per-env `runtime`."""
    harness: HarnessChoice | None = None
    """An agent program to drive every rollout; unset: the task's."""
    sandbox: AdmissionConfig = Field(default_factory=AdmissionConfig)
    """How the server's workers admit sandboxes, together: `sandbox.max_starting` (starting at once),
    `sandbox.jitter_s`, `sandbox.setup_budget_s`, `sandbox.memory_reserve_mb`, `sandbox.memory_overcommit`,
    `sandbox.warm_pool`, ... (see `runtimes.admission`; the defaults come from this host's cores and memory). Each
    worker process (the most workers plus the spares) admits its share, so the caps hold for the whole server."""

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, runtime: str | None) -> str | None:
        if runtime is not None and runtime not in RUNTIMES:
            raise ValueError(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
        return runtime

    @field_validator("elastic")
    @classmethod
    def _one_kind_of_pool(cls, elastic: bool, info: ValidationInfo) -> bool:
        if elastic and info.data.get("workers") is not None:
            raise ValueError("an elastic pool sizes itself (up to `max_workers`); `workers` is a static pool's "
                             "size: give one or the other")
        return elastic

    @field_validator(*ELASTIC_ONLY)
    @classmethod
    def _elastic_options(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name or ""
        if value != WorkerPoolChoice.model_fields[name].default and not info.data.get("elastic"):
            raise ValueError(f"`{name}` is an option of an elastic pool; set `elastic` too")
        return value

    @field_validator("sandbox")
    @classmethod
    def _sandbox_splits(cls, sandbox: AdmissionConfig, info: ValidationInfo) -> AdmissionConfig:
        pool = WorkerPoolChoice.model_construct(**info.data)  # the pool's fields, validated already
        if why := split_refusal(sandbox, pool.size().most):
            raise ValueError(why)
        return sandbox

    def size(self) -> PoolSize:
        """The worker pool's size policy."""
        if self.elastic:
            return PoolSize.elastic_up_to(self.max_workers, idle_s=self.idle_seconds, grow_at=self.grow_at,
                                          spares=self.spare_workers)
        return PoolSize.static(self.workers, spares=self.spare_workers)

    def serve_args(self) -> list[str]:
        """These options as `tracegym serve` flags (for an env server a command starts as a child process, or in
        a cluster script): each of this class's fields not at its default, under its own name."""
        args = []
        for name, field in WorkerPoolChoice.model_fields.items():
            value, flag = getattr(self, name), "--" + name.replace("_", "-")
            default = field.get_default(call_default_factory=True)
            if isinstance(value, BaseModel) and default is None:  # a section unset by default: every field, as JSON
                args += [arg for key, inner in value.model_dump(mode="json").items()
                         for arg in (f"{flag}.{key.replace('_', '-')}", json.dumps(inner))]
            elif isinstance(value, BaseModel):  # a section: its fields not at their defaults, `--section.field`
                args += [arg for key, inner in value.model_dump().items() if inner != getattr(default, key)
                         for arg in (f"{flag}.{key.replace('_', '-')}", str(inner))]
            elif value != default:
                args += [flag] if value is True else [flag, str(value)]
        return args


class EnvServerChoice(WorkerPoolChoice):
    """Where a command's rollouts run: the env servers already running at `address`, or one it starts here with
    this worker pool (`workers`, `elastic`, ...: `tracegym serve`'s options of the same names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    address: Addresses | None = None
    """A running env server for this taskset (`tracegym serve ID ...` on any host, e.g. `tcp://host:5555`), or
    several (on other hosts: rollouts are spread over them, and a server that goes away has its rollouts sent to
    the others), checked to serve this taskset with these options; unset: start one here (with the pool options
    above, which then must stay unset)."""

    @field_validator("address")
    @classmethod
    def _nothing_to_start(cls, address: list[str] | None, info: ValidationInfo) -> list[str] | None:
        """The pool options configure a server started here: with `address` none is."""
        given = [name for name, field in WorkerPoolChoice.model_fields.items()
                 if name in info.data and info.data[name] != field.get_default(call_default_factory=True)]
        if address is not None and given:
            raise ValueError(f"the env server runs elsewhere, so {', '.join(f'`{n}`' for n in given)} (for one "
                             "started here) has no effect; leave it unset, or give it to that server's "
                             "`tracegym serve`")
        return address
