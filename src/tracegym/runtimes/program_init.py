"""Program init: the first process of a sandbox; it limits, un-privileges and runs one program, and says how it ended.

A sandbox runs `python -I -S -c <this file's source> STATUS_FD LIFELINE_FD UID CWD FORWARD LIMIT... -- PROGRAM...`
(UID `-` for none; FORWARD `PORT:SOCKET` or `-`; LIMITs in the order of LIMITS), wrapped in the runtime's
namespaces. C modules only (builtin ones, plus `_socket` and `fcntl` when forwarding), no json and no tracegym
import: it starts in the time of a bare interpreter, and any Python 3 the sandbox can execute runs it. It forks
the program; in the child it resets the signals Python ignores, applies the rlimits, drops to UID (when it is
root and given one: every sandbox gets a host uid of its own, so RLIMIT_NPROC counts only its processes and it can
signal nothing of the host's), changes to CWD and execs. The parent reaps every child it is given (as a PID
namespace's init it inherits orphans) until the program ends, then writes one line to STATUS_FD,
`EXIT_CODE SIGNAL CPU_SECONDS LEFT_RUNNING` (`-` for none), and a second with why the program could not start, if
it could not; and exits: as a namespace's init, its exit kills whatever the program left behind. When the host
closes the other end of LIFELINE_FD (the host process died, even by SIGKILL), it kills its process group and exits.

With FORWARD, before the program starts, the init brings the network namespace's loopback up and serves
127.0.0.1:PORT from threads of its own, carrying each connection to the host's Unix socket SOCKET: the one way out
of a sandbox without network (the interception proxy's). The listening socket is close-on-exec: the program never
holds it.

With `-X tracegym-view=SPEC` (the subprocess runtime's namespace modes), before the program starts, the init builds
the sandbox's view (see `runtimes.sandbox_view`; SPEC as `encode_view` writes it): in its own mount namespace it
mounts a tmpfs on ROOT, makes each mount of the view under it (every mountpoint made one component at a time,
never through a link, then mounted through its descriptor), pivots into it and detaches the host's root. When
the program keeps the init's uid (a user namespace's root), it then drops every capability for good (bounding
set, ambient, securebits), so the program cannot undo a mount. Only then does it load `_ctypes` (not `ctypes`,
which costs several times more).
"""

import _signal as signal  # the C module: `signal` imports enum, which doubles our start-up
import _thread
import os
import resource
import sys

VIEW_OPTION = "tracegym-view"
"""The interpreter's -X option that carries the view to build (absent: the init builds none)."""
_FIELD, _RECORD = "\x1f", "\x1e"
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
    limits = [int(v) for v in sys.argv[6:6 + len(LIMITS)]]
    argv = sys.argv[7 + len(LIMITS):]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a namespace's pid 1, a program's SIGINT must not end us
    os.set_inheritable(status_fd, False)
    os.set_inheritable(lifeline_fd, False)
    _thread.start_new_thread(watch_lifeline, (lifeline_fd,))
    if forward != "-":
        port, socket_path = forward.split(":", 1)
        try:
            serve_forward(int(port), socket_path)
        except OSError as exc:
            os.write(status_fd, f"- - 0 -\ncould not forward 127.0.0.1:{port} to {socket_path}: {exc}\n".encode())
            os._exit(1)
    view = sys._xoptions.get(VIEW_OPTION)
    if view is not None:
        try:
            build_view(view, drop_capabilities=uid == "-")
        except OSError as exc:
            os.write(status_fd, f"- - 0 -\ncould not build the sandbox's view: {exc}\n".encode())
            os._exit(1)
    exec_errors, exec_error_w = os.pipe()  # close-on-exec: EOF with no bytes means the exec succeeded
    pid = os.fork()
    if pid == 0:
        os.close(exec_errors)
        start(argv, cwd, None if uid == "-" else int(uid), limits, exec_error_w)
    os.close(exec_error_w)
    start_error = read_all(exec_errors).decode(errors="replace").replace("\n", " ")
    exit_code, sig, cpu = wait_for(pid)
    left = left_running() if os.getpid() == 1 else None
    line = " ".join("-" if v is None else str(v) for v in (exit_code, sig, cpu, left))
    os.write(status_fd, f"{line}\n{start_error}\n".encode())
    os._exit(0)


def start(argv: list, cwd: str, uid: int | None, limits: list, exec_error_w: int) -> None:
    """In the forked child: limits, credentials, working directory, then exec the program (never returns)."""
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        for (which, unit), value in zip(LIMITS, limits, strict=False):
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


def encode_view(root: str, mounts: list) -> str:
    """The -X value that asks the init to build, on folder `root`, the view made of `mounts` ((kind, target,
    source) each: see `runtimes.sandbox_view.Mount`). ValueError for a path holding a separator."""
    fields = [root, *(field for mount in mounts for field in mount)]
    if any(_FIELD in field or _RECORD in field for field in fields):
        raise ValueError(f"a path of the sandbox's view holds a control character: {fields!r}")
    return _RECORD.join([root, *(_FIELD.join(mount) for mount in mounts)])


