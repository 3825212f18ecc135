"""Benchmark: failover times, from a lost inference server, env host or env-server worker to its rollouts completing.

Inference servers (two fake OpenAI servers, every call 0.5 s, behind the router): one is killed (its connections
close) or hangs (still connected, never answers: found by the router's probe) while 8 sessions have a turn in
flight on each. Env hosts (three network namespaces standing for hosts, each running `tracegym serve` with the
shared secret; needs root): one host's processes are killed (the kernel closes their connections) or the host is
cut off the network (no FIN: found by the client's liveness timeout) while 3 rollouts of 1 s run on each. Each
case prints when the lost work was seen lost, when the last of it completed elsewhere, and the same run's time
without a loss, side by side.

Env-server workers (a local `tracegym serve` of 2 workers, every rollout 0.3 s in setup, 200 rollouts at 16 at a
time, one request each): one worker is killed (kill -9) mid-eval, then `--gap` seconds later the other one. For each
kill, when every request sent before it was running again (`rerun`: the latest start of a rollout sent before the
kill that started after it) and answered (`done`), and the whole eval's time; each eval must end 200/200 with no
duplicate. Then the same eval with one task whose setup kills its worker (a crash-looping task): its 4 rollouts
fail, blamed, and the other 196 succeed. With `--old-src` (another checkout's `src`) the old code runs the same
cases in the same run, side by side.

    .venv/bin/python benchmarks/failover.py [--liveness 2.0] [--probe-every 0.5 --probe-timeout 1.0]
        [--old-src /tmp/old/src] [--gap 1.0] [--repeats 3] [--only workers]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).parent))
from old_code import code_from

from tracegym import Endpoint, TaskData
from tracegym.core.messages import user
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelRequest
from tracegym.models.router import Router
from tracegym.serve import EnvClient, RemoteError
from tracegym.serve.local_server import local_server
from tracegym.serve.wire import SECRET_ENV
from tracegym.testing import FakeOpenAIServer, Stall
from tracegym.testing.echo import SPEC, Echo
from tracegym.testing.netns import NetnsHosts, available

TURN_S = 0.5
ROLLOUT_S = 1.0


# --- inference servers -------------------------------------------------------------------------------------
async def inference_case(loss: str | None, every: float, timeout: float) -> tuple[float, float]:
    """(seen lost, every turn answered) in seconds from the loss (from the start without one)."""
    servers = [FakeOpenAIServer(rule=lambda _: Stall(TURN_S, "ok"), model="m").start() for _ in range(2)]
    endpoint = Endpoint(base_url=servers[0].base_url, model="m", replicas=(servers[1].base_url,), api_key_env=None,
                        tokens="off", health_every=every, probe_timeout=timeout, backoff=0.01)
    router = Router(endpoint, ChatClient)
    try:
        calls = [asyncio.ensure_future(router.complete(ModelRequest(messages=[user(f"s{i}")], session=f"s{i}")))
                 for i in range(16)]
        await asyncio.sleep(0.1)  # every call in flight, 8 on each server
        start = time.monotonic()
        if loss == "kill":
            servers[1].stop()
        elif loss == "hang":
            servers[1].hung = True
        seen = asyncio.ensure_future(_when(lambda: router.stats.taken_out > 0)) if loss else None
        await asyncio.gather(*calls)
        done = time.monotonic() - start
        return (await seen if seen else 0.0), done
    finally:
        await router.aclose()
        servers[1].hung = False
        for server in servers:
            server.stop()


async def _when(condition: Callable[[], bool], limit: float = 60.0) -> float:
    """Seconds until `condition()` holds (polled every 10 ms)."""
    start = time.monotonic()
    while not condition() and time.monotonic() - start < limit:
        await asyncio.sleep(0.01)
    return time.monotonic() - start


# --- env hosts -----------------------------------------------------------------------------------------------
async def env_case(hosts: NetnsHosts, addresses: list[str], endpoint: Endpoint, loss: str | None,
                   liveness: float) -> tuple[float, float]:
    """(seen lost, whole run) in seconds from the loss (from the start without one)."""
    async with EnvClient(addresses, liveness_timeout=liveness, per_request=1) as client:
        run = asyncio.ensure_future(client.evaluate(Echo({"setup_sleep": ROLLOUT_S}), endpoint, num_tasks=9,
                                                    concurrency=9))
        await _when(lambda: [h.load for h in client.hosts] == [3, 3, 3], 20)
        start = time.monotonic()
        if loss == "kill":
            hosts.kill(1)
        elif loss == "cut":
            hosts.cut(1)
        seen = asyncio.ensure_future(_when(lambda: client.moved >= 3)) if loss else None
        traces = await run
        done = time.monotonic() - start
        assert len(traces) == 9 and all(t.ok for t in traces), [t.errors for t in traces if not t.ok]
        assert len({(t.task_key, t.rollout_index) for t in traces}) == 9
        return (await seen if seen else 0.0), done


async def env_hosts(liveness: float) -> None:
    os.environ[SECRET_ENV] = "failover-benchmark-secret-0123456789"
    print(f"\nenv hosts (3 netns hosts, 3 rollouts of {ROLLOUT_S:g} s in flight on each; liveness {liveness:g} s)")
    print(f"{'loss':>22}  {'seen lost':>9}  {'all done':>8}")
    for loss in (None, "kill", "cut"):
        with NetnsHosts(3) as hosts, contextlib.ExitStack() as stack:  # fresh hosts: the lost one stays lost
            model = stack.enter_context(FakeOpenAIServer(["ok"], host=hosts.gateway(0)))
            addresses = [stack.enter_context(local_server(SPEC, {"setup_sleep": ROLLOUT_S}, workers=1,
                                                          address=f"tcp://{hosts.address(i)}:0",
                                                          under=hosts.run_in(i))) for i in range(3)]
            endpoint = Endpoint(base_url=model.base_url, model=model.model, api_key_env=None, max_retries=0)
            seen, done = await env_case(hosts, addresses, endpoint, loss, liveness)
        name = {None: "none (baseline)", "kill": "processes killed", "cut": "host cut off (no FIN)"}[loss]
        print(f"{name:>22}  {seen:>8.2f}s  {done:>7.2f}s", flush=True)


async def inference_servers(every: float, timeout: float) -> None:
    print(f"inference servers (2 fake servers, 8 turns of {TURN_S:g} s in flight on each; "
          f"probe every {every:g} s, timeout {timeout:g} s)")
    print(f"{'loss':>22}  {'seen lost':>9}  {'all done':>8}")
    for loss in (None, "kill", "hang"):
        seen, done = await inference_case(loss, every, timeout)
        name = {None: "none (baseline)", "kill": "server killed", "hang": "server hung"}[loss]
        print(f"{name:>22}  {seen:>8.2f}s  {done:>7.2f}s", flush=True)


# --- env-server workers ----------------------------------------------------------------------------------------
WORKER_ROLLOUT_S = 0.3


class Rollout(NamedTuple):
    """One rollout as the benchmark saw it; times are wall-clock seconds (`started`: the trace's own start, in the
    worker that ran it last)."""

    task: str
    index: int
    ok: bool
    sent: float
    started: float
    answered: float


async def worker_case(address: str, endpoint: Endpoint, gap: float | None, poison: str | None = None) -> str:
    """One eval of 200 rollouts (50 tasks x 4) through the server at `address`; with `gap`, its two original
    workers are killed `gap` s apart once 40 rollouts are done. One line: per kill when everything sent before it
    ran again and was answered, the eval's time, ok / total, duplicates."""
    rows = [TaskData(id=f"echo-{n}", prompt=f"Say w{n}.", answer=f"w{n}") for n in range(50)]
    done: list[Rollout] = []
    gate = asyncio.Semaphore(16)
    async with EnvClient(address, per_request=1, request_timeout=120) as client:
        while (health := await client.health())["workers"]["ready"] < 2:
            await asyncio.sleep(0.05)
        originals = [p for p in health["pids"] if p not in health.get("spares", [])]

        async def one(row: TaskData, index: int) -> None:
            async with gate:
                sent = time.time()
                try:
                    [trace] = await client.run(row, endpoint, rollout_indices=[index])
                except RemoteError:  # a request that kept killing its worker: a failed rollout, blamed
                    done.append(Rollout(str(row.id), index, False, sent, time.time(), time.time()))
                    return
                done.append(Rollout(str(row.id), index, trace.ok, sent, trace.started_at, time.time()))

        start = time.time()
        run = asyncio.gather(*(one(row, i) for row in rows for i in range(4)))
        kills: list[float] = []
        if gap is not None:
            await _when(lambda: len(done) >= 40, 60)
            for pid in originals[:2]:
                os.kill(pid, signal.SIGKILL)
                kills.append(time.time())
                await asyncio.sleep(gap)
        await run
        health = await client.health()
    took = time.time() - start
    keys = {(r.task, r.index) for r in done}
    ok = sum(r.ok for r in done)
    line = [f"{_recovery(done, kills)}", f"{took:6.2f}s", f"{ok}/{len(done)}", f"{len(done) - len(keys)} dup"]
    if poison is not None:
        failed = sorted({r.task for r in done if not r.ok})
        line.append(f"failed: {', '.join(failed) or 'none'}, {health['stats'].get('workers_died', 0)} deaths")
    return "  ".join(line)


