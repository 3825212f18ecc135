"""Program init: the first process of a sandbox; it limits, un-privileges and runs one program, and says how it ended.

A sandbox runs `python -I -S -c <this file's source> STATUS_FD LIFELINE_FD UID CWD NETWORK CGROUP_FDS LIMIT... --
PROGRAM...` (UID `-` for none; NETWORK `-` or lines, below; CGROUP_FDS comma-separated or `-`; LIMITs in the order
of LIMITS, 0 for none), wrapped in the runtime's namespaces; on the host, in place of the source, its code as that
interpreter compiled it, marshalled (`process_sandbox.init_code`: no compile per run). C modules only (`posix`, not
`os`; builtin ones and `resource`, plus `_socket` and `fcntl` when forwarding, `_ctypes` when a hosts file or a
user namespace is asked for), no json and no tracegym import: it starts in the time of a bare interpreter, and any
Python 3 the sandbox can execute runs it. It forks the
program; in the child it enters the sandbox's cgroup (writing itself to each of CGROUP_FDS, descriptors of its entry
files the host opened: see `runtimes.cgroup`), resets the signals Python ignores, applies the rlimits, drops to UID
(when it is root and given one: every sandbox gets a host uid of its own, so RLIMIT_NPROC counts only its processes
and it can signal nothing of the host's), changes to CWD and execs. The parent reaps every child it is given (as a
PID namespace's init it inherits orphans) until the program ends, then writes to STATUS_FD one line
`EXIT_CODE SIGNAL CPU_SECONDS LEFT_RUNNING` (`-` for none), a second with why the program could not start, if it
could not, and a third, in a network namespace of the run's own, `REFUSED CONNECTIONS...` (what the namespace
refused, then the connections accepted on each `egress` line, in order); and exits: as a namespace's init, its exit
kills whatever the program left behind; outside a PID namespace (the process-group fallback) it kills its process
group, itself last, while it still leads it (so the group id cannot have been reused). When the host closes the
other end of LIFELINE_FD (the host process died, even by SIGKILL), it kills its process group and exits.
STATUS_FD and LIFELINE_FD may be paths instead (a container's, bound in from the host): a file to write the report
to, and a FIFO the host holds open; so may each of CGROUP_FDS (a rootless container's cgroup entry files, bound in).

NETWORK is `-` when the run shares the host's network. Otherwise the run has a network namespace of its own and
NETWORK is `own` then one line per thing to set up in it before the program starts:
- `forward ADDRESS PORT SOCKET`: listen on ADDRESS:PORT (the loopback brought up, and ADDRESS added to it unless
  it is a loopback address) from threads of our own, carrying each connection to the host's Unix socket SOCKET:
  the interception proxy's, on 127.0.0.1. The listening sockets are close-on-exec: the program never holds them.
- `egress ADDRESS PORT SOCKET`: the same for an allowed destination of an egress allow-list, at its own address
  (see `runtimes.egress`), its connections counted.
- `hosts PATH`: bind PATH over /etc/hosts (in the run's own mount namespace: the allow-list's hostnames).
- `userns UID GID`: the program enters a user namespace of its own as UID:GID, mapped onto ours (0): under
  bubblewrap the init alone holds the capability to add addresses (CAP_NET_ADMIN of the namespace's owner), and
  the program, one user namespace further down, holds none over it.

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
import posix  # the C module: `os` (a Python module over it) costs a millisecond of imports
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
STATUS_FILE = posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC | posix.O_NOFOLLOW
"""How a STATUS given as a path is opened."""


def main() -> None:
    status_fd, lifeline_fd = channel(sys.argv[1], STATUS_FILE), channel(sys.argv[2], posix.O_RDONLY)
    uid, cwd, network = sys.argv[3], sys.argv[4], sys.argv[5]
    cgroups = [] if sys.argv[6] == "-" else [channel(entry, posix.O_WRONLY) for entry in sys.argv[6].split(",")]
    limits = [int(v) for v in sys.argv[7:7 + len(LIMITS)]]
    argv = sys.argv[8 + len(LIMITS):]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a namespace's pid 1, a program's SIGINT must not end us
    posix.set_inheritable(status_fd, False)
    posix.set_inheritable(lifeline_fd, False)
    for fd in cgroups:
        posix.set_inheritable(fd, False)
    _thread.start_new_thread(watch_lifeline, (lifeline_fd,))
    counts, userns = [], None
    if network != "-":
        try:
            counts, userns = set_up_network(network.split("\n")[1:])
        except OSError as exc:
            posix.write(status_fd, f"- - 0 -\n{exc}\n".encode())
            posix._exit(1)
    view = sys._xoptions.get(VIEW_OPTION)
    if view is not None:
        try:
            build_view(view, drop_capabilities=uid == "-")
        except OSError as exc:
            posix.write(status_fd, f"- - 0 -\ncould not build the sandbox's view: {exc}\n".encode())
            posix._exit(1)
    exec_errors, exec_error_w = posix.pipe()  # close-on-exec: EOF with no bytes means the exec succeeded
    pid = posix.fork()
    if pid == 0:
        posix.close(exec_errors)
        start(argv, cwd, None if uid == "-" else int(uid), limits, cgroups, exec_error_w, userns)
    posix.close(exec_error_w)
    for fd in cgroups:
        posix.close(fd)
    start_error = read_all(exec_errors).decode(errors="replace").replace("\n", " ")
    exit_code, sig, cpu = wait_for(pid)
    as_init = posix.getpid() == 1
    left = left_running(as_init)
    line = " ".join("-" if v is None else str(v) for v in (exit_code, sig, cpu, left))
    used = "" if network == "-" else " ".join(str(v) for v in (refused_connections(), *(c[0] for c in counts)))
    posix.write(status_fd, f"{line}\n{start_error}\n{used}\n".encode())
    if not as_init and posix.getpgrp() == posix.getpid():  # no namespace ends what the program left: we end our group
        posix.killpg(0, signal.SIGKILL)
    posix._exit(0)


def channel(given: str, flags: int) -> int:
    """STATUS_FD or LIFELINE_FD: a descriptor we inherited, or a path to open (a container's: the engine passes no
    descriptor on; the lifeline is then a FIFO, whose writer gone reads as EOF, even before we open it)."""
    if given.isdigit():
        return int(given)
    fd = posix.open(given, flags | posix.O_NONBLOCK, 0o600)  # a FIFO's read end opens without waiting for a writer
    posix.set_blocking(fd, True)
    return fd


def start(argv: list, cwd: str, uid: int | None, limits: list, cgroups: list, exec_error_w: int,
          userns: tuple | None) -> None:
    """In the forked child: the cgroup, limits, credentials, working directory, then exec the program (never
    returns)."""
    try:
        for fd in cgroups:
            try:
                posix.write(fd, b"0")
            except OSError as exc:
                raise OSError(f"could not enter the sandbox's cgroup: {exc}") from None
            posix.close(fd)
        if userns is not None:
            enter_user_namespace(*userns)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        for (which, unit), value in zip(LIMITS, limits, strict=False):
            if not value:
                continue  # none (the address space where a cgroup caps memory)
            # soft below hard for CPU: SIGXCPU first (a program may report it), SIGKILL a second later
            hard = value * unit + (1 if which == resource.RLIMIT_CPU else 0)
            resource.setrlimit(which, (value * unit, hard))
        if uid is not None and posix.getuid() == 0:
            posix.setgroups([])
            posix.setresgid(uid, uid, uid)
            posix.setresuid(uid, uid, uid)
        posix.chdir(cwd)
        exec_program(argv)
    except FileNotFoundError:
        path = posix.environ.get(b"PATH", b"").decode(errors="replace")
        posix.write(exec_error_w, f"no such program: {argv[0]!r} (PATH {path!r})".encode())
    except BaseException as exc:
        posix.write(exec_error_w, f"{type(exc).__name__}: {exc}".encode())
    posix._exit(127)


def exec_program(argv: list) -> None:
    """Exec `argv`, its program looked up in PATH as `os.execvp` does (a folder where it is missing is skipped;
    the first other error is raised when no folder has it)."""
    name, env = argv[0], posix.environ
    if "/" in name:
        posix.execve(name, argv, env)
    folders = env.get(b"PATH", b"/usr/bin:/bin").decode(errors="surrogateescape").split(":")
    first = None
    for folder in folders:
        try:
            posix.execve(f"{folder or '.'}/{name}", argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            first = first or exc
    raise first or FileNotFoundError(2, "No such file or directory", name)


def wait_for(pid: int) -> tuple:
    """Reap children (orphans too) until `pid` ends: its exit code, signal and CPU seconds."""
    while True:
        try:
            done, status, usage = posix.wait4(-1, 0)
        except ChildProcessError:
            return None, None, 0.0
        except InterruptedError:
            continue
        if done == pid:
            return (posix.WEXITSTATUS(status) if posix.WIFEXITED(status) else None,
                    posix.WTERMSIG(status) if posix.WIFSIGNALED(status) else None,
                    round(usage.ru_utime + usage.ru_stime, 3))


def left_running(as_init: bool) -> int:
    """How many of the program's processes are still alive: as a PID namespace's init, every process besides us
    (our exit kills them); else the other live members of our process group (we kill them)."""
    me, group, count = str(posix.getpid()), str(posix.getpgrp()), 0
    for name in posix.listdir("/proc"):
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
        chunk = posix.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def set_up_network(lines: list) -> tuple:
    """Set up the run's own network namespace as NETWORK's `lines` say (see the module): the connection count of
    each forward (a one-item list its accepting thread adds to) and the user namespace the program is to enter
    (None: none). OSError saying what could not be set up (the program is then not started)."""
    counts, userns = [], None
    forwards = [line.split(" ", 3) for line in lines if line.startswith(("forward ", "egress "))]
    if forwards:
        import _socket  # only a forwarding sandbox pays for it

        loopback_up(_socket)
        added = set()
        for kind, address, port, socket_path in forwards:
            if not address.startswith("127.") and address != "::1" and address not in added:
                add_address(_socket, address)
                added.add(address)
            count = serve_forward(_socket, address, int(port), socket_path)
            if kind == "egress":
                counts.append(count)
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "hosts":
            bind_hosts(rest)
        elif kind == "userns":  # the C call looked up here, before the fork: the child only makes it
            userns = (*(int(v) for v in rest.split()), *libc_call("unshare"))
    return counts, userns


def serve_forward(sockets, address: str, port: int, socket_path: str) -> list:
    """Listen on `address`:`port` and carry each connection to `socket_path`, from threads of ours; the count of
    connections accepted (a one-item list). OSError when it cannot."""
    family = sockets.AF_INET6 if ":" in address else sockets.AF_INET
    server = sockets.socket(family, sockets.SOCK_STREAM)
    try:
        server.setsockopt(sockets.SOL_SOCKET, sockets.SO_REUSEADDR, 1)
        server.bind((address, port))
        server.listen(128)
    except OSError as exc:
        server.close()
        raise OSError(f"could not forward {address}:{port} to {socket_path}: {exc}") from None
    count = [0]
    _thread.start_new_thread(accept_forever, (sockets, server, socket_path, count))
    return count


def add_address(sockets, address: str) -> None:
    """Add `address` to the loopback (one netlink RTM_NEWADDR: no `ip` needed); the kernel then routes it to us
    alone. OSError when it cannot."""
    family = sockets.AF_INET6 if ":" in address else sockets.AF_INET
    packed = sockets.inet_pton(family, address)
    flags = 0x02 | 0x80  # IFA_F_NODAD (usable at once), IFA_F_PERMANENT
    body = (bytes((family, len(packed) * 8, flags, 0)) + sockets.if_nametoindex("lo").to_bytes(4, sys.byteorder)
            + netlink_attribute(2, packed) + netlink_attribute(1, packed))  # IFA_LOCAL, IFA_ADDRESS
    request = 0x1 | 0x4 | 0x200 | 0x400  # NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE
    header = ((16 + len(body)).to_bytes(4, sys.byteorder) + (20).to_bytes(2, sys.byteorder)  # RTM_NEWADDR
              + request.to_bytes(2, sys.byteorder) + (1).to_bytes(4, sys.byteorder) + bytes(4))
    link = sockets.socket(sockets.AF_NETLINK, sockets.SOCK_RAW, 0)  # NETLINK_ROUTE
    try:
        link.sendto(header + body, (0, 0))
        reply = link.recv(4096)  # NLMSG_ERROR: the header, then the (negative) errno, 0 for the ack
    finally:
        link.close()
    error = -int.from_bytes(reply[16:20], sys.byteorder, signed=True)
    if error:
        raise OSError(f"could not add {address} to the sandbox's loopback: {posix.strerror(error)}")


def netlink_attribute(kind: int, data: bytes) -> bytes:
    return ((4 + len(data)).to_bytes(2, sys.byteorder) + kind.to_bytes(2, sys.byteorder) + data
            + bytes(-len(data) % 4))


def libc_call(name: str):
    """The C library's function `name`, returning an int (errno kept: `_ctypes.get_errno()`), through `_ctypes`
    alone (the `ctypes` package costs a few milliseconds of imports)."""
    import _ctypes

    class Library:
        _handle = _ctypes.dlopen(None, 2)  # type: ignore[arg-type]  # RTLD_NOW: the process's own symbols

    class Int(_ctypes._SimpleCData):
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    return Function((name, Library())), _ctypes.get_errno  # type: ignore[arg-type]  # any object with a _handle


def bind_hosts(path: str) -> None:
    """Bind `path` over /etc/hosts (we are root in the run's own mount namespace). OSError when we cannot."""
    mount, errno = libc_call("mount")
    if mount(path.encode(), b"/etc/hosts", None, 0x1000, None) != 0:  # MS_BIND
        raise OSError(f"could not bind {path} over /etc/hosts: {posix.strerror(errno())}")


def enter_user_namespace(uid: int, gid: int, unshare, errno) -> None:
    """In the forked child: enter a new user namespace as `uid`:`gid`, mapped onto our 0 (no capability of ours
    reaches the namespaces we set up); `unshare` and `errno` are the C library's (`libc_call`)."""
    if unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(f"could not enter a user namespace: {posix.strerror(errno())}")
    for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} 0 1"), ("gid_map", f"{gid} 0 1")):
        try:
            fd = posix.open(f"/proc/self/{name}", posix.O_WRONLY)
            try:
                posix.write(fd, line.encode())
            finally:
                posix.close(fd)
        except OSError as exc:
            raise OSError(f"could not map the program's user namespace ({name} {line!r}): {exc.strerror}") from None


