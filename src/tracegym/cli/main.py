"""The `tracegym` command: dispatches to one module per subcommand and turns tracegym errors into one line."""

from __future__ import annotations

import errno
import importlib
import sys
from collections.abc import Sequence

from tracegym.core.errors import TracegymError, UsageError
from tracegym.runtimes.watchdog import STALLED_EXIT, Stalled

COMMANDS: dict[str, tuple[str, str]] = {
    "eval": ("tracegym.cli.eval", "evaluate a model on a taskset into a run folder (or --resume one)"),
    "show": ("tracegym.cli.show", "print a run folder's summary and a few traces"),
    "rescore": ("tracegym.cli.rescore", "recompute rewards of a run's stored traces with the current code"),
    "list": ("tracegym.cli.list", "list known tasksets"),
    "validate": ("tracegym.cli.validate", "check a taskset: each task's gold reply passes, an empty reply is not paid"),
    "rl": ("tracegym.cli.rl", "train a model with RL: vLLM, env servers, orchestrator and trainer"),
    "plot": ("tracegym.cli.plot", "write PNG curves of an RL run (reward, eval reward, lengths, staleness)"),
    "inference": ("tracegym.cli.inference", "serve a model with vLLM in the foreground and print its endpoint"),
    "serve": ("tracegym.cli.serve", "serve a taskset to env clients (ZMQ) and print the bound address"),
    "view": ("tracegym.cli.view", "browse a run folder's traces, episodes and curves in a local web page"),
    "image": ("tracegym.cli.image", "build the container runtime's sandbox image from Debian packages (never pulled)"),
}
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
"""The errors of a full disk (or a spent quota): one line, not a traceback."""
OWN_HELP = {"eval", "rl", "inference", "serve", "validate"}
"""Commands whose config parser answers `--help` with every option; the others print their module docstring."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit code (0 ok, 1 failed, 2 bad usage, 5 stopped by the watchdog)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"tracegym: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    if name not in OWN_HELP and ("-h" in rest or "--help" in rest):
        print(f"{module.__doc__}".strip())
        return 0
    try:
        return int(module.run(rest) or 0)
    except UsageError as exc:
        print(f"tracegym {name}: {exc}", file=sys.stderr)
        return 2
    except Stalled as exc:
        print(f"tracegym {name}: stopped: {exc}", file=sys.stderr)
        return STALLED_EXIT
    except TracegymError as exc:
        print(f"tracegym {name}: {exc.kind.value} error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tracegym {name}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"tracegym {name}: the disk is full{where} ({exc.strerror}); what was written is kept: free some "
              "space, then --resume the run", file=sys.stderr)
        return 1


def usage() -> str:
    """The command list."""
    width = max(len(n) for n in COMMANDS)
    lines = [f"  {n.ljust(width)}  {help_}" for n, (_, help_) in COMMANDS.items()]
    return "usage: tracegym COMMAND [OPTIONS]   (tracegym COMMAND --help for its options)\n\n" + "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
