"""Benchmark: the latency a model call gains by going through the interception proxy, side by side with the
same call made directly, at concurrency 1.

The fake OpenAI server runs in its own process and answers at once. An "agent" (a plain aiohttp client, the same
for both paths) runs episodes of `--turns` calls whose history grows by one reply and one user message per call,
as an agent's does. Direct: it posts each call to the fake server, as the agent sends it ("direct") and asking
for token ids and logprobs as the proxy does ("direct+tokens": like with like, since the fake server's reply is
then larger). Through the proxy: it posts the agent's call to a rollout's proxy key; the proxy matches the history
onto the rollout's graph, calls the fake server through the rollout's ChatClient (token ids and logprobs) and
records the reply with its tokens. The proxy and the agent share this process's event loop (at concurrency 1
they never run at the same moment). Paths rotate by episode; p50/p99 per call, this process's CPU time per call
(agent and proxy; the fake server runs elsewhere: the least load-sensitive figure) and the p50 difference against
direct+tokens are printed. Target (issue 17): at most 1 ms added at p50. The load average is printed: on a
shared machine, wall-clock figures grow with it.

Then the hop a sandboxed program adds: the same episodes made by a program (plain `http.client`, one kept-alive
connection) in a `subprocess` sandbox, through the proxy both times: with `Limits.network` on it calls the
proxy's TCP port on the host's loopback; off (the default for agent programs), its call goes to its own
loopback, where the sandbox's init carries it to the proxy's Unix socket. The difference is the forwarder's hop.

    .venv/bin/python benchmarks/proxy_latency.py [--episodes 40] [--turns 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from fake_endpoint import fake_endpoint

from tracegym import Endpoint, Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.proxy import InterceptionProxy
from tracegym.envs.rollout import Rollout, Timeouts
from tracegym.envs.task import Task
from tracegym.models.chat_client import ChatClient
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.sandbox import Limits

MODEL = "fake-model"


async def episode(http: aiohttp.ClientSession, url: str, turns: int, tokens: bool = False) -> list[float]:
    """Seconds per call of one agent episode against `url` (a chat-completions URL); with `tokens` each call asks
    for token ids and logprobs, as the proxy's own calls do."""
    extra = {"return_token_ids": True, "logprobs": True} if tokens else {}
    history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me of foxes."}]
    took = []
    for turn in range(turns):
        body = json.dumps({"model": MODEL, "messages": history, "max_tokens": 32, **extra})
        start = time.perf_counter()
        async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as answer:
            data = await answer.json()
        took.append(time.perf_counter() - start)
        history += [data["choices"][0]["message"], {"role": "user", "content": f"And then? ({turn})"}]
    return took


async def proxied(http: aiohttp.ClientSession, client: ChatClient, turns: int) -> list[float]:
    """One episode through a fresh rollout's proxy key (the lease's setup is outside the timings)."""
    task = Task(TaskData(prompt="foxes"), max_turns=turns)
    rollout = Rollout(task, client, Sampling(max_tokens=32), Timeouts(), Trace(task=task.data, model=MODEL))
    async with InterceptionProxy.shared().lease(rollout) as lease:
        took = await episode(http, lease.base_url + "/chat/completions", turns)
    assert rollout.trace.num_turns == turns and len(rollout.trace.branches) == 1 and not rollout.trace.errors
    assert rollout.trace.graph.nodes[-1].token_ids, "the proxy's calls carry token ids"
    return took


SANDBOXED_EPISODE = """
import http.client, json, os, sys, time, urllib.parse
url = urllib.parse.urlsplit(os.environ["OPENAI_BASE_URL"])
connection = http.client.HTTPConnection(url.hostname, url.port)
history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me of foxes."}]
took = []
for turn in range(int(sys.argv[1])):
    body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": history, "max_tokens": 32})
    start = time.perf_counter()
    connection.request("POST", url.path + "/chat/completions", body, {"Content-Type": "application/json"})
    data = json.loads(connection.getresponse().read())
    took.append(time.perf_counter() - start)
    history += [data["choices"][0]["message"], {"role": "user", "content": f"And then? ({turn})"}]
print(json.dumps(took))
"""
"""An agent episode as a sandboxed program makes it: seconds per call, as JSON on stdout."""


