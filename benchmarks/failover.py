"""Benchmark: failover times, from a lost inference server or env host to its rollouts completing elsewhere.

Inference servers (two fake OpenAI servers, every call 0.5 s, behind the router): one is killed (its connections
close) or hangs (still connected, never answers: found by the router's probe) while 8 sessions have a turn in
flight on each. Env hosts (three network namespaces standing for hosts, each running `tracegym serve` with the
shared secret; needs root): one host's processes are killed (the kernel closes their connections) or the host is
cut off the network (no FIN: found by the client's liveness timeout) while 3 rollouts of 1 s run on each. Each
case prints when the lost work was seen lost, when the last of it completed elsewhere, and the same run's time
without a loss, side by side.

    .venv/bin/python benchmarks/failover.py [--liveness 2.0] [--probe-every 0.5 --probe-timeout 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Callable

from tracegym import Endpoint
from tracegym.core.messages import user
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelRequest
from tracegym.models.router import Router
from tracegym.serve import EnvClient
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--liveness", type=float, default=2.0, help="the env client's liveness timeout (s)")
    parser.add_argument("--probe-every", type=float, default=0.5, help="the router's health_every (s)")
    parser.add_argument("--probe-timeout", type=float, default=1.0, help="the router's probe_timeout (s)")
    args = parser.parse_args()
    asyncio.run(inference_servers(args.probe_every, args.probe_timeout))
    if available():
        asyncio.run(env_hosts(args.liveness))
    else:
        print("\nenv hosts: skipped (needs root and iproute2 for network namespaces)")


if __name__ == "__main__":
    main()