def refused_connections() -> int:
    """What this network namespace refused so far: sends with no route (Ip, Ip6 OutNoRoutes), TCP connections
    reset for want of a listener (Tcp AttemptFails), datagrams to no socket (Udp NoPorts, Udp6NoPorts)."""
    counted = {"Ip:OutNoRoutes", "Tcp:AttemptFails", "Udp:NoPorts", "Ip6OutNoRoutes", "Udp6NoPorts"}
    total = 0
    try:
        with open("/proc/net/snmp") as table:
            lines = table.read().split("\n")
        for names, values in zip(lines[::2], lines[1::2], strict=False):  # a header line, then its values
            proto = names.split(" ", 1)[0]
            total += sum(int(v) for n, v in zip(names.split()[1:], values.split()[1:], strict=False)
                         if proto + n in counted)
        with open("/proc/net/snmp6") as table:
            total += sum(int(v) for n, v in (line.split() for line in table if line.strip()) if n in counted)
    except (OSError, ValueError):
        pass  # a kernel without IPv6 has no snmp6: what was counted stands
    return total


def loopback_up(sockets) -> None:  # the `_socket` module (imported only when forwarding)
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


def accept_forever(sockets, server, socket_path: str, count: list) -> None:
    """Each connection to `server`, carried both ways to the Unix socket at `socket_path` (and counted)."""
    while True:
        fd, _ = server._accept()  # the C socket's accept: a descriptor (close-on-exec)
        count[0] += 1
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
            raise OSError(errno, f"{name} {what}: {posix.strerror(errno)}".strip())


