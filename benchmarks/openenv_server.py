"""Benchmark: a tracegym taskset over OpenEnv: our OpenEnv server vs our ZMQ env server, and vs openenv's own server.

The echo taskset (tracegym.testing.echo) runs 1-turn and 5-turn rollouts; every server runs in its own process.
1. Our OpenEnv server (`tracegym serve --protocol openenv`) vs our ZMQ env server (`tracegym serve`, one worker):
   the same instant fake model (the fake OpenAI server in its own process) answers every turn. Through ZMQ the
   worker calls it; over OpenEnv the client is the agent: it calls the model, then steps (openenv's own client).
2. The same environment (the taskset as an openenv Environment, `TasksetEnvironment`) on openenv's own server
   (`create_app` under uvicorn, on asyncio's event loop, and on the one `uvicorn.run(app)` picks: uvloop where
   installed) vs on ours, its sessions in a worker process (the default; its server then on uvloop where installed)
   and in its own process (`--openenv.workers 0`): the agent answers at once, without a model, so the figures
   measure the servers.
`concurrency` callers each run one rollout at a time until `rollouts` are done; each path is measured `--repeats`
times, interleaved, and the medians are printed side by side with the ratio to the first path, and with the CPU
time the server spent per rollout (its process and its workers, all of them together: on a machine whose cores are
busy with other work, as this 2-core one is, the CPU a path costs says more than its rate). An OpenEnv caller keeps
its session (WebSocket) open and resets it for the next rollout, as a trainer's environments do; with "raw WS" it
sends plain frames instead of using openenv's client. Latency is per rollout as the caller sees it (p50).

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/openenv_server.py [--rollouts 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import psutil
from fake_endpoint import fake_endpoint
from openenv.core.client_types import StepResult
from openenv.core.generic_client import GenericEnvClient
from websockets.asyncio.client import connect

from tracegym import Endpoint, Sampling
from tracegym.core.messages import Message
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelRequest
from tracegym.runtimes import processes
from tracegym.serve import EnvClient, local_server
from tracegym.testing.echo import SPEC, Echo

SAMPLING = Sampling(max_tokens=32)
WARM_UP_S = 1.0
MAX_SESSIONS = 256
Rollout = Callable[[int], Awaitable[bool]]
"""Runs rollout n; True when it ended well."""


@dataclass
class Result:
    rate: float
    p50_ms: float
    failed: int
    cpu_ms: float = 0.0
    """Server CPU per rollout (ms)."""
    done: int = 0
    """Rollouts run, warm-up included."""


@dataclass
class Path_:
    """A path to measure: its rollouts, and the server's port (for its CPU time)."""

    go: Callable[[int, int], Awaitable[Result]]
    port: int


