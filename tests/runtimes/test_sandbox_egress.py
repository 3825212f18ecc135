"""The egress allow-list: a sandbox without network reaches the `HOST:PORT`s its limits name and nothing else,
under each runtime with a network namespace. The far side is this test's own network namespace (a veth pair, two
addresses, a TCP echo server on each), made as root and removed even when a test fails."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError
from sandbox_helpers import QUICK

from tracegym.runtimes import egress
from tracegym.runtimes.bubblewrap import Bubblewrap
from tracegym.runtimes.container import Container, egress_flags
from tracegym.runtimes.egress import EgressRelay, resolve
from tracegym.runtimes.limited_process import LimitedProcess, detect_isolation
from tracegym.runtimes.sandbox import Forward, Limits, RuntimeUnavailable, Sandbox

PORT = 443
"""The echo servers' port on the far side (below 1024, as most allowed ports are: the init needs the right to
listen there)."""
ECHO_SERVER = """
import socket, sys, threading
def serve(server):
    while True:
        conn, _ = server.accept()
        threading.Thread(target=echo, args=(conn, server.getsockname()[0]), daemon=True).start()
def echo(conn, address):
    with conn:
        while data := conn.recv(4096):
            conn.sendall(address.encode() + b" " + data)
for address in sys.argv[2:]:
    server = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, int(sys.argv[1])))
    server.listen(64)
    threading.Thread(target=serve, args=(server,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""
"""Echoes each connection's bytes back after the address it came to, on every address given, until stdin ends."""
PROBE = """
import json, socket, sys
results = {}
for target in sys.argv[1:]:
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=3) as conn:
            conn.sendall(b"ping")
            results[target] = conn.recv(256).decode()
    except OSError as exc:
        results[target] = f"refused: {exc}"
print(json.dumps(results))
"""
"""Connects to each `HOST:PORT` given and says what came back (`<address> ping`) or why it could not."""

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                reason="making the far side's network namespace needs root and `ip`")


@dataclass(frozen=True)
class FarSide:
    """The test's network namespace: two IPv4 addresses and one IPv6 address, each echoing on PORT."""

    allowed: str
    blocked: str
    allowed6: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def far_side() -> Iterator[FarSide]:
    """A network namespace behind a veth pair from the host, its echo server running; removed at the end, also
    when setting it up fails half-way."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("making the far side's network namespace needs root and `ip`")
    tag = secrets.token_hex(3)
    namespace, host_end, far_end = f"tg-egress-{tag}", f"tge{tag}h", f"tge{tag}f"
    octet = int(tag[:2], 16)  # a subnet of its own: tests in other worktrees may run at the same time
    far = FarSide(f"10.213.{octet}.1", f"10.213.{octet}.2", f"fd21:3:{octet:x}::1")
    server = None
    try:
        _ip("netns", "add", namespace)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", far_end, "netns", namespace)
        _ip("addr", "add", f"10.213.{octet}.254/24", "dev", host_end)
        _ip("addr", "add", f"fd21:3:{octet:x}::fe/64", "dev", host_end, "nodad")
        _ip("link", "set", host_end, "up")
        for address in (f"{far.allowed}/24", f"{far.blocked}/24"):
            _ip("-n", namespace, "addr", "add", address, "dev", far_end)
        _ip("-n", namespace, "addr", "add", f"{far.allowed6}/64", "dev", far_end, "nodad")
        _ip("-n", namespace, "link", "set", far_end, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", ECHO_SERVER, str(PORT),
                                   far.allowed, far.blocked, far.allowed6],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield far
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def _namespace_runtimes() -> list[object]:
    """pytest params: every runtime that holds a program to an allow-list, skipped where this host lacks it."""
    isolation = detect_isolation()
    params: list[object] = [pytest.param(
        "namespaces", id="subprocess-namespaces", marks=pytest.mark.skipif(
            isolation != "namespaces", reason=f"the subprocess runtime's namespaces need root (here: {isolation})"))]
    params.append(pytest.param("user-namespaces", id="subprocess-user-namespaces", marks=pytest.mark.skipif(
        isolation != "user-namespaces", reason=f"the subprocess runtime uses {isolation} here")))
    unavailable = Bubblewrap().unavailable()
    params.append(pytest.param("bubblewrap", id="bubblewrap",
                               marks=pytest.mark.skipif(bool(unavailable), reason=str(unavailable))))
    return params


def _runtime(name: str, limits: Limits) -> LimitedProcess | Bubblewrap:
    return Bubblewrap(limits) if name == "bubblewrap" else LimitedProcess(limits, isolation=name)  # type: ignore[arg-type]


@pytest.fixture(params=_namespace_runtimes())
def runtime_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def open_sandbox(runtime_name: str) -> AsyncIterator[object]:
    """Opens sandboxes of the test's runtime under given limits; closes each after the test."""
    opened: list[Sandbox] = []

    async def open_one(limits: Limits) -> Sandbox:
        box = await _runtime(runtime_name, limits).open()
        opened.append(box)
        return box

    yield open_one
    for box in opened:
        await box.close()


async def probe(box: Sandbox, *targets: str, limits: Limits | None = None) -> dict[str, str]:
    result = await box.run(["python3", "-c", PROBE, *targets], limits=limits)
    assert result.ok, result
    return dict(json.loads(result.stdout))


def allow(*entries: str) -> Limits:
    return QUICK.model_copy(update={"egress": entries})


@pytest.fixture
def host_canary() -> Iterator[int]:
    """A port listening on the host's 127.0.0.1 (nothing in a sandbox without network may reach it)."""
    with socket.socket() as canary:
        canary.bind(("127.0.0.1", 0))
        canary.listen(8)
        yield canary.getsockname()[1]


# --- the far side itself -------------------------------------------------------------------------------------------
@needs_root
def test_the_host_reaches_both_far_addresses(far_side: FarSide) -> None:
    for address in (far_side.allowed, far_side.blocked):
        with socket.create_connection((address, PORT), timeout=3) as conn:
            conn.sendall(b"ping")
            assert conn.recv(256) == f"{address} ping".encode()


# --- under each namespace runtime ----------------------------------------------------------------------------------
@needs_root
async def test_an_allowed_address_is_reached(far_side: FarSide, open_sandbox) -> None:
    box = await open_sandbox(allow(f"{far_side.allowed}:{PORT}"))
    target = f"{far_side.allowed}:{PORT}"
    assert (await probe(box, target))[target] == f"{far_side.allowed} ping"


@needs_root
async def test_an_address_not_allowed_is_unreachable(far_side: FarSide, open_sandbox) -> None:
    box = await open_sandbox(allow(f"{far_side.allowed}:{PORT}"))
    target = f"{far_side.blocked}:{PORT}"
    assert (await probe(box, target))[target].startswith("refused: [Errno 101]")  # ENETUNREACH: no route at all


@needs_root
async def test_another_port_of_an_allowed_address_is_refused(far_side: FarSide, open_sandbox) -> None:
    box = await open_sandbox(allow(f"{far_side.allowed}:{PORT}"))
    target = f"{far_side.allowed}:{PORT + 1}"
    assert (await probe(box, target))[target].startswith("refused: [Errno 111]")  # ECONNREFUSED, in the sandbox


@needs_root
async def test_the_hosts_loopback_stays_unreachable(far_side: FarSide, open_sandbox, host_canary: int) -> None:
    box = await open_sandbox(allow(f"{far_side.allowed}:{PORT}"))
    target = f"127.0.0.1:{host_canary}"
    assert (await probe(box, target))[target].startswith("refused: ")


@needs_root
async def test_an_allowed_ipv6_address_is_reached(far_side: FarSide, open_sandbox) -> None:
    entry = f"[{far_side.allowed6}]:{PORT}"
    box = await open_sandbox(allow(entry))
    assert (await probe(box, entry))[entry] == f"{far_side.allowed6} ping"


@needs_root
async def test_a_hostname_resolves_inside_to_its_allowed_address(far_side: FarSide, open_sandbox,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    async def look_up(_loop: object, _entry: str, host: str, _port: int) -> list[str]:
        assert host == "echo.far.test"
        return [far_side.allowed]

    monkeypatch.setattr(egress, "_look_up", look_up)  # the host's DNS, answering for a name only this test has
    box = await open_sandbox(allow(f"echo.far.test:{PORT}"))
    target = f"echo.far.test:{PORT}"
    assert (await probe(box, target))[target] == f"{far_side.allowed} ping"


@needs_root
async def test_localhost_still_resolves_beside_an_allowed_hostname(far_side: FarSide, open_sandbox,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    async def look_up(_loop: object, _entry: str, _host: str, _port: int) -> list[str]:
        return [far_side.allowed]

    monkeypatch.setattr(egress, "_look_up", look_up)
    box = await open_sandbox(allow(f"echo.far.test:{PORT}"))
    result = await box.run(["python3", "-c", "import socket; print(socket.gethostbyname('localhost'))"])
    assert result.ok and result.stdout.strip() == "127.0.0.1", result


@needs_root
async def test_the_result_counts_connections_per_entry_and_refusals(far_side: FarSide, open_sandbox) -> None:
    entries = (f"{far_side.allowed}:{PORT}", f"[{far_side.allowed6}]:{PORT}")
    box = await open_sandbox(allow(*entries))
    result = await box.run(["python3", "-c", PROBE, entries[0], entries[0], f"{far_side.blocked}:{PORT}"])
    assert result.ok, result
    assert result.egress_connections == {entries[0]: 2, entries[1]: 0}
    assert result.refused_connections == 1
    assert box.egress is not None and box.egress.use[entries[0]].connections == 2  # type: ignore[attr-defined]


@needs_root
async def test_the_proxy_forward_is_reached_beside_the_allow_list(far_side: FarSide, open_sandbox) -> None:
    served = Path(tempfile.mkdtemp(prefix="tracegym-test-service-"))
    served.chmod(0o711)  # as the proxy's: a sandbox's uid may pass through to the socket
    socket_path = served / "service.sock"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"service " + await reader.read(64))
        await writer.drain()
        writer.close()

    service = await asyncio.start_unix_server(answer, path=str(socket_path))
    socket_path.chmod(0o666)
    try:
        box = await open_sandbox(allow(f"{far_side.allowed}:{PORT}"))
        targets = (f"127.0.0.1:{PORT + 2}", f"{far_side.allowed}:{PORT}")
        result = await box.run(["python3", "-c", PROBE, *targets], forward=Forward(PORT + 2, socket_path))
        assert result.ok, result
        assert json.loads(result.stdout) == {targets[0]: "service ping", targets[1]: f"{far_side.allowed} ping"}
    finally:
        service.close()
        shutil.rmtree(served)


@needs_root
async def test_a_run_without_egress_in_an_allow_list_sandbox_reaches_nothing(far_side: FarSide,
                                                                            open_sandbox) -> None:
    target = f"{far_side.allowed}:{PORT}"
    box = await open_sandbox(allow(target))
    assert (await probe(box, target))[target] == f"{far_side.allowed} ping"  # the route exists for this sandbox
    assert (await probe(box, target, limits=QUICK))[target].startswith("refused: ")  # and is no run's but its own


@needs_root
async def test_the_program_holds_no_capability_under_an_allow_list(far_side: FarSide, open_sandbox) -> None:
    box = await open_sandbox(allow(f"{far_side.allowed}:{PORT}"))
    check = ("import subprocess; caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')];"
             f"added = subprocess.run(['ip', 'addr', 'add', '{far_side.blocked}/32', 'dev', 'lo']).returncode;"
             "print(caps[0], added)")
    result = await box.run(["python3", "-c", check])
    assert result.ok, result
    assert result.stdout.split() == ["0000000000000000", "2"]  # `ip`: RTNETLINK answers: Operation not permitted


async def test_a_run_without_an_allow_list_counts_what_its_namespace_refused(open_sandbox, host_canary: int) -> None:
    box = await open_sandbox(QUICK)
    result = await box.run(["python3", "-c", PROBE, f"127.0.0.1:{host_canary}", "192.0.2.1:80"])
    assert result.ok, result
    assert (result.refused_connections, result.egress_connections) == (2, {})


async def test_the_process_group_fallback_counts_nothing() -> None:
    box = await LimitedProcess(QUICK, isolation="process-group").open()
    try:
        result = await box.run(["true"])
        assert result.ok and result.refused_connections is None, result
    finally:
        await box.close()


async def test_an_entry_that_does_not_resolve_is_a_start_error_naming_it(open_sandbox) -> None:
    entry = "no-such-host.invalid:80"
    box = await open_sandbox(QUICK)
    result = await box.run(["true"], limits=allow(entry))
    assert result.start_error is not None and entry in result.start_error and "does not resolve" in result.start_error


# --- what is refused before any program runs -----------------------------------------------------------------------
@pytest.mark.parametrize("entry", ["10.0.0.1", "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1:http", "::1:80",
                                   "bad_name:80", "[example.com]:80", "0.0.0.0:80"])
def test_a_malformed_entry_is_refused_by_name(entry: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(f"egress entry {entry!r}")):
        Limits(egress=(entry,))


def test_an_allow_list_with_network_is_refused_naming_egress() -> None:
    with pytest.raises(ValidationError, match=r"egress .* without network"):
        Limits(network=True, egress=("10.0.0.1:80",))


async def test_the_process_group_fallback_refuses_an_allow_list_naming_egress() -> None:
    with pytest.raises(RuntimeUnavailable, match=r"limits\.egress.*no network namespace"):
        await LimitedProcess(allow("10.0.0.1:80"), isolation="process-group").open()


@pytest.mark.slow
@needs_root
async def test_a_container_reaches_its_allowed_address_and_hostname_and_nothing_else(
        far_side: FarSide, monkeypatch: pytest.MonkeyPatch, container_image: object) -> None:
    """The container runtime under an allow-list of one hostname (one container, to keep this slow test short):
    the name and its address are reached, the blocked address and another port are not, and the program holds no
    capability."""
    async def look_up(_loop: object, _entry: str, host: str, _port: int) -> list[str]:
        return [far_side.allowed]

    monkeypatch.setattr(egress, "_look_up", look_up)
    allowed, named = f"{far_side.allowed}:{PORT}", f"echo.far.test:{PORT}"
    box = await Container(allow(named)).open()
    try:
        reached = await probe(box, allowed, named, f"{far_side.blocked}:{PORT}", f"{far_side.allowed}:{PORT + 1}")
        effective = "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])"
        caps = await box.run(["python3", "-c", effective])
    finally:
        await box.close()
    assert reached[allowed] == reached[named] == f"{far_side.allowed} ping"
    assert reached[f"{far_side.blocked}:{PORT}"].startswith("refused: ")
    assert reached[f"{far_side.allowed}:{PORT + 1}"].startswith("refused: ")
    assert caps.ok and caps.stdout.strip() == "0000000000000000", caps


def test_a_container_under_an_allow_list_binds_each_relay_socket_and_the_hosts_file(tmp_path: Path) -> None:
    """Unit level: the init may add addresses and listen below 1024; the sockets (in a folder the init could not
    pass) are bound in one by one, the hosts file over /etc/hosts."""
    sockets = (tmp_path / "0.sock", tmp_path / "1.sock")
    destinations = tuple((object(), path) for path in sockets)
    flags = " ".join(egress_flags(egress.EgressRoute(tmp_path, destinations, tmp_path / "hosts-0")))  # type: ignore[arg-type]
    assert "--cap-add NET_ADMIN --cap-add NET_BIND_SERVICE" in flags
    for path in sockets:
        assert f"-v {path}:{path}:ro" in flags
    assert f"-v {tmp_path / 'hosts-0'}:/etc/hosts:ro" in flags
    assert egress_flags(None) == []


async def test_a_malformed_entry_is_refused_by_resolve() -> None:
    with pytest.raises(Exception, match="egress entry 'x:99999'"):
        await resolve(["x:99999"])


# --- the relay -----------------------------------------------------------------------------------------------------
@pytest.fixture
async def echo_on_loopback() -> AsyncIterator[int]:
    """A TCP echo server on the host's 127.0.0.1; its port."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def test_the_relay_sheds_connections_over_its_bound(tmp_path: Path, echo_on_loopback: int) -> None:
    entry = f"127.0.0.1:{echo_on_loopback}"
    relay = EgressRelay(tmp_path / "egress", max_connections=1)
    route = await relay.route((entry,))
    path = route.destinations[0][1]
    held_reader, held = await asyncio.open_unix_connection(str(path))
    held.write(b"hi")
    assert await held_reader.read(2) == b"hi"  # carried: the one connection the relay may hold
    shed_reader, shed = await asyncio.open_unix_connection(str(path))
    assert await asyncio.wait_for(shed_reader.read(), 5) == b""  # closed on arrival
    assert (relay.use[entry].connections, relay.use[entry].shed) == (1, 1)
    held.close()
    shed.close()
    await relay.close()


async def test_the_relay_counts_a_destination_that_refuses(tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        entry = f"127.0.0.1:{unused.getsockname()[1]}"  # bound, never listening: connections are refused
        relay = EgressRelay(tmp_path / "egress")
        route = await relay.route((entry,))
        reader, writer = await asyncio.open_unix_connection(str(route.destinations[0][1]))
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert relay.use[entry].failed == 1
        await relay.close()


async def test_the_relay_closes_its_connections_and_folder(tmp_path: Path, echo_on_loopback: int) -> None:
    relay = EgressRelay(tmp_path / "egress")
    route = await relay.route((f"127.0.0.1:{echo_on_loopback}",))
    reader, writer = await asyncio.open_unix_connection(str(route.destinations[0][1]))
    writer.write(b"hi")
    assert await reader.read(2) == b"hi"
    await relay.close()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert not route.folder.exists()
    writer.close()


async def test_a_sandbox_close_closes_its_relay(open_sandbox, echo_on_loopback: int) -> None:
    box = await open_sandbox(QUICK)
    result = await box.run(["true"], limits=allow(f"127.0.0.1:{echo_on_loopback}"))
    assert result.ok, result
    folder = box.egress.folder  # type: ignore[attr-defined]
    assert folder.exists()
    await box.close()
    assert not folder.exists()
