"""A testbed of hosts in Linux network namespaces, each running its own broker.

    hub namespace: a bridge
    host namespaces h1..hN: eth0 (a veth into the bridge), 10.231.0.<i>/24

or several subnets (``Testbed([2, 2], ...)``): a bridge br<k> each in the hub, hosts
10.231.<k>.<i>/24 (i numbered across subnets), and a router namespace with a leg
10.231.<k>.254 in each, forwarding IP between them (the hosts' default route) and no
multicast: zeroconf finds only the brokers of one's own subnet.

Everything lives in namespaces made here: nothing is sent on the machine's own interfaces, and
mDNS stays on the bridge. Abstract ipc sockets are per network namespace, so each host runs a
broker named ``local`` and its clients find it as on a real host. Needs root and iproute2.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

SUBNET = "10.231.0"
PEER_PORT = 5670


def available() -> str | None:
    """Why namespaces cannot be used here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    probe = f"zbprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class Host:
    def __init__(self, bed: Testbed, index: int, subnet: int = 0) -> None:
        self.bed = bed
        self.index = index
        self.subnet = subnet
        self.name = f"h{index}"
        self.ns = f"{bed.prefix}{self.name}"
        self.address = f"{SUBNET.rpartition('.')[0]}.{subnet}.{index}"
        self.endpoint = f"tcp://{self.address}:{PEER_PORT}"
        self.broker: subprocess.Popen | None = None
        self.dir = bed.dir / self.name
        self.dir.mkdir()
        self.log_path = self.dir / "broker.log"

    # --- processes in this host ------------------------------------------------------------

    def command(self, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *args]

    def popen(self, args: Sequence[str], **kw: Any) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1", XDG_CONFIG_HOME=str(self.dir / "config"),
                   XDG_STATE_HOME=str(self.dir / "state"))
        proc = subprocess.Popen(self.command(args), env=env, **kw)
        self.bed.procs.append(proc)
        return proc

    def zpipes(self, *args: str, **kw: Any) -> subprocess.Popen:
        return self.popen([sys.executable, "-m", "zpipes", *args], **kw)

    def python(self, code: str, *args: str, **kw: Any) -> subprocess.Popen:
        return self.popen([sys.executable, "-c", code, *args], **kw)

    def start_broker(self, config: dict[str, Any] | None = None, wait: bool = True) -> None:
        cfg = {
            "log": {"format": "json", "file": str(self.log_path), "level": "info"},
            "broker": {"run_dir": str(self.dir / "run")},
            # no key by default: the tests that are about keys say so (and the cluster's
            # own traffic stays as cheap as can be for the others)
            "cluster": {"enabled": True, "bind": f"tcp://*:{PEER_PORT}", "peer_timeout": 2,
                        "insecure": True},
        }
        for section, values in (config or {}).items():
            cfg.setdefault(section, {}).update(values)
        path = self.dir / "zbroker.cfg"
        path.write_text(yaml.safe_dump(cfg))
        self.broker = self.popen([sys.executable, "-m", "zbroker", "local", "-c", str(path)],
                                 stderr=open(self.dir / "broker.stderr", "ab"))
        if wait:
            self.wait_for_log("broker started", timeout=15)

    def zbroker(self, *args: str) -> str:
        """Run a management command on this host's broker; its standard output."""
        proc = self.popen([sys.executable, "-m", "zbroker", *args, "--run-dir",
                           str(self.dir / "run")], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
        return proc.communicate(timeout=30)[0].decode(errors="replace")

    def kill_broker(self, sig: int = signal.SIGKILL) -> None:
        if self.broker is not None and self.broker.poll() is None:
            self.broker.send_signal(sig)
            self.broker.wait(10)

    # --- what the broker said ------------------------------------------------------------------

    def log_events(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        return events

    def wait_for_log(self, event: str, timeout: float, count: int = 1, **fields: Any) -> None:
        def matches() -> int:
            return sum(1 for e in self.log_events() if e.get("event") == event
                       and all(e.get(k) == v for k, v in fields.items()))

        deadline = time.monotonic() + timeout
        while matches() < count:
            if self.broker is not None and self.broker.poll() is not None:
                raise AssertionError(f"{self.name}: broker exited ({self.broker.returncode}):\n"
                                     + (self.dir / "broker.stderr").read_text()[-2000:])
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {count} x {event!r} {fields} within "
                                     f"{timeout} s; log tail:\n" + self.log_tail())
            time.sleep(0.05)

    def wait_findable(self, pipe: str, role: str, timeout: float, count: int = 1) -> None:
        """Until an end of ``pipe`` opened on this host now would find ``count`` ends of it in
        ``role`` on other hosts: this host's broker knows of them ("remote end attached", what a
        broker that tells every peer of every end does), or they are registered with the pipe's
        home, whichever host that is (the pipe directory: the home introduces them to this
        host's broker when it opens an end of the pipe)."""
        def found() -> bool:
            attached = sum(1 for e in self.log_events() if e.get("event") == "remote end attached"
                           and e.get("pipe") == pipe and e.get("role") == role)
            registered = sum(1 for host in self.bed.hosts for e in host.log_events()
                             if e.get("event") == "pipe end registered"
                             and e.get("pipe") == pipe and e.get("role") == role)
            return max(attached, registered) >= count

        deadline = time.monotonic() + timeout
        while not found():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {count} {role}(s) of {pipe!r} not findable "
                                     f"within {timeout} s; log tail:\n" + self.log_tail())
            time.sleep(0.05)

    def peers(self) -> set[str]:
        """Endpoints of the peers this host's broker has now (from its join/leave log lines;
        every host's broker is named "local")."""
        up: dict[str, str] = {}
        for e in self.log_events():
            if e.get("event") == "peer joined":
                up[e["id"]] = e["endpoint"]
            elif e.get("event") == "peer left":
                up.pop(e["id"], None)
        return set(up.values())

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    # --- the network ---------------------------------------------------------------------------

    def link(self, up: bool) -> None:
        """Cut this host off the network, or bring it back."""
        _ip("-n", self.bed.hub, "link", "set", self.bed.port(self), "up" if up else "down")

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.broker_pid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def broker_pid(self) -> int:
        """The broker's own pid (``ip netns exec`` execs it, so it is the Popen's)."""
        return self.broker.pid

    def zmq_sockets(self) -> int:
        """ZeroMQ sockets of the broker: each has one eventfd (its mailbox)."""
        fds = f"/proc/{self.broker_pid()}/fd"
        count = 0
        for fd in os.listdir(fds):
            try:
                count += os.readlink(f"{fds}/{fd}") == "anon_inode:[eventfd]"
            except OSError:
                pass
        return count