def server_cpu_s(port: int) -> float:
    """CPU seconds (user + system) of the process listening on `port` and of all its descendants so far."""
    [pid] = {c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    server = psutil.Process(pid)
    total = 0.0
    for proc in [server, *server.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def drive(rollout: Rollout, concurrency: int, total: int) -> Result:
    """`concurrency` callers, each one rollout at a time, until `total` are done."""
    latencies: list[float] = []
    failed = 0
    counter = iter(range(total))

    async def caller() -> None:
        nonlocal failed
        for n in counter:
            start = time.perf_counter()
            failed += not await rollout(n)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return Result(total / (time.perf_counter() - start), statistics.median(latencies) * 1e3, failed, done=total)


async def measure(rollout: Rollout, concurrency: int, total: int) -> Result:
    warm_until = time.perf_counter() + WARM_UP_S
    warmed = 0
    while time.perf_counter() < warm_until:
        warmed += (await drive(rollout, concurrency, max(20, concurrency))).done
    result = await drive(rollout, concurrency, total)
    result.done += warmed
    return result


async def measured(path: Path_, concurrency: int, total: int) -> Result:
    """One measurement of `path`, with the server's CPU per rollout over all of it (the warm-up's rollouts and CPU
    included)."""
    before = server_cpu_s(path.port)
    result = await path.go(concurrency, total)
    result.cpu_ms = (server_cpu_s(path.port) - before) * 1e3 / max(1, result.done)
    return result


def through_zmq(address: str, endpoint: Endpoint) -> Callable[[int, int], Awaitable[Result]]:
    """Rollouts through the ZMQ env server, whose worker calls the model."""
    tasks = list(Echo({"num_tasks": 100}))

    async def go(concurrency: int, total: int) -> Result:
        async with EnvClient(address) as client:
            async def rollout(n: int) -> bool:
                [trace] = await client.run(tasks[n % len(tasks)], endpoint, SAMPLING, rollout_indices=[0])
                return trace.ok
            return await measure(rollout, concurrency, total)
    return go


def over_openenv(url: str, endpoint: Endpoint | None, raw: bool = False) -> Callable[[int, int], Awaitable[Result]]:
    """Rollouts as an OpenEnv agent: reset, then (ask the model, or answer at once) and step until done; through
    openenv's own client, or (`raw`) plain WebSocket frames, to tell the client's cost from the server's."""
    async def go(concurrency: int, total: int) -> Result:
        model = ChatClient(endpoint) if endpoint is not None else None

        async def answer(messages: list[Message]) -> str:
            if model is None:
                return messages[-1].text.removeprefix("Say ").removesuffix(".")
            return (await model.complete(ModelRequest(messages=messages, sampling=SAMPLING))).message.text

        idle: list[GenericEnvClient | RawAgent] = []  # sessions kept open between rollouts, as a trainer's are

        async def rollout(n: int) -> bool:
            env = idle.pop() if idle else await (RawAgent(url) if raw else GenericEnvClient(base_url=url)).__aenter__()
            result = await env.reset(index=n % 100)
            messages = [Message.from_openai(m) for m in result.observation["messages"]]
            while not result.done:
                result = await env.step({"message": await answer(messages)})
                messages += [Message.from_openai(m) for m in result.observation["messages"]]
            idle.append(env)
            return result.reward is not None
        try:
            return await measure(rollout, concurrency, total)
        finally:
            for env in idle:
                await env.__aexit__(None, None, None)
            if model is not None:
                await model.aclose()
    return go


class RawAgent:
    """The least an OpenEnv client can do: one WebSocket, a JSON frame out and one back per call."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def __aenter__(self) -> RawAgent:
        self.ws = await connect(f"{self.url}/ws", compression=None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.send(json.dumps({"type": "close"}))
        await self.ws.close()

    async def reset(self, **data: object) -> StepResult:
        return await self._call({"type": "reset", "data": data})

    async def step(self, action: dict) -> StepResult:
        return await self._call({"type": "step", "data": action})

    async def _call(self, frame: dict) -> StepResult:
        await self.ws.send(json.dumps(frame))
        data = json.loads(await self.ws.recv())["data"]
        return StepResult(observation=data["observation"], reward=data.get("reward"), done=data.get("done", False))


_OPENENV_APP = """
import sys
from openenv.core.env_server.http_server import create_app
from tracegym.interop.openenv_environment import TasksetEnvironment
from tracegym.interop.openenv_protocol import TasksetAction, TasksetObservation, TasksetState
from tracegym.interop.openenv_server import OpenEnvServer
from tracegym.testing.echo import Echo
server = OpenEnvServer(Echo({"turns": int(sys.argv[1])}))  # for its socket and uvicorn settings only
app = create_app(TasksetEnvironment.of(server.taskset), TasksetAction, TasksetObservation,
                 max_concurrent_envs=int(sys.argv[2]), state_cls=TasksetState)
sock = server.bind()
print(f"address: ws://127.0.0.1:{sock.getsockname()[1]}", flush=True)
import uvicorn
config = uvicorn.Config(app, log_level="warning", ws_ping_interval=None, ws_per_message_deflate=sys.argv[3] == "1",
                        loop=sys.argv[4])
uvicorn.Server(config).run(sockets=[sock])
"""


@contextlib.contextmanager
def openenv_create_app(turns: int, deflate: bool = True, loop: str = "asyncio") -> Iterator[str]:
    """The echo taskset as a TasksetEnvironment on openenv's own server, in its own process (uvicorn's default
    per-message deflate on, as `uvicorn.run(app)` serves it, or off, as ours runs), on asyncio's event loop or on
    `loop="auto"`'s, as `uvicorn.run(app)` picks it (uvloop where installed)."""
    proc = processes.spawn_group([sys.executable, "-c", _OPENENV_APP, str(turns), str(MAX_SESSIONS), str(int(deflate)),
                                  loop], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        yield line.split(": ", 1)[1].strip()
    finally:
        processes.stop(proc, 5.0, group=True)


@contextlib.contextmanager
def ours(turns: int, workers: int = 1) -> Iterator[str]:
    """Our OpenEnv server (`tracegym serve --protocol openenv`), its rollouts in `workers` worker processes (0: in its
    own process)."""
    args = ["--protocol", "openenv", "--port", "0", "--openenv.max-concurrent-envs", str(MAX_SESSIONS),
            "--openenv.workers", str(workers)]
    with local_server(SPEC, {"turns": turns}, extra_args=args) as url:
        yield url


def compare(paths: dict[str, Path_], turns: int, concurrency: int, total: int, repeats: int) -> None:
    """Measure each path `repeats` times, interleaved (so a busy moment of the machine hits them all), and print
    each one's median rate and median p50, with its ratio to the first path's."""
    runs: dict[str, list[Result]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, path in paths.items():
            runs[name].append(asyncio.run(measured(path, concurrency, total)))
    medians = {name: Result(statistics.median(r.rate for r in results),
                            statistics.median(r.p50_ms for r in results), sum(r.failed for r in results),
                            statistics.median(r.cpu_ms for r in results))
               for name, results in runs.items()}
    base = next(iter(medians.values()))
    for name, result in medians.items():
        ratio = f"{result.rate / base.rate:5.2f}x" if result is not base else "     -"
        print(f"| {turns} | {concurrency:>3} | {name:<30} | {result.rate:8.0f} | {ratio} | {result.p50_ms:7.2f} | "
              f"{result.cpu_ms:6.2f} | {result.failed} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000,
                        help="single-turn rollouts per measurement at the highest concurrency (5-turn: a fifth; "
                             "concurrency 1: a quarter)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per path, interleaved; medians shown")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--workers", type=int, default=1, help="workers of the ZMQ env server")
    parser.add_argument("--sections", type=int, nargs="+", default=[1, 2], help="which comparisons to run")
    args = parser.parse_args()

    def count(turns: int, concurrency: int) -> int:
        return max(50, args.rollouts // turns // (4 if concurrency == 1 else 1))

    header = ("| turns | conc. | path | rollouts/s | vs first | p50 ms | server CPU ms/rollout | failed |\n"
              "|---|---|---|---|---|---|---|---|")
    if 1 in args.sections:
        section_one(args, count, header)
    if 2 in args.sections:
        section_two(args, count, header)


def section_one(args: argparse.Namespace, count: Callable[[int, int], int], header: str) -> None:
    print("## 1. Our OpenEnv server vs our ZMQ env server (instant fake model)\n" + header)
    with fake_endpoint() as base_url:
        endpoint = Endpoint(base_url=base_url, model="fake-model", api_key_env=None, max_retries=0)
        for turns in args.turns:
            with local_server(SPEC, {"turns": turns}, workers=args.workers) as zmq, ours(turns) as url:
                paths = {f"ZMQ env server ({args.workers}w)": Path_(through_zmq(zmq, endpoint), port_of(zmq)),
                         "our OpenEnv server": Path_(over_openenv(url, endpoint), port_of(url)),
                         "our OpenEnv server, raw WS": Path_(over_openenv(url, endpoint, raw=True), port_of(url))}
                for c in args.concurrency:
                    compare(paths, turns, c, count(turns, c), args.repeats)


def section_two(args: argparse.Namespace, count: Callable[[int, int], int], header: str) -> None:
    print("\n## 2. The same environment on openenv's own server vs ours (agent answers at once)\n" + header)
    for turns in args.turns:
        with openenv_create_app(turns) as theirs, openenv_create_app(turns, loop="auto") as auto, \
                ours(turns) as url, ours(turns, workers=0) as in_process:
            paths = {"openenv create_app": Path_(over_openenv(theirs, None), port_of(theirs)),
                     "create_app, uvicorn.run's loop": Path_(over_openenv(auto, None), port_of(auto)),
                     "our OpenEnv server (1 worker)": Path_(over_openenv(url, None), port_of(url)),
                     "our OpenEnv server (0 workers)": Path_(over_openenv(in_process, None), port_of(in_process))}
            for c in args.concurrency:
                compare(paths, turns, c, count(turns, c), args.repeats)


if __name__ == "__main__":
    main()
