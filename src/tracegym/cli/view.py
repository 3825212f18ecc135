"""`tracegym view RUN_DIR [--port N] [--host H --allow-remote]`: serve a read-only web page over an eval or RL run
folder (summary, traces, episodes, curves) and print its URL; Ctrl-C stops it.

  --port N          the port to listen on (default 8765; 0 picks a free one)
  --host H          the address to bind (default 127.0.0.1); anything but loopback needs --allow-remote
  --allow-remote    serve on a non-loopback address: anyone who reaches it can read the run's traces (without it,
                    a request whose Host header is not loopback is refused: no DNS rebinding)
"""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from tracegym.core.errors import UsageError
from tracegym.view.app import is_loopback, make_app
from tracegym.view.run_folder_index import RunFolderIndex

DEFAULT_PORT = 8765
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ViewArgs:
    """What `tracegym view` was asked."""

    run_dir: Path
    port: int = DEFAULT_PORT
    host: str = LOOPBACK
    allow_remote: bool = False


def run(args: list[str]) -> int:
    asked = parse(args)
    index = RunFolderIndex.open(asked.run_dir)
    asyncio.run(serve(index, asked))
    return 0


def parse(args: list[str]) -> ViewArgs:
    """The command line; a UsageError naming the flag at fault."""
    usage = "usage: tracegym view RUN_DIR [--port N] [--host H --allow-remote]"
    rest = list(args)
    found: dict[str, str | bool] = {}
    positional = []
    while rest:
        arg = rest.pop(0)
        if arg == "--allow-remote":
            found["allow_remote"] = True
        elif arg in ("--port", "--host"):
            if not rest:
                raise UsageError(f"{arg} needs a value ({usage})")
            found[arg[2:]] = rest.pop(0)
        elif arg.startswith(("--port=", "--host=")):
            name, value = arg[2:].split("=", 1)
            found[name] = value
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg!r} ({usage})")
        else:
            positional.append(arg)
    if len(positional) != 1:
        raise UsageError(usage)
    port = str(found.get("port", DEFAULT_PORT))
    if not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--port {port!r}: a port is a whole number from 0 to 65535")
    host = str(found.get("host", LOOPBACK))
    allow = bool(found.get("allow_remote", False))
    if not is_loopback(host) and not allow:
        raise UsageError(f"--host {host!r} is not a loopback address: anyone who reaches it could read this run's "
                         "traces; add --allow-remote to serve it there anyway")
    return ViewArgs(Path(positional[0]), int(port), host, allow)


async def serve(index: RunFolderIndex, asked: ViewArgs) -> None:
    """Serve the viewer until cancelled, after printing its URL."""
    runner = web.AppRunner(make_app(index, any_host=asked.allow_remote), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, asked.host, asked.port)
        try:
            await site.start()
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"--port {asked.port}: the port is in use; pick another (0 = any free port)") \
                    from None
            raise UsageError(f"--host {asked.host!r} --port {asked.port}: cannot listen there "
                             f"({exc.strerror or exc})") from None
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"tracegym view: {index.path} ({index.kind.value} run) at http://{shown}:{port}/", flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()

