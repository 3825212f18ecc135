"""Program init: the first process of a sandbox; it limits, un-privileges and runs one program, and says how it ended.

A sandbox runs `python -I -S -c <this file's source> SPEC` (SPEC: JSON of what is below), wrapped in the runtime's
namespaces. Standard library only and no tracegym import, so any Python 3 the sandbox can execute runs it.
It forks the program; in the child it resets the signals Python ignores, applies the rlimits, drops to `uid`
(when it is root and given one: every sandbox gets a host uid of its own, so RLIMIT_NPROC counts only its
processes and it can signal nothing of the host's), changes to the working directory and execs. The parent
reaps every child it is given (as a PID namespace's init it inherits orphans) until the program ends, writes one
JSON line to `status_fd` (exit code or signal, CPU seconds, or why the program could not start) and exits;
as a namespace's init, its exit kills whatever the program left behind. When the host closes the other end of
`lifeline_fd` (the host process died, even by SIGKILL), it kills its process group and exits.
"""

import json
import os
import resource
import signal
import sys
import threading

LIMITS = {
    "cpu_seconds": (resource.RLIMIT_CPU, 1),
    "memory_mb": (resource.RLIMIT_AS, 1 << 20),
    "file_size_mb": (resource.RLIMIT_FSIZE, 1 << 20),
    "open_files": (resource.RLIMIT_NOFILE, 1),
    "processes": (resource.RLIMIT_NPROC, 1),
}
"""Each limit's rlimit and the unit its value is multiplied by."""


def main() -> None:
    spec = json.loads(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a namespace's pid 1, a program's SIGINT must not end us
    status_fd, lifeline_fd = spec["status_fd"], spec["lifeline_fd"]
    os.set_inheritable(status_fd, False)
    os.set_inheritable(lifeline_fd, False)
    threading.Thread(target=watch_lifeline, args=(lifeline_fd,), daemon=True).start()
    exec_errors, exec_error_w = os.pipe()  # close-on-exec: EOF with no bytes means the exec succeeded
    pid = os.fork()
    if pid == 0:
        os.close(exec_errors)
        start(spec, exec_error_w)
    os.close(exec_error_w)
    start_error = read_all(exec_errors).decode(errors="replace") or None
    report = wait_for(pid)
    report["start_error"] = start_error
    report["left_running"] = left_running() if os.getpid() == 1 else None
    os.write(status_fd, (json.dumps(report) + "\n").encode())
    os._exit(0)


def start(spec: dict, exec_error_w: int) -> None:
    """In the forked child: limits, credentials, working directory, then exec the program (never returns)."""
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        for name, value in spec["rlimits"].items():
            which, unit = LIMITS[name]
            # soft below hard for CPU: SIGXCPU first (a program may report it), SIGKILL a second later
            hard = value * unit + (1 if name == "cpu_seconds" else 0)
            resource.setrlimit(which, (value * unit, hard))
        uid = spec.get("uid")
        if uid is not None and os.getuid() == 0:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        os.chdir(spec["cwd"])
        argv = spec["argv"]
        os.execvpe(argv[0], argv, os.environ)
    except FileNotFoundError:
        os.write(exec_error_w, f"no such program: {spec['argv'][0]!r} (PATH {os.environ.get('PATH')})".encode())
    except BaseException as exc:
        os.write(exec_error_w, f"{type(exc).__name__}: {exc}".encode())
    os._exit(127)


def wait_for(pid: int) -> dict:
    """Reap children (orphans too) until `pid` ends; how it ended and the CPU it used."""
    while True:
        try:
            done, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return {"exit_code": None, "signal": None, "cpu_s": 0.0}
        except InterruptedError:
            continue
        if done == pid:
            return {
                "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "cpu_s": usage.ru_utime + usage.ru_stime,
            }


def left_running() -> int:
    """As a PID namespace's init: how many processes besides us are still alive (the program's leftovers, which
    our exit kills)."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1":
            try:
                with open(f"/proc/{name}/stat") as stat:
                    count += stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
            except (OSError, IndexError):
                continue
    return count


def read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def watch_lifeline(fd: int) -> None:
    """Block until the host's end of the lifeline closes, then take the program down with us."""
    while os.read(fd, 1):
        pass
    try:
        os.killpg(0, signal.SIGKILL)  # outside a PID namespace this ends us too; inside, init survives it
    finally:
        os._exit(1)


if __name__ == "__main__":
    main()
