"""The escape battery's nastiest cases as rollouts of python-functions through a real env server (worker
processes, a fake OpenAI endpoint): each ends with a classified error on its trace, nothing it started survives,
and the server goes on serving good rollouts."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from runtime_helpers import wait_until
from sandbox_helpers import runtimes

import tracegym as tg
from tracegym.core.errors import ErrorKind
from tracegym.serve import EnvClient, EnvServer, PoolSize
from tracegym.tasksets.python_functions import PythonFunctions
from tracegym.testing import FakeOpenAIServer

TOKEN = f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(10**6)}"
"""The daemon's `sleep` argument: no other process on the host runs it."""
HOSTILE = {  # the function each task asks for -> what the model answers
    "sum_digits": "import os\nwhile True:\n    os.fork()",
    "reverse_words": "hog = []\nwhile True:\n    hog.append(bytearray(10_000_000))",
    "is_palindrome": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                      f"        os.execve('/bin/sleep', ['sleep', '{TOKEN}'], {{}})\n    os._exit(0)\n"
                      "time.sleep(0.2)\ndef is_palindrome(s):\n    return False"),
    "count_vowels": ("import os, signal\n"
                     "victims = [os.getppid(), -1, *(int(p) for p in os.listdir('/proc') if p.isdigit())]\n"
                     "for pid in victims:\n    if pid != os.getpid():\n        try:\n"
                     "            os.kill(pid, signal.SIGKILL)\n        except OSError:\n            pass\n"
                     "os.kill(os.getpid(), signal.SIGKILL)"),
    "fizzbuzz": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    "gcd": "import math\ndef gcd(a, b):\n    return math.gcd(a, b)",
    "running_sum": "while True:\n    pass",
}
EXPECTED = {  # the function -> the limit or ending its trace error names
    "sum_digits": ("processes", "wall"), "is_palindrome": ("left 1 process",),
    "reverse_words": ("memory", "MemoryError"),  # its allocation refused, then (a loaded machine) past its wall
    "count_vowels": ("signal 9",), "running_sum": ("cpu", "wall"),
    "fizzbuzz": ("wall", "output", "cpu"),  # a writer busy on an idle machine may spend its CPU seconds first
}
OPTIONS = {"num_tasks": len(HOSTILE), "wall_seconds": 3.0, "cpu_seconds": 1, "memory_mb": 256, "processes": 16}


def answer(request: object) -> str:
    prompt = request.messages[-1].text  # type: ignore[attr-defined]
    name = next(n for n in HOSTILE if f"def {n}(" in prompt)
    return f"```python\n{HOSTILE[name]}\n```"


@contextmanager
def env_server(options: dict) -> Iterator[EnvServer]:
    server = EnvServer("python-functions", options, size=PoolSize(min=2))
    server.bind()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    assert wait_until(lambda: server.pool.counts()["ready"] >= 2, 30), "workers did not start"
    try:
        yield server
    finally:
        server.stop()
        thread.join(15)


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp folder of this test's own for the server's workers (TMPDIR), so the sandboxes counted are theirs,
    not those of other processes on the host; it must let a sandbox's uid through (0711) to its workdir."""
    folder = Path(tempfile.mkdtemp(prefix="tracegym-escape-rollouts-"))
    folder.chmod(0o711)
    monkeypatch.setenv("TMPDIR", str(folder))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("runtime", runtimes())
async def test_escape_rollouts_through_an_env_server_are_contained(runtime: object, private_tmp: Path) -> None:
    name = runtime.name  # type: ignore[attr-defined]
    if getattr(runtime, "isolation", None) == "process-group":
        pytest.skip("the battery's rollouts run under the runtimes a taskset would use (the fallback is covered "
                    "by test_escape_battery)")
    options = {**OPTIONS, "runtime": name}
    with FakeOpenAIServer(rule=answer) as fake, env_server(options) as server:
        endpoint = tg.Endpoint(base_url=fake.base_url, model="fake-model", api_key_env=None, max_retries=0)
        taskset = PythonFunctions(options)
        # the server thread shares this process (and its GIL) with the client and the fake endpoint: on a loaded
        # machine its answers may lag by seconds, which is not what this test is about (the fork bomb itself ends
        # at its processes limit within a second and does not starve the host: see test_escape_fork_bomb)
        async with EnvClient(server.bound, liveness_timeout=60.0) as client:
            start = time.monotonic()
            traces = [t async for t in client.evaluate_iter(taskset, endpoint, num_tasks=len(HOSTILE), rollouts=1)]
            elapsed = time.monotonic() - start
            good = next(row for row in taskset if row.function == "gcd")
            [again] = [t async for t in client.evaluate_iter(taskset, endpoint, pairs=[(good, 1)])]
        workers_alive = all(h.proc.poll() is None for h in server.pool.workers.values())
    by_function = {t.task.function: t for t in traces}
    assert sorted(by_function) == sorted(HOSTILE)
    for function, signs in EXPECTED.items():
        trace = by_function[function]
        assert [(e.kind, e.stage) for e in trace.errors] == [(ErrorKind.MODEL, "env_response")], trace.errors
        assert any(sign in trace.errors[0].message for sign in signs), (function, trace.errors[0].message)
        assert trace.reward < 1.0 and trace.failure is None, function  # scored, trained on: the model's doing
    assert by_function["gcd"].reward == 1.0 and by_function["gcd"].errors == []
    assert again.reward == 1.0, "the server stopped serving good rollouts"
    assert workers_alive, "a hostile rollout took a worker down"
    assert wait_until(lambda: not _running(TOKEN), 5), "the setsid daemon survived its rollout"
    left = sorted(p.name for p in private_tmp.glob("tracegym-sandbox-*"))
    assert left == [], f"a sandbox's working directory was left behind: {left}"
    assert elapsed < 30


def _running(token: str) -> bool:
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False