async def sandboxed(client: ChatClient, turns: int, network: bool) -> list[float]:
    """One episode by a program in a subprocess sandbox, through a fresh rollout's proxy key: over the host's
    loopback (`network`) or its own, forwarded to the proxy's Unix socket."""
    task = Task(TaskData(prompt="foxes"), max_turns=turns)
    rollout = Rollout(task, client, Sampling(max_tokens=32), Timeouts(), Trace(task=task.data, model=MODEL))
    box = await runtime_for("subprocess", Limits(wall_seconds=60, network=network)).open()
    try:
        async with InterceptionProxy.shared().lease(rollout) as lease:
            env = {"OPENAI_BASE_URL": lease.base_url, "OPENAI_MODEL": MODEL}
            result = await box.run(["python3", "-c", SANDBOXED_EPISODE, str(turns)], env=env, forward=lease.forward)
    finally:
        await box.close()
    assert result.ok, result
    assert rollout.trace.num_turns == turns and not rollout.trace.errors
    return json.loads(result.stdout)


async def measure_hop(base_url: str, episodes: int, turns: int) -> tuple[list[float], list[float]]:
    """Per-call seconds of sandboxed episodes over the host's loopback and over the forwarder, alternated."""
    tcp: list[float] = []
    forwarded: list[float] = []
    client = ChatClient(Endpoint(base_url=base_url, model=MODEL, api_key_env=None, max_retries=0))
    await sandboxed(client, turns, True)  # warm up
    await sandboxed(client, turns, False)
    for i in range(episodes):
        for network in ((True, False) if i % 2 == 0 else (False, True)):
            (tcp if network else forwarded).extend(await sandboxed(client, turns, network))
    await client.aclose()
    return tcp, forwarded


def quantiles(seconds: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    cuts = statistics.quantiles(seconds, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


async def measure(base_url: str, episodes: int, turns: int) -> dict[str, tuple[list[float], float]]:
    """Per path: seconds per call, and this process's CPU seconds per call."""
    url = base_url + "/chat/completions"
    took: dict[str, list[float]] = {"direct": [], "direct+tokens": [], "via proxy": []}
    cpu = dict.fromkeys(took, 0.0)
    client = ChatClient(Endpoint(base_url=base_url, model=MODEL, api_key_env=None, max_retries=0))
    keep = InterceptionProxy.shared()
    async with aiohttp.ClientSession() as http, keep.lease(Rollout(  # one idle lease keeps the server up
            Task(TaskData(prompt="-")), client, Sampling(), Timeouts(), Trace(task=TaskData(prompt="-")))):
        paths = {"direct": lambda: episode(http, url, turns), "direct+tokens": lambda: episode(http, url, turns, True),
                 "via proxy": lambda: proxied(http, client, turns)}
        for run in paths.values():  # warm every path's connections
            await run()
        names = list(paths)
        for i in range(episodes):
            for name in names[i % 3:] + names[:i % 3]:
                start = time.process_time()
                took[name] += await paths[name]()
                cpu[name] += time.process_time() - start
    await client.aclose()
    return {name: (seconds, cpu[name] / len(seconds)) for name, seconds in took.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=40, help="episodes per path")
    parser.add_argument("--turns", type=int, default=16, help="calls per episode (the history grows each call)")
    parser.add_argument("--hop-episodes", type=int, default=10, help="sandboxed episodes per path")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}, {os.cpu_count()} cores")
    with fake_endpoint() as base_url:
        paths = asyncio.run(measure(base_url, args.episodes, args.turns))
        tcp, forwarded = asyncio.run(measure_hop(base_url, args.hop_episodes, args.turns))
    print(f"calls per path: {len(paths['direct'][0])} ({args.episodes} episodes of {args.turns} turns), "
          f"concurrency 1")
    print(f"{'path':<16}{'p50 ms':>10}{'p99 ms':>10}{'cpu ms/call':>13}")
    for name, (seconds, cpu) in paths.items():
        print(f"{name:<16}" + "".join(f"{q:>10.3f}" for q in quantiles(seconds)) + f"{cpu * 1000:>13.3f}")
    (d50, d99), (p50, p99) = quantiles(paths["direct+tokens"][0]), quantiles(paths["via proxy"][0])
    added_cpu = (paths["via proxy"][1] - paths["direct+tokens"][1]) * 1000
    print(f"added (vs direct+tokens) at p50: {p50 - d50:.3f} ms, at p99: {p99 - d99:.3f} ms, CPU {added_cpu:.3f} "
          f"ms per call (target: <= 1 ms at p50); ratio p50 {p50 / d50:.2f}x")
    (t50, t99), (f50, f99) = quantiles(tcp), quantiles(forwarded)
    print(f"sandboxed program via proxy: {len(tcp)} calls per path ({args.hop_episodes} episodes)")
    print(f"{'host loopback':<16}{t50:>10.3f}{t99:>10.3f}")
    print(f"{'forwarded':<16}{f50:>10.3f}{f99:>10.3f}")
    print(f"the forwarder's hop at p50: {f50 - t50:.3f} ms, at p99: {f99 - t99:.3f} ms; ratio p50 {f50 / t50:.2f}x")
    print(f"load average at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
