"""Egress: the allow-list of hosts and ports a sandbox without network may still reach, and the host-side relay that
carries its programs' connections there.

An entry of `Limits.egress` is `HOST:PORT` (TCP only): an IPv4 address, an IPv6 address in brackets
(`[2001:db8::1]:443`) or a hostname. A malformed entry fails `Limits` validation, naming it; a hostname that does
not resolve on the host fails before any rollout starts (`runtimes.preflight`), naming it, and is looked up again
when a sandbox first runs a program under the list (one that stopped resolving since is that run's `start_error`).
Nothing filters packets (no iptables: it needs root and is often absent). Inside the run's own network namespace,
which has only a loopback, the program init adds each allowed address to the loopback, listens on `ADDRESS:PORT` and
carries each connection to a Unix socket of the sandbox's `EgressRelay` (one per allowed address and port), which
connects to the real destination from the host. The program connects to the real address and port as it would with
network; no other address routes anywhere (ENETUNREACH), another port of an allowed address is refused, and the
host's 127.0.0.1 stays out of reach. A hostname resolves inside to its allowed addresses through a hosts file over
/etc/hosts (bubblewrap binds it; the `subprocess` runtime's init, root in the run's mount namespace, bind-mounts
it); no DNS server is reachable, so that file is the only answer.

Enforced by the runtimes with a network namespace and the program init: `subprocess` with namespaces (as root the
init adds the addresses and the program runs under its own uid; `user-namespaces` the same, in a user namespace)
and `bubblewrap` (the init runs as root of bwrap's user namespace with CAP_NET_ADMIN, CAP_NET_BIND_SERVICE and
CAP_SETFCAP, and the program one user namespace further down with none; see `bubblewrap.egress_flags`) and
`container` (the init, the container's root, with NET_ADMIN and NET_BIND_SERVICE until the program drops to the
sandbox's uid; the sockets and hosts file bound in by the engine: `container.egress_flags`). Refused, naming
`egress`: the process-group fallback (it shares the host's network).

The relay is the sandbox's: made at its first run under an allow-list, closed at its close. It carries at most
`MAX_CONNECTIONS` at once (one more is closed at once) and counts per entry what it carried, what the destination
refused and what it shed (`EgressRelay.use`). Each run's ProgramResult says what its program reached
(`egress_connections`, per entry) and what its namespace refused (`refused_connections`: sends with no route,
TCP connections nothing listened for, datagrams to no socket, counted by the kernel's per-namespace counters, on
every run with a network namespace of its own, allow-list or not): a program probing hosts outside its task shows
there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tracegym.core.errors import UsageError

MAX_CONNECTIONS = 64
"""Connections one sandbox's relay carries at once; one more is closed as soon as it arrives (`EntryUse.shed`)."""
CONNECT_TIMEOUT_S = 10.0
"""How long the relay waits for an allowed destination to accept a connection."""
RESOLVE_TIMEOUT_S = 5.0
"""How long looking up a hostname of the allow-list may take."""
_HOSTNAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*\.?")
_ENTRY_FORM = "HOST:PORT (an IPv4 address, an IPv6 address in brackets or a hostname, and a TCP port 1-65535)"


