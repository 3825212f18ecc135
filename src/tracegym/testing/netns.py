"""Netns hosts: network namespaces standing in for other machines, for tests and benchmarks of env servers on
several hosts (root and iproute2 needed; `available()` says whether they can be made here).

Host i is a namespace joined to this one by a veth pair on a /30 of its own inside 10.213.N.0/24 (N picked from the
process id, moved on while another run holds it): this side is `gateway`, the host's side `address`, and the host
routes everything through its gateway, so a server here bound to host 0's gateway is reachable from every host. No
other address is ever made or touched. `cut(i)` takes host i off the network (its link down: no FIN reaches anyone,
as when a machine loses power); `kill(i)` kills every process on it instead. Everything is removed on exit, even on
failure: the processes started in the namespaces, the veth pairs, the namespaces.

>>> with NetnsHosts(3) as hosts:  # doctest: +SKIP
...     with local_server("echo", address=f"tcp://{hosts.address(0)}:5555", under=hosts.run_in(0)) as address: ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess

SUBNET = "10.213"
"""The first two octets of every address made here."""


def available() -> bool:
    """True when this process may make network namespaces (root, with `ip` on the path)."""
    return os.geteuid() == 0 and shutil.which("ip") is not None and _ip("netns", "list", check=False) == 0


class NetnsHosts:
    """`count` namespaces `tg<pid>h<i>`, each on its own veth pair; `with NetnsHosts(3) as hosts: ...`."""

    def __init__(self, count: int) -> None:
        if not 1 <= count <= 60:
            raise ValueError(f"1 to 60 hosts fit in one 10.213.N.0/24, not {count}")
        self.count = count
        self.tag = f"tg{os.getpid() % 100000}"
        self.third = self._free_third_octet()

    def name(self, i: int) -> str:
        """Host i's namespace."""
        return f"{self.tag}h{i}"

    def address(self, i: int) -> str:
        """Host i's own address (inside its namespace)."""
        return f"{SUBNET}.{self.third}.{4 * i + 2}"

    def gateway(self, i: int) -> str:
        """This side of host i's link: the address host i reaches this namespace by."""
        return f"{SUBNET}.{self.third}.{4 * i + 1}"

    def run_in(self, i: int) -> list[str]:
        """The command prefix that runs a program on host i."""
        return ["ip", "netns", "exec", self.name(i)]

    def cut(self, i: int) -> None:
        """Take host i off the network: its link goes down on this side, so nothing it sends arrives (no FIN)."""
        _ip("link", "set", self._link(i), "down")

    def kill(self, i: int) -> None:
        """SIGKILL every process on host i (its network stays: the kernel closes their connections, as when a
        machine's processes crash)."""
        pids = subprocess.run(["ip", "netns", "pids", self.name(i)], capture_output=True, text=True).stdout
        for pid in pids.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    def __enter__(self) -> NetnsHosts:
        try:
            for i in range(self.count):
                self._make(i)
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.remove()

    def _make(self, i: int) -> None:
        ns, here, there = self.name(i), self._link(i), f"{self.tag}b{i}"
        _ip("netns", "add", ns)
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", f"{self.gateway(i)}/30", "dev", here)
        _ip("link", "set", here, "up")
        inside = ["-n", ns]
        _ip(*inside, "addr", "add", f"{self.address(i)}/30", "dev", there)
        _ip(*inside, "link", "set", there, "up")
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "route", "add", "default", "via", self.gateway(i))

    def remove(self) -> None:
        """Kill what runs in the namespaces, then remove the links and the namespaces (each step tolerates what is
        already gone)."""
        for i in range(self.count):
            self.kill(i)
            _ip("link", "del", self._link(i), check=False)
            _ip("netns", "del", self.name(i), check=False)

    def _link(self, i: int) -> str:
        return f"{self.tag}a{i}"

    def _free_third_octet(self) -> int:
        """A third octet no address on this machine uses yet (another run's hosts, say), starting from the pid's."""
        used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
        start = os.getpid() % 250
        for step in range(250):
            third = (start + step) % 250 + 1
            if f" {SUBNET}.{third}." not in used:
                return third
        raise RuntimeError(f"every {SUBNET}.N.0/24 is in use here")


def _ip(*args: str, check: bool = True) -> int:
    """Run `ip ARGS`; a failure raises (with `check`) naming the command and its error."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.returncode