class Testbed:
    def __init__(self, hosts: int | Sequence[int], base: Path) -> None:
        """``hosts``: how many, on one bridge; or how many in each subnet, with a router."""
        self.prefix = f"zb{uuid.uuid4().hex[:6]}"
        self.hub = f"{self.prefix}hub"
        self.router: str | None = None
        self.dir = base
        self.procs: list[subprocess.Popen] = []
        self.hosts: list[Host] = []
        counts = [hosts] if isinstance(hosts, int) else list(hosts)
        _ip("netns", "add", self.hub)
        try:
            for subnet in range(len(counts)):
                _ip("-n", self.hub, "link", "add", f"br{subnet}", "type", "bridge")
                _ip("-n", self.hub, "link", "set", f"br{subnet}", "up")
            if len(counts) > 1:
                self._add_router(len(counts))
            index = 0
            for subnet, count in enumerate(counts):
                for _ in range(count):
                    index += 1
                    self.add_host(index, subnet)
        except BaseException:
            self.close()
            raise

    def port(self, host: Host) -> str:
        return f"p{host.index}"

    def gateway(self, subnet: int) -> str:
        return f"{SUBNET.rpartition('.')[0]}.{subnet}.254"

    def _add_router(self, subnets: int) -> None:
        self.router = f"{self.prefix}rt"
        _ip("netns", "add", self.router)
        _ip("-n", self.router, "link", "set", "lo", "up")
        for subnet in range(subnets):
            _ip("-n", self.router, "link", "add", f"leg{subnet}", "type", "veth", "peer",
                "name", f"r{subnet}", "netns", self.hub)
            _ip("-n", self.hub, "link", "set", f"r{subnet}", "master", f"br{subnet}")
            _ip("-n", self.hub, "link", "set", f"r{subnet}", "up")
            _ip("-n", self.router, "addr", "add", f"{self.gateway(subnet)}/24", "dev",
                f"leg{subnet}")
            _ip("-n", self.router, "link", "set", f"leg{subnet}", "up")
        r = subprocess.run(["ip", "netns", "exec", self.router, "sysctl", "-qw",
                            "net.ipv4.ip_forward=1"], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"cannot make the router forward: {r.stderr.strip()}")

    def router_link(self, subnet: int, up: bool) -> None:
        """Cut ``subnet`` off the router (a partition between subnets), or bring it back."""
        _ip("-n", self.hub, "link", "set", f"r{subnet}", "up" if up else "down")

    def add_host(self, index: int, subnet: int = 0) -> Host:
        host = Host(self, index, subnet)
        _ip("netns", "add", host.ns)
        self.hosts.append(host)
        _ip("-n", host.ns, "link", "set", "lo", "up")
        _ip("-n", host.ns, "link", "add", "eth0", "type", "veth", "peer", "name",
            self.port(host), "netns", self.hub)
        _ip("-n", self.hub, "link", "set", self.port(host), "master", f"br{subnet}")
        _ip("-n", self.hub, "link", "set", self.port(host), "up")
        _ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        if self.router is not None:
            _ip("-n", host.ns, "route", "add", "default", "via", self.gateway(subnet))
        return host

    def wait_for_cluster(self, hosts: list[Host] | None = None, timeout: float = 20.0) -> None:
        """Until every broker of ``hosts`` (default: all) has all the others as peers."""
        hosts = self.hosts if hosts is None else hosts
        endpoints = {h.endpoint for h in hosts}
        deadline = time.monotonic() + timeout
        while True:
            missing = {h.name: sorted(endpoints - {h.endpoint} - h.peers()) for h in hosts}
            if not any(missing.values()):
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {h.name}\n{h.log_tail()}" for h in hosts)
                raise AssertionError(f"cluster did not form: missing {missing}\n{tails}")
            time.sleep(0.1)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.ns], capture_output=True)
        if self.router is not None:
            subprocess.run(["ip", "netns", "del", self.router], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.hub], capture_output=True)