def parse_entry(entry: str) -> tuple[str, int]:
    """The host and port of allow-list entry `entry`; ValueError naming it and saying what is wrong."""
    host, colon, port = entry.rpartition(":")
    if not colon or not host:
        raise ValueError(f"egress entry {entry!r} is not {_ENTRY_FORM}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"egress entry {entry!r} has no port 1-65535 ({port!r}); expected {_ENTRY_FORM}")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        address = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        numeric = host.rstrip(".").rsplit(".", 1)[-1].isdigit()  # `10.1` is no hostname (nor an address here)
        if bracketed or ":" in host or numeric or not _HOSTNAME.fullmatch(host):
            raise ValueError(f"egress entry {entry!r}: {host!r} is neither an address nor a hostname; expected "
                             f"{_ENTRY_FORM}") from None
        return host.rstrip(".").lower(), int(port)
    if address.version == 6 and not bracketed:
        raise ValueError(f"egress entry {entry!r}: an IPv6 address goes in brackets ([{host}]:{port})")
    if address.is_unspecified or address.is_multicast or str(address) == "255.255.255.255":
        raise ValueError(f"egress entry {entry!r}: {address} is not one host's address")
    return str(address), int(port)


@dataclass(frozen=True)
class Destination:
    """One address and port an entry allows (a hostname may allow several addresses)."""

    entry: str
    address: str
    port: int
    hostname: str | None = None
    """The hostname the entry named (None: it named the address)."""


async def resolve(entries: Sequence[str]) -> list[Destination]:
    """Every address and port `entries` allow, hostnames looked up on the host now (each address once); UsageError
    naming the first entry that is malformed or does not resolve."""
    found: dict[tuple[str, int], Destination] = {}
    loop = asyncio.get_running_loop()
    for entry in entries:
        try:
            host, port = parse_entry(entry)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        try:
            ipaddress.ip_address(host)
            addresses, hostname = [host], None
        except ValueError:
            addresses, hostname = await _look_up(loop, entry, host, port), host
        for address in addresses:
            found.setdefault((address, port), Destination(entry, address, port, hostname))
    return list(found.values())


async def _look_up(loop: asyncio.AbstractEventLoop, entry: str, host: str, port: int) -> list[str]:
    """The addresses `host` has on this host (IPv4 first); UsageError naming `entry` when it has none."""
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        why = f"no answer in {RESOLVE_TIMEOUT_S:g} s" if isinstance(exc, TimeoutError) else str(exc)
        raise UsageError(f"egress entry {entry!r} does not resolve on this host: {why}") from None
    ordered = sorted(infos, key=lambda info: info[0] != socket.AF_INET)
    return list(dict.fromkeys(str(ipaddress.ip_address(str(info[4][0]).split("%")[0])) for info in ordered))


def loopback_names(hosts: Path = Path("/etc/hosts")) -> list[str]:
    """The lines of the host's hosts file that name a loopback address (localhost, the machine's own name), or
    the usual two when it has none."""
    lines = []
    with contextlib.suppress(OSError):
        for line in hosts.read_text(errors="replace").splitlines():
            fields = line.split("#", 1)[0].split()
            with contextlib.suppress(ValueError):
                if len(fields) > 1 and ipaddress.ip_address(fields[0]).is_loopback:
                    lines.append(" ".join(fields))
    return lines or ["127.0.0.1 localhost", "::1 localhost"]


@dataclass
class EntryUse:
    """What a sandbox's relay did for one entry of the allow-list."""

    connections: int = 0
    """Connections carried to the destination."""
    failed: int = 0
    """Connections the destination refused or did not accept in `CONNECT_TIMEOUT_S`."""
    shed: int = 0
    """Connections closed on arrival: the relay carried `MAX_CONNECTIONS` already."""


@dataclass(frozen=True)
class EgressRoute:
    """What one run's program init is given: each allowed destination with the relay socket that carries it, and
    the hosts file to put over /etc/hosts (None when no entry names a host)."""

    folder: Path
    """The relay's folder (sockets and hosts file), for a runtime that must make it visible in the sandbox."""
    destinations: tuple[tuple[Destination, Path], ...]
    hosts: Path | None


@dataclass(eq=False)
class EgressRelay:
    """One sandbox's relay: a Unix socket in `folder` per allowed address and port, each connection to it carried
    to that destination from the host. `uid` (the sandbox's, where we are root) owns the folder, so only its own
    program init can reach the sockets."""

    folder: Path
    uid: int | None = None
    max_connections: int = MAX_CONNECTIONS
    use: dict[str, EntryUse] = field(default_factory=dict)
    """Per entry of every allow-list its programs ran under, what the relay did (see EntryUse)."""
    _servers: dict[tuple[str, int], tuple[asyncio.AbstractServer, Path]] = field(default_factory=dict)
    _routes: dict[tuple[str, ...], EgressRoute] = field(default_factory=dict)
    _carrying: set[asyncio.Task[None]] = field(default_factory=set)
    _routing: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a route is made (two runs starting at once under a new allow-list make it once)."""
    _closed: bool = False

    async def route(self, entries: tuple[str, ...]) -> EgressRoute:
        """The route of a run under allow-list `entries`: resolved and served once per sandbox (UsageError
        naming an entry that does not resolve)."""
        async with self._routing:
            if self._closed:
                raise RuntimeError("the egress relay is closed")
            if entries not in self._routes:
                destinations = await resolve(entries)
                self._make_folder()
                served = []
                for destination in destinations:
                    self.use.setdefault(destination.entry, EntryUse())
                    served.append((destination, await self._serve(destination)))
                self._routes[entries] = EgressRoute(self.folder, tuple(served), self._hosts_file(destinations))
            return self._routes[entries]

    async def close(self) -> None:
        """Stop serving, drop every connection carried and remove the folder. Closing twice is harmless."""
        self._closed = True
        for server, _ in self._servers.values():
            server.close()
        for task in list(self._carrying):
            task.cancel()
        await asyncio.gather(*self._carrying, return_exceptions=True)
        self._servers.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _make_folder(self) -> None:
        if self.folder.exists():
            return
        self.folder.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(self.folder, self.uid, self.uid)

    async def _serve(self, destination: Destination) -> Path:
        """The Unix socket that carries connections to `destination` (served from now until close)."""
        key = (destination.address, destination.port)
        if key not in self._servers:
            path = self.folder / f"{len(self._servers)}.sock"
            server = await asyncio.start_unix_server(
                lambda reader, writer: self._accept(destination.entry, key, reader, writer), path=str(path))
            path.chmod(0o666)  # the folder (0700, the sandbox's) is what keeps others out
            self._servers[key] = (server, path)
        return self._servers[key][1]

    def _hosts_file(self, destinations: list[Destination]) -> Path | None:
        """A hosts file naming each allowed hostname's addresses first (the first match wins), then the host's
        loopback names (localhost, its own name); None when no entry is a hostname."""
        named = [f"{d.address} {d.hostname}" for d in destinations if d.hostname is not None]
        if not named:
            return None
        path = self.folder / f"hosts-{len(self._routes)}"
        path.write_text("\n".join([*named, *loopback_names(), ""]))
        path.chmod(0o644)
        return path

    def _accept(self, entry: str, destination: tuple[str, int], reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> None:
        use = self.use[entry]
        if self._closed or len(self._carrying) >= self.max_connections:
            use.shed += 1
            writer.close()
            return
        task = asyncio.ensure_future(self._carry(use, destination, reader, writer))
        self._carrying.add(task)
        task.add_done_callback(self._carrying.discard)

    async def _carry(self, use: EntryUse, destination: tuple[str, int], reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        """Connect to `destination` and copy both ways until both ends are done (each direction ends on its own)."""
        try:
            try:
                far_reader, far_writer = await asyncio.wait_for(asyncio.open_connection(*destination),
                                                                CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                use.failed += 1
                return
            use.connections += 1
            try:
                await asyncio.gather(_pump(reader, far_writer), _pump(far_reader, writer))
            finally:
                far_writer.close()
        finally:
            writer.close()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy `source` to `sink` until its end, then pass the end on; a broken end closes `sink` (which ends the
    other direction too)."""
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except OSError:
        sink.close()
