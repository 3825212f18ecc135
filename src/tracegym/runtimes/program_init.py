"""Program init: the first process of a sandbox; it limits, un-privileges and runs one program, and says how it ended.

A sandbox runs `python -I -S -c <this file's source> STATUS_FD LIFELINE_FD UID CWD FORWARD CGROUP_FDS LIMIT... --
PROGRAM...` (UID `-` for none; FORWARD `PORT:SOCKET` or `-`; CGROUP_FDS comma-separated or `-`; LIMITs in the order
of LIMITS, 0 for none), wrapped in the runtime's namespaces. C modules only (builtin ones, plus `_socket` and
`fcntl` when forwarding), no json and no tracegym import: it starts in the time of a bare interpreter, and any
Python 3 the sandbox can execute runs it. It forks the program; in the child it enters the sandbox's cgroup
(writing itself to each of CGROUP_FDS, descriptors of its entry files the host opened: see `runtimes.cgroup`),
resets the signals Python ignores, applies the rlimits, drops to UID (when it is root and given one: every sandbox
gets a host uid of its own, so RLIMIT_NPROC counts only its processes and it can signal nothing of the host's),
changes to CWD and execs. The parent reaps every child it is given (as a PID namespace's init it inherits orphans)
until the program ends, then writes one line to STATUS_FD, `EXIT_CODE SIGNAL CPU_SECONDS LEFT_RUNNING` (`-` for
none), and a second with why the program could not start, if it could not; and exits: as a namespace's init, its
exit kills whatever the program left behind; outside a PID namespace (the process-group fallback) it kills its
process group, itself last, while it still leads it (so the group id cannot have been reused). When the host
closes the other end of LIFELINE_FD (the host process died, even by SIGKILL), it kills its process group and exits.

With FORWARD, before the program starts, the init brings the network namespace's loopback up and serves
127.0.0.1:PORT from threads of its own, carrying each connection to the host's Unix socket SOCKET: the one way out
of a sandbox without network (the interception proxy's). The listening socket is close-on-exec: the program never
holds it.
"""

import _signal as signal  # the C module: `signal` imports enum, which doubles our start-up
import _thread
import os
import resource
import sys

LIMITS = (
    (resource.RLIMIT_CPU, 1),
    (resource.RLIMIT_AS, 1 << 20),
    (resource.RLIMIT_FSIZE, 1 << 20),
    (resource.RLIMIT_NOFILE, 1),
    (resource.RLIMIT_NPROC, 1),
)
"""The rlimits given on the command line, in order (CPU seconds, address space MB, file size MB, open files,
processes), and the unit each value is multiplied by."""


def main() -> None:
    status_fd, lifeline_fd, uid, cwd, forward = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], \
        sys.argv[5]
    cgroups = [] if sys.argv[6] == "-" else [int(fd) for fd in sys.argv[6].split(",")]
    limits = [int(v) for v in sys.argv[7:7 + len(LIMITS)]]
    argv = sys.argv[8 + len(LIMITS):]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a namespace's pid 1, a program's SIGINT must not end us
    os.set_inheritable(status_fd, False)
    os.set_inheritable(lifeline_fd, False)
    for fd in cgroups:
        os.set_inheritable(fd, False)
    _thread.start_new_thread(watch_lifeline, (lifeline_fd,))
    if forward != "-":
        port, socket_path = forward.split(":", 1)
        try:
            serve_forward(int(port), socket_path)
        except OSError as exc:
            os.write(status_fd, f"- - 0 -\ncould not forward 127.0.0.1:{port} to {socket_path}: {exc}\n".encode())
            os._exit(1)
    exec_errors, exec_error_w = os.pipe()  # close-on-exec: EOF with no bytes means the exec succeeded
    pid = os.fork()
    if pid == 0:
        os.close(exec_errors)
        start(argv, cwd, None if uid == "-" else int(uid), limits, cgroups, exec_error_w)
    os.close(exec_error_w)
    for fd in cgroups:
        os.close(fd)
    start_error = read_all(exec_errors).decode(errors="replace").replace("\n", " ")
    exit_code, sig, cpu = wait_for(pid)
    as_init = os.getpid() == 1
    left = left_running(as_init)
    line = " ".join("-" if v is None else str(v) for v in (exit_code, sig, cpu, left))
    os.write(status_fd, f"{line}\n{start_error}\n".encode())
    if not as_init and os.getpgrp() == os.getpid():  # no namespace ends what the program left: we end our group
        os.killpg(0, signal.SIGKILL)
    os._exit(0)