def _recovery(done: list[Rollout], kills: list[float]) -> str:
    """Per kill: the latest start (`rerun`) and answer (`done`) of a rollout sent before it that started (for the
    last time) after it, in seconds from the kill: when everything it held up ran again, and was answered."""
    if not kills:
        return " " * 26 * 2
    cells = []
    for kill in kills:
        held = [(r.started, r.answered) for r in done if r.sent < kill <= r.started]
        rerun = max((s - kill for s, _ in held), default=0.0)
        answered = max((a - kill for _, a in held), default=0.0)
        cells.append(f"{rerun:5.2f}s/{answered:5.2f}s ({len(held):>2})")
    return "  ".join(cells)


async def env_workers(old_src: str | None, gaps: list[float], repeats: int) -> None:
    print(f"\nenv-server workers (2 workers, rollouts of {WORKER_ROLLOUT_S:g} s, 200 at 16 at a time; the two "
          "original workers killed `gap` s apart)")
    print(f"{'code':>4}  {'case':>18}  {'1st kill: rerun/done (n)':>24}  {'2nd kill: rerun/done (n)':>24}  "
          "  eval       ok    dups")
    with FakeOpenAIServer(["ok"]) as model:
        endpoint = Endpoint(base_url=model.base_url, model=model.model, api_key_env=None, max_retries=0)
        sides = [("old", old_src), ("new", None)] if old_src else [("new", None)]
        cases: list[tuple[str, float | None, str | None]] = [("no kill", None, None)]
        for gap in gaps:
            cases += [(f"kills {gap:g} s apart", gap, None)] * repeats
        cases += [("crash-looping", None, "echo-7")]
        for case, kill_gap, poison in cases:
            for side, src in sides:
                options = {"setup_sleep": WORKER_ROLLOUT_S, **({"poison_task": poison} if poison else {})}
                with code_from(src), local_server(SPEC, options, workers=2) as address:
                    line = await worker_case(address, endpoint, kill_gap, poison)
                print(f"{side:>4}  {case:>18}  {line}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--liveness", type=float, default=2.0, help="the env client's liveness timeout (s)")
    parser.add_argument("--probe-every", type=float, default=0.5, help="the router's health_every (s)")
    parser.add_argument("--probe-timeout", type=float, default=1.0, help="the router's probe_timeout (s)")
    parser.add_argument("--old-src", help="`src` of an old checkout: its env servers run the worker cases too")
    parser.add_argument("--gap", type=float, nargs="+", default=[1.0], help="seconds between the two worker kills")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the two-kill case per side")
    parser.add_argument("--only", choices=["inference", "hosts", "workers"], help="run one section")
    args = parser.parse_args()
    if args.only in (None, "inference"):
        asyncio.run(inference_servers(args.probe_every, args.probe_timeout))
    if args.only in (None, "hosts") and available():
        asyncio.run(env_hosts(args.liveness))
    elif args.only in (None, "hosts"):
        print("\nenv hosts: skipped (needs root and iproute2 for network namespaces)")
    if args.only in (None, "workers"):
        asyncio.run(env_workers(args.old_src, args.gap, args.repeats))


if __name__ == "__main__":
    main()
