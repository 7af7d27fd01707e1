"""A multi-host test bed on one machine: each "host" is a Linux network namespace.

Hosts hang off one bridge through veth pairs, with addresses in the benchmarking range
198.18.0.0/15 (never routed on the Internet). A host runs real processes (``Host.popen``: a
``dask scheduler``, stock ``dask worker`` processes, moto's S3 server, a driver), and a
partition is a host's link taken down (``Testbed.partition``), healed by bringing it up: what a
cut-off VM looks like from both sides, without ``tc netem``. Needs root and ``ip``;
``unavailable()`` says why not, so tests can skip with that reason (and CI can refuse to).

    with Testbed() as bed:
        store = bed.host("store")
        proc = store.popen([sys.executable, "-m", "http.server", "--bind", store.ip, "8000"])
        bed.partition("store"); ...; bed.heal("store")
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

NETWORK = ipaddress.ip_network("198.18.0.0/15")   # RFC 2544 benchmarking addresses
_PREFIX = 24


class TestbedError(RuntimeError):
    """The test bed could not be built (the message says which command and why)."""


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or in CI, which is)"
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    probe = f"sl-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Host:
    """One namespace: its name, address and the processes started in it."""

    name: str
    netns: str
    ip: str
    link: str                       # the bridge-side end of its veth pair
    procs: list[subprocess.Popen] = field(default_factory=list)

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside this host (its own session, so close() stops its children)."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], **kwargs)


class Testbed:
    """Namespaces on one bridge; ``close()`` (or ``with``) removes everything it made."""

    __test__ = False   # not a pytest test class

    def __init__(self) -> None:
        reason = unavailable()
        if reason:
            raise TestbedError(f"cannot build a multi-host test bed: {reason}")
        self.tag = uuid.uuid4().hex[:5]
        self.bridge = f"slbr{self.tag}"
        self.subnet = _free_subnet()
        self.hosts: dict[str, Host] = {}
        self._addresses = self.subnet.hosts()
        self.gateway = str(next(self._addresses))
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{_PREFIX}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def host(self, name: str) -> Host:
        """The host called ``name``, made on first use."""
        if name in self.hosts:
            return self.hosts[name]
        index = len(self.hosts)
        netns, inside, outside = (f"sl{self.tag}-{name}", f"sli{self.tag}{index}",
                                  f"slo{self.tag}{index}")
        address = str(next(self._addresses))
        _ip("netns", "add", netns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", netns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        for args in (("addr", "add", f"{address}/{_PREFIX}", "dev", inside),
                     ("link", "set", inside, "up"), ("link", "set", "lo", "up")):
            _ip("-n", netns, *args)
        self.hosts[name] = Host(name, netns, address, outside)
        return self.hosts[name]

    def partition(self, name: str) -> None:
        """Cut ``name`` off from every other host (its processes keep running)."""
        _ip("link", "set", self.hosts[name].link, "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].link, "up")

    def close(self) -> None:
        for host in self.hosts.values():
            for proc in host.procs:
                kill(proc)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", host.link], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.hosts.clear()

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise TestbedError(f"'ip {' '.join(args)}' failed: {done.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 198.18.0.0/15 that no interface here uses (two test beds may run at once)."""
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    used = {ipaddress.ip_interface(word).network for line in shown.stdout.splitlines()
            for word in line.split() if "/" in word and word[0].isdigit()}
    for subnet in NETWORK.subnets(new_prefix=_PREFIX):
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise TestbedError(f"every /{_PREFIX} of {NETWORK} is in use here")


def session_pids(leader: int) -> list[int]:
    """The processes of the session ``leader`` started (a host's process and its children)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:   # it ended meanwhile
                continue
            if int(fields[3]) == leader:   # the stat's 6th field: the session id
                out.append(int(entry.name))
    return sorted(out)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL a process a host started, with its children (its session), and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