def start(argv: list, cwd: str, uid: int | None, limits: list, cgroups: list, exec_error_w: int) -> None:
    """In the forked child: the cgroup, limits, credentials, working directory, then exec the program (never
    returns)."""
    try:
        for fd in cgroups:
            try:
                os.write(fd, b"0")
            except OSError as exc:
                raise OSError(f"could not enter the sandbox's cgroup: {exc}") from None
            os.close(fd)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        for (which, unit), value in zip(LIMITS, limits, strict=False):
            if not value:
                continue  # none (the address space where a cgroup caps memory)
            # soft below hard for CPU: SIGXCPU first (a program may report it), SIGKILL a second later
            hard = value * unit + (1 if which == resource.RLIMIT_CPU else 0)
            resource.setrlimit(which, (value * unit, hard))
        if uid is not None and os.getuid() == 0:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        os.chdir(cwd)
        os.execvpe(argv[0], argv, os.environ)
    except FileNotFoundError:
        os.write(exec_error_w, f"no such program: {argv[0]!r} (PATH {os.environ.get('PATH')})".encode())
    except BaseException as exc:
        os.write(exec_error_w, f"{type(exc).__name__}: {exc}".encode())
    os._exit(127)


def wait_for(pid: int) -> tuple:
    """Reap children (orphans too) until `pid` ends: its exit code, signal and CPU seconds."""
    while True:
        try:
            done, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return None, None, 0.0
        except InterruptedError:
            continue
        if done == pid:
            return (os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                    os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                    round(usage.ru_utime + usage.ru_stime, 3))


def left_running(as_init: bool) -> int:
    """How many of the program's processes are still alive: as a PID namespace's init, every process besides us
    (our exit kills them); else the other live members of our process group (we kill them)."""
    me, group, count = str(os.getpid()), str(os.getpgrp()), 0
    for name in os.listdir("/proc"):
        if name.isdigit() and name != me:
            try:
                with open(f"/proc/{name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            count += fields[0] not in ("Z", "X") and (as_init or fields[2] == group)
    return count


def read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def serve_forward(port: int, socket_path: str) -> None:
    """Listen on 127.0.0.1:`port` (the loopback brought up first) and carry each connection to `socket_path`,
    from threads of ours. OSError when it cannot (the program is then not started)."""
    import _socket  # only a forwarding sandbox pays for it

    loopback_up(_socket)
    server = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    server.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(128)
    _thread.start_new_thread(accept_forever, (_socket, server, socket_path))


def loopback_up(sockets) -> None:  # the `_socket` module (imported only here and in serve_forward)
    """Bring `lo` up when it is down (a new network namespace's is; bubblewrap's is already up)."""
    import fcntl

    get_flags, set_flags, up = 0x8913, 0x8914, 0x1  # SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP
    probe = sockets.socket(sockets.AF_INET, sockets.SOCK_DGRAM)
    try:
        request = b"lo".ljust(40, b"\0")  # struct ifreq: the name, then the flags
        flags = int.from_bytes(fcntl.ioctl(probe.fileno(), get_flags, request)[16:18], sys.byteorder)
        if not flags & up:
            raised = request[:16] + (flags | up).to_bytes(2, sys.byteorder) + request[18:]
            fcntl.ioctl(probe.fileno(), set_flags, raised)
    finally:
        probe.close()


def accept_forever(sockets, server, socket_path: str) -> None:
    """Each connection to `server`, carried both ways to the Unix socket at `socket_path`."""
    while True:
        fd, _ = server._accept()  # the C socket's accept: a descriptor (close-on-exec)
        client = sockets.socket(sockets.AF_INET, sockets.SOCK_STREAM, 0, fd)
        client.setsockopt(sockets.IPPROTO_TCP, sockets.TCP_NODELAY, 1)
        upstream = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
        try:
            upstream.connect(socket_path)
        except OSError:  # the service is gone: the program sees its connection closed, as with it down
            client.close()
            upstream.close()
            continue
        _thread.start_new_thread(pump, (client, upstream))
        _thread.start_new_thread(pump, (upstream, client))


def pump(source, sink) -> None:
    """Copy `source` to `sink` until its end, then pass the end on (each direction ends on its own; a socket is
    closed when both threads have let it go)."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(1)  # SHUT_WR
    except OSError:
        pass


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