_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 0x1, 0x2, 0x4, 0x20, 0x1000, 0x4000
_ST_TO_MS = ((0x1, 0x1), (0x2, 0x2), (0x4, 0x4), (0x8, 0x8), (0x400, 0x400), (0x800, 0x800), (0x1000, 0x200000))
"""statvfs flags -> the mount flags a read-only remount must keep (a user namespace may not clear them)."""
_O_PATH = posix.O_PATH | posix.O_NOFOLLOW | posix.O_CLOEXEC


def build_view(spec: str, drop_capabilities: bool) -> None:
    """Build the view `spec` describes (see `encode_view`), pivot into it; drop every capability when asked."""
    libc = _Libc()
    root, *records = spec.split(_RECORD)
    libc.call("mount", b"tracegym-view", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755",
              what=root)
    read_only = []
    for record in records:
        kind, target, source = record.split(_FIELD)
        folder = kind in ("empty", "proc") or (kind in ("ro", "rw") and is_folder(source))
        if kind == "symlink":
            parent, name = target.rsplit("/", 1)
            fd = mountpoint(root, parent, folder=True)
            try:
                posix.symlink(source, name, dir_fd=fd)
            finally:
                posix.close(fd)
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
            posix.close(fd)
        if kind in ("ro", "empty"):
            read_only.append((target, folder))
    for target, folder in read_only:
        remount_read_only(libc, root, target, folder)
    old = root + "/.old"
    posix.mkdir(old, 0o700)
    libc.call("pivot_root", root.encode(), old.encode(), what=root)
    posix.chdir("/")
    libc.call("umount2", b"/.old", 2, what="the host's root")  # MNT_DETACH
    posix.rmdir("/.old")
    remount_read_only(libc, "", "/")
    if drop_capabilities:
        drop_all_capabilities(libc)


