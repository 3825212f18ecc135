"""Benchmark: rollouts/s on the embedded VLM at concurrency 8, single-image prompts vs text-only, on one server.

Both run through the token client (`tracegym.evaluate`): an image prompt goes to vLLM's generate endpoint with
the image, a text prompt to its completions endpoint. Each prompt is one user turn; the reply is capped at
`--max-tokens` sampled tokens (temperature 1, so lengths vary a little: the mean is printed). Each image is a
distinct generated PNG (a random colour, 64x64), so vLLM's image cache never answers for it. Rounds alternate which
kind goes first; the best round of each counts. Without `--base-url` it starts vLLM on the VLM itself and prints
how long that took; the VLM folder's size is printed too.

    .venv/bin/python benchmarks/vlm_rollouts.py [--base-url http://127.0.0.1:8000/v1] [--rollouts 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import random
import time
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

import tracegym as tg
from tracegym.models.embedded_vlm import embedded_vlm_dir, vlm_choice
from tracegym.models.endpoint import Endpoint
from tracegym.models.launch import server_config
from tracegym.models.model_choice import ModelChoice
from tracegym.models.renderer import load_renderer
from tracegym.models.token_client import TokenClient
from tracegym.models.vllm_server import VLLMServer

CONCURRENCY = 8


def png_uri(rng: random.Random) -> str:
    colour = tuple(rng.randrange(256) for _ in range(3))
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def taskset(kind: str, count: int, seed: int) -> tg.Taskset:
    rng = random.Random(seed)
    if kind == "text":
        rows = [{"prompt": f"What colour is the number {i}?"} for i in range(count)]
    else:
        rows = [{"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_uri(rng)}},
                                                          {"type": "text", "text": "What colour is it?"}]}]}
                for _ in range(count)]
    return tg.Taskset(id=f"vlm-{kind}", data=rows)


async def measure(kind: str, client: TokenClient, count: int, seed: int, max_tokens: int) -> tuple[float, float]:
    """(rollouts/s, mean completion tokens) of `count` rollouts, `CONCURRENCY` at once."""
    sampling = tg.Sampling(max_tokens=max_tokens, temperature=1.0)
    started = time.perf_counter()
    traces = await tg.evaluate(taskset(kind, count, seed), client, sampling=sampling, concurrency=CONCURRENCY)
    seconds = time.perf_counter() - started
    failed = [t.errors for t in traces if t.errors]
    if failed:
        raise SystemExit(f"{len(failed)} {kind} rollouts failed: {failed[0]}")
    return count / seconds, sum(t.usage.completion_tokens for t in traces) / count


@contextlib.contextmanager
def server(base_url: str | None) -> Iterator[tuple[str, str]]:
    """(base URL, served name) of the VLM's server: the one given, else one started here (its start timed)."""
    config = server_config(vlm_choice(ModelChoice()))
    if base_url is not None:
        yield base_url, config.name
        return
    config = config.model_copy(update={"startup_timeout_s": 1800})
    started = time.perf_counter()
    with VLLMServer(config) as started_server:
        print(f"vLLM start on the VLM: {time.perf_counter() - started:.1f} s")
        yield started_server.base_url, config.name


async def main(args: argparse.Namespace) -> None:
    folder = embedded_vlm_dir()
    size = sum(f.stat().st_size for f in Path(folder).iterdir() if f.is_file())
    print(f"VLM folder {folder}: {size / 2**20:.0f} MiB")
    with server(args.base_url) as (base_url, name):
        renderer = load_renderer(str(folder))
        best: dict[str, tuple[float, float]] = {}
        async with TokenClient(Endpoint(base_url=base_url, model=name, timeout=600), renderer) as client:
            await measure("image", client, CONCURRENCY, 999, args.max_tokens)  # warm both paths
            await measure("text", client, CONCURRENCY, 999, args.max_tokens)
            for round_index in range(args.rounds):
                kinds = ["image", "text"] if round_index % 2 == 0 else ["text", "image"]
                for kind in kinds:
                    rate, tokens = await measure(kind, client, args.rollouts, round_index, args.max_tokens)
                    print(f"round {round_index} {kind:5s}: {rate:.2f} rollouts/s ({tokens:.1f} completion tokens)")
                    if rate > best.get(kind, (0.0, 0.0))[0]:
                        best[kind] = (rate, tokens)
    image, text = best["image"][0], best["text"][0]
    print(f"best: image {image:.2f} rollouts/s, text {text:.2f} rollouts/s, image/text {image / text:.2f}x "
          f"(c={CONCURRENCY}, {args.rollouts} rollouts a round, max {args.max_tokens} tokens)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a running VLM server (`tracegym inference --vlm`); unset: start one")
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    asyncio.run(main(parser.parse_args()))