class _Libc:
    """The libc calls building a view needs, through `_ctypes` (errno kept, as `ctypes.CDLL(use_errno=True)`)."""

    def __init__(self) -> None:
        import _ctypes

        class Int(_ctypes._SimpleCData):
            _type_ = "i"

        class Function(_ctypes.CFuncPtr):
            _flags_ = 1 | 8  # FUNCFLAG_CDECL | FUNCFLAG_USE_ERRNO
            _restype_ = Int

        self._handle = _ctypes.dlopen(None, 2)  # type: ignore[arg-type]  # None: the process's own symbols (libc)
        self.long = type("Long", (_ctypes._SimpleCData,), {"_type_": "l"})
        self._errno = _ctypes.get_errno
        for name in ("mount", "umount2", "pivot_root", "prctl", "capset"):
            setattr(self, "_" + name, Function((name, self)))  # type: ignore[arg-type]  # any object with _handle

    def call(self, name: str, *args, what: str = "") -> None:
        """Call libc `name`; OSError (naming `what`) when it fails."""
        if getattr(self, "_" + name)(*args) != 0:
            errno = self._errno()
            raise OSError(errno, f"{name} {what}: {os.strerror(errno)}".strip())


_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 0x1, 0x2, 0x4, 0x20, 0x1000, 0x4000
_ST_TO_MS = ((0x1, 0x1), (0x2, 0x2), (0x4, 0x4), (0x8, 0x8), (0x400, 0x400), (0x800, 0x800), (0x1000, 0x200000))
"""statvfs flags -> the mount flags a read-only remount must keep (a user namespace may not clear them)."""
_O_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def build_view(spec: str, drop_capabilities: bool) -> None:
    """Build the view `spec` describes (see `encode_view`), pivot into it; drop every capability when asked."""
    libc = _Libc()
    root, *records = spec.split(_RECORD)
    libc.call("mount", b"tracegym-view", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755",
              what=root)
    read_only = []
    for record in records:
        kind, target, source = record.split(_FIELD)
        folder = kind in ("empty", "proc") or (kind in ("ro", "rw") and os.path.isdir(source))
        if kind == "symlink":
            parent, name = target.rsplit("/", 1)
            fd = mountpoint(root, parent, folder=True)
            try:
                os.symlink(source, name, dir_fd=fd)
            finally:
                os.close(fd)
            continue
        fd = mountpoint(root, target, folder)
        try:
            at = f"/proc/self/fd/{fd}".encode()
            if kind == "empty":
                libc.call("mount", b"tracegym-empty", at, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=64k,mode=0755",
                          what=target)
            else:
                libc.call("mount", (source or "/proc").encode(), at, None, _MS_BIND | (_MS_REC if folder else 0), None,
                          what=f"{source or '/proc'} on {target}")
        finally:
            os.close(fd)
        if kind in ("ro", "empty"):
            read_only.append((target, folder))
    for target, folder in read_only:
        remount_read_only(libc, root, target, folder)
    old = root + "/.old"
    os.mkdir(old, 0o700)
    libc.call("pivot_root", root.encode(), old.encode(), what=root)
    os.chdir("/")
    libc.call("umount2", b"/.old", 2, what="the host's root")  # MNT_DETACH
    os.rmdir("/.old")
    remount_read_only(libc, "", "/")
    if drop_capabilities:
        drop_all_capabilities(libc)


def mountpoint(root: str, target: str, folder: bool) -> int:
    """An O_PATH descriptor of `root` + `target`, each missing component made (a folder, or an empty file last
    unless `folder`); OSError where a component is a link (a program may have left one in its /tmp)."""
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    parts = [part for part in target.split("/") if part]
    try:
        for index, part in enumerate(parts):
            directory = folder or index < len(parts) - 1
            try:
                inner = os.open(part, _O_PATH, dir_fd=fd)
            except FileNotFoundError:
                if directory:
                    os.mkdir(part, 0o755, dir_fd=fd)
                else:
                    os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=fd))
                inner = os.open(part, _O_PATH, dir_fd=fd)
            os.close(fd)
            fd = inner
            mode = os.fstat(fd).st_mode
            if (mode & 0o170000 == 0o040000) != directory or mode & 0o170000 == 0o120000:
                raise OSError(20, "a link or another kind of file is in the way")  # ENOTDIR
    except OSError as exc:
        os.close(fd)
        raise OSError(exc.errno, f"cannot make the mountpoint {target}: {exc.strerror}") from None
    return fd


def remount_read_only(libc, root: str, target: str, folder: bool = True) -> None:  # a _Libc
    """Make the mount at `root` + `target` read-only, nosuid and nodev, keeping the flags it must keep."""
    fd = mountpoint(root, target, folder) if target != "/" else os.open("/", _O_PATH | os.O_DIRECTORY)
    try:
        at = f"/proc/self/fd/{fd}"
        kept = os.statvfs(at).f_flag
        flags = sum(ms for st, ms in _ST_TO_MS if kept & st)
        libc.call("mount", None, at.encode(), None,
                  _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | flags, None, what=target)
    finally:
        os.close(fd)


def drop_all_capabilities(libc) -> None:  # a _Libc
    """Lose every capability for good: securebits locked (uid 0 gains none at exec), the bounding and ambient
    sets emptied, then the effective, permitted and inheritable sets."""
    long = libc.long
    libc.call("prctl", long(28), long(0xEF), long(0), long(0), long(0), what="PR_SET_SECUREBITS")
    with open("/proc/sys/kernel/cap_last_cap") as file:
        last = int(file.read())
    for cap in range(last + 1):
        libc.call("prctl", long(24), long(cap), long(0), long(0), long(0), what="PR_CAPBSET_DROP")
    libc.call("prctl", long(47), long(4), long(0), long(0), long(0), what="PR_CAP_AMBIENT_CLEAR_ALL")
    header = (0x20080522).to_bytes(4, sys.byteorder) + bytes(4)  # _LINUX_CAPABILITY_VERSION_3, this process
    libc.call("capset", header, bytes(24), what="(no capabilities)")


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
