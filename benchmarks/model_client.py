"""Benchmark: requests/s of tracegym's ChatClient vs the bare `openai` SDK against one fake server, side by side.

The fake OpenAI server runs in its own process and answers at once, so the figures measure client overhead.
Each round runs both clients at each concurrency, alternating which goes first; the best round counts.
Target (issue 3): ours >= 1.0x the SDK's at concurrency 128.

    .venv/bin/python benchmarks/model_client.py [--requests 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).parent))
from fake_endpoint import fake_endpoint

from tracegym import Endpoint, ModelRequest, Sampling
from tracegym.core.messages import user
from tracegym.models.chat_client import ChatClient

MESSAGES = [user("Say something about foxes.")]


async def rate(call: Callable[[], Awaitable[object]], concurrency: int, total: int) -> float:
    """Requests per second with `concurrency` calls in flight until `total` are done."""
    left = total

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - start)


async def measure(base_url: str, concurrency: int, total: int, rounds: int) -> tuple[float, float]:
    """Best requests/s of (ours, the SDK) over `rounds`."""
    ours = ChatClient(Endpoint(base_url=base_url, model="fake-model", api_key_env=None, max_retries=0))
    sdk = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    request = ModelRequest(messages=MESSAGES, sampling=Sampling(max_tokens=32))

    async def ours_call() -> object:
        return await ours.complete(request)

    async def sdk_call() -> object:
        return await sdk.chat.completions.create(
            model="fake-model", messages=[m.to_openai() for m in MESSAGES], max_tokens=32,  # type: ignore[misc]
            extra_body={"return_token_ids": True, "logprobs": True})

    best_ours = best_sdk = 0.0
    await rate(ours_call, concurrency, min(total, 200))  # warm both connection pools
    await rate(sdk_call, concurrency, min(total, 200))
    for i in range(rounds):
        order = [("ours", ours_call), ("sdk", sdk_call)]
        for name, call in order if i % 2 == 0 else reversed(order):
            r = await rate(call, concurrency, total)
            if name == "ours":
                best_ours = max(best_ours, r)
            else:
                best_sdk = max(best_sdk, r)
    await ours.aclose()
    await sdk.close()
    return best_ours, best_sdk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best counts")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 128])
    args = parser.parse_args()
    print(f"{'concurrency':>11}  {'tracegym req/s':>14}  {'openai SDK req/s':>16}  {'ratio':>6}")
    with fake_endpoint() as base_url:
        for c in args.concurrency:
            ours, sdk = asyncio.run(measure(base_url, c, args.requests, args.rounds))
            print(f"{c:>11}  {ours:>14.0f}  {sdk:>16.0f}  {ours / sdk:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