def is_folder(path: str) -> bool:
    """True when `path` is a folder (or a link to one), as `os.path.isdir` says."""
    try:
        return posix.stat(path).st_mode & 0o170000 == 0o040000
    except (OSError, ValueError):
        return False


def mountpoint(root: str, target: str, folder: bool) -> int:
    """An O_PATH descriptor of `root` + `target`, each missing component made (a folder, or an empty file last
    unless `folder`); OSError where a component is a link (a program may have left one in its /tmp)."""
    fd = posix.open(root, posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    parts = [part for part in target.split("/") if part]
    try:
        for index, part in enumerate(parts):
            directory = folder or index < len(parts) - 1
            try:
                inner = posix.open(part, _O_PATH, dir_fd=fd)
            except FileNotFoundError:
                if directory:
                    posix.mkdir(part, 0o755, dir_fd=fd)
                else:
                    made = posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_CLOEXEC
                    posix.close(posix.open(part, made, 0o644, dir_fd=fd))
                inner = posix.open(part, _O_PATH, dir_fd=fd)
            posix.close(fd)
            fd = inner
            mode = posix.fstat(fd).st_mode
            if (mode & 0o170000 == 0o040000) != directory or mode & 0o170000 == 0o120000:
                raise OSError(20, "a link or another kind of file is in the way")  # ENOTDIR
    except OSError as exc:
        posix.close(fd)
        raise OSError(exc.errno, f"cannot make the mountpoint {target}: {exc.strerror}") from None
    return fd


def remount_read_only(libc, root: str, target: str, folder: bool = True) -> None:  # a _Libc
    """Make the mount at `root` + `target` read-only, nosuid and nodev, keeping the flags it must keep."""
    fd = mountpoint(root, target, folder) if target != "/" else posix.open("/", _O_PATH | posix.O_DIRECTORY)
    try:
        at = f"/proc/self/fd/{fd}"
        kept = posix.statvfs(at).f_flag
        flags = sum(ms for st, ms in _ST_TO_MS if kept & st)
        libc.call("mount", None, at.encode(), None,
                  _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | flags, None, what=target)
    finally:
        posix.close(fd)


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
    while posix.read(fd, 1):
        pass
    try:
        posix.killpg(0, signal.SIGKILL)  # outside a PID namespace this ends us too; inside, init survives it
    finally:
        posix._exit(1)


if __name__ == "__main__":
    main()
