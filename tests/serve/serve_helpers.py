"""Helpers for env-server tests: servers run in a thread, the echo reply rule, live-process checks."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from tracegym import TaskData
from tracegym.serve import EnvServer, PoolSize
from tracegym.testing import Stall
from tracegym.testing.echo import SPEC


def reply_with_word(request: Any) -> Any:
    """The fake model repeats the word the first user message asks for; `sleep-S` makes it stall S seconds."""
    word = request.messages[0].text.removeprefix("Say ").removesuffix(".")
    if word.startswith("sleep-"):
        return Stall(float(word.removeprefix("sleep-")), then=f"{word} (echo)")
    return f"{word} (echo)"


def task(word: str = "hello") -> TaskData:
    """A task of the echo taskset asking for `word` (`sleep-S`: the fake model stalls S seconds)."""
    return TaskData(id=word, prompt=f"Say {word}.", answer=word)


def alive(pid: int) -> bool:
    """True while `pid` is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@contextlib.contextmanager
def running_server(options: dict | None = None, spec: str = SPEC, ready_s: float = 30.0,
                   **kwargs: Any) -> Iterator[EnvServer]:
    """An EnvServer for the echo taskset (or `spec`'s) serving in a thread, its workers ready (within `ready_s`
    seconds); stopped (and checked) on exit."""
    kwargs.setdefault("size", PoolSize(min=1))
    server = EnvServer(spec, options or {}, **kwargs)
    server.bind()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    assert wait_for(lambda: server.pool.counts()["ready"] >= server.size.min, ready_s), "workers did not start"
    try:
        yield server
    finally:
        pids = [h.proc.pid for h in list(server.pool.workers.values())]
        server.stop()
        thread.join(15)
        assert not thread.is_alive()
        assert not [p for p in pids if alive(p)], "worker processes outlived the server"


def worker_pids(server: EnvServer) -> list[int]:
    """The pids of the workers that serve (ready, spares apart)."""
    return [h.proc.pid for h in server.pool.workers.values() if h.ready and not h.spare]


def wait_ready(server: EnvServer, count: int, timeout: float = 30.0) -> bool:
    return wait_for(lambda: server.pool.counts()["ready"] == count, timeout)
