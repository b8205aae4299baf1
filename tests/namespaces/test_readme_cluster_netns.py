"""README.md's "A cluster", run as written on two hosts: network namespaces in two subnets
joined by a router that forwards no multicast (so zeroconf cannot link them: the join file's
seed must), each host with its own home, run directory and no config file, as two fresh
machines. The blocks marked ``sh host-a`` and ``sh host-b`` run in order, each with bash on
its host; the one step the README leaves to the user, copying the join file, is done as it
says, from the path the first broker printed. A line ``# prints: TEXT`` is what its command
must print.

And the key a reload applies: two brokers whose keys differ are refused until one gets the
other's key file and is reloaded (no restart); a new ``cluster.key_file`` on one ends its
links, and they link again once the other has it too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import netns
import pytest
from helpers import REPO_ROOT

why_not = netns.available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))

FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
WAIT = 30.0


def readme_cluster_blocks() -> list[tuple[str, str]]:
    """(host, code) of the README's "A cluster" section's blocks marked ``sh host-X``."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## A cluster\n")
    section = text[start:text.index("\n## ", start + 1)]
    return [(m.group("info").split()[1], m.group("body")) for m in FENCE.finditer(section)
            if m.group("info").split()[:1] == ["sh"] and len(m.group("info").split()) == 2
            and m.group("info").split()[1].startswith("host-")]


class FreshHost:
    """A namespace host as a fresh machine: its own home (so ~/.config), run directory and
    working folder, the venv's commands on PATH, no config file."""

    def __init__(self, host: netns.Host) -> None:
        self.host = host
        self.home = host.dir / "home"
        self.home.mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "ZPIPES_BROKER",
                                 "ZPIPES_PROGRESS")}
        self.env.update(
            HOME=str(self.home), XDG_RUNTIME_DIR=str(host.dir / "run"),
            PYTHONUNBUFFERED="1",
            PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                     os.environ.get("PYTHONPATH")])))
        (host.dir / "run").mkdir(mode=0o700)
        self.procs: list[subprocess.Popen[str]] = []

    def bash(self, code: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(self.host.command(["bash", "-e", "-o", "pipefail", "-c", code]),
                                cwd=self.home, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def zbroker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.host.command([sys.executable, "-m", "zbroker", *args]),
                              cwd=self.home, env=self.env, capture_output=True, text=True,
                              timeout=WAIT)

    def peers(self) -> list[dict]:
        r = self.zbroker("status", "--json")
        if r.returncode != 0:
            return []
        return (json.loads(r.stdout).get("cluster") or {}).get("peers") or []

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def read_until(proc: subprocess.Popen[str], pattern: str, timeout: float) -> str:
    """What ``proc`` printed on standard output up to a line that matches ``pattern``."""
    import selectors

    seen = ""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while not re.search(pattern, seen):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {pattern!r} on standard output (exit "
                                 f"{proc.poll()}):\n{seen}\nstderr:\n"
                                 f"{proc.stderr.read() if proc.poll() is not None else ''}")
        if sel.select(0.2):  # (unbuffered: a buffered read would hide the rest from select)
            seen += os.read(proc.stdout.fileno(), 65536).decode(errors="replace")
    return seen


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


@pytest.fixture
def two_subnets(tmp_path):
    bed = netns.Testbed([1, 1], tmp_path)
    hosts = [FreshHost(h) for h in bed.hosts]
    yield hosts
    for host in hosts:
        host.stop()
    bed.close()


def test_the_readme_two_host_section_runs_as_written(two_subnets):
    a, b = two_subnets
    blocks = readme_cluster_blocks()
    assert [host for host, _ in blocks] == ["host-a", "host-b", "host-b", "host-a"], blocks
    hosts = {"host-a": a, "host-b": b}
    (_, start_a), (_, join_b), (_, read_b), (_, write_a) = blocks

    # host A: one command; it prints what to run on the others
    broker_a = a.bash(start_a)
    said = read_until(broker_a, r"--join-file \S+", WAIT)
    m = re.search(r"copy (\S+) to it .*\n\s*(zbroker .*--join-file (\S+))", said)
    assert m, said
    join_file, command, name = Path(m.group(1)), m.group(2).strip(), m.group(3)
    assert join_file == a.home / ".config" / "zbroker" / name
    assert command in join_b, (command, join_b)  # the README shows what the broker prints
    key_a = a.home / ".config" / "zbroker" / "cluster-default.key"
    for path in (join_file, key_a):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    from zbroker.cluster.joining import read_token

    assert read_token(file=str(join_file)).seeds == (f"tcp://{a.host.address}:5670",)
    # the user copies the join file to host B (scp ...: here a copy into B's home)
    shutil.copy(join_file, b.home / name)

    # host B: one command; it joins across the router (no zeroconf between the subnets)
    broker_b = b.bash(join_b)
    wait_until(lambda: len(a.peers()) == 1 and len(b.peers()) == 1, WAIT,
               "the two brokers linked")
    key_b = b.home / ".config" / "zbroker" / "cluster-default.key"
    assert key_b.read_bytes() == key_a.read_bytes()
    assert stat.S_IMODE(key_b.stat().st_mode) == 0o600
    assert a.peers()[0]["endpoint"] == f"tcp://{b.host.address}:5670"
    # B's own join file names B, then the member it joined through (written again once
    # that member is a peer)
    wait_until(lambda: read_token(file=str(b.home / ".config" / "zbroker" / name)).seeds == (
        f"tcp://{b.host.address}:5670", f"tcp://{a.host.address}:5670"), WAIT,
        "B's join file naming its peer")

    # a pipe written on A is read on B
    reader = hosts["host-b"].bash(read_b)
    writer = hosts["host-a"].bash(write_a)
    out, err = writer.communicate(timeout=WAIT)
    assert writer.returncode == 0, err
    out, err = reader.communicate(timeout=WAIT)
    assert reader.returncode == 0, err
    for block, printed in ((read_b, out),):
        for wanted in re.findall(r"# prints: (.*)", block):
            assert printed.strip() == wanted.strip(), (printed, wanted)
    assert "Traceback" not in err
    assert broker_a.poll() is None and broker_b.poll() is None

    # and the join line again, from a running member
    r = a.zbroker("join-token")
    assert r.returncode == 0 and f"--join-file {name}" in r.stdout, r.stderr
    r = a.zbroker("join-token", "--token")
    assert r.returncode == 0 and r.stdout.startswith("zbjoin1.")
    assert r.stdout.strip() in join_file.read_text()

    # both hosts restarted with the plain command a service unit runs (no --cluster, no join
    # file): each rejoins from what it remembers, across the router (no zeroconf between
    # them). Before, both came back standalone, the key installed, without a word
    for host in (a, b):
        host.stop()
        host.procs.clear()
    again = [host.bash("exec zbroker local") for host in (a, b)]
    wait_until(lambda: len(a.peers()) == 1 and len(b.peers()) == 1, WAIT,
               "the two brokers linked again after their restarts")
    assert all(proc.poll() is None for proc in again)


# --- reload applies a new cluster key --------------------------------------------------------


def reload(host: netns.Host) -> str:
    out = host.zbroker("reload")
    assert out.startswith("reloaded "), out
    return out


def keyed_config(**cluster) -> dict:
    # keyed (the testbed's default is no key), zeroconf on: they find each other on the
    # bridge, only the key admits them
    return {"cluster": {"insecure": False, **cluster}}


def test_reload_applies_a_new_key_and_relinks(tmp_path):
    bed = netns.Testbed(2, tmp_path)
    try:
        a, b = bed.hosts
        a.start_broker(keyed_config())
        b.start_broker(keyed_config())
        key_a = a.dir / "config" / "zbroker" / "cluster-default.key"
        key_b = b.dir / "config" / "zbroker" / "cluster-default.key"
        assert key_a.read_bytes() != key_b.read_bytes()  # each made its own
        wait_until(lambda: refused(a) > 0 and refused(b) > 0, WAIT, "each refuses the other")
        assert a.peers() == set() and b.peers() == set()

        # the case: A's key copied over B's, then a reload, no restart
        key_b.write_bytes(key_a.read_bytes())
        out = reload(b)
        assert "no setting changed, but the cluster key in its file did: the peers are " \
               "linked anew" in out
        b.wait_for_log("config reloaded", timeout=5, cluster_key="changed: the peers are "
                                                                  "linked anew")
        bed.wait_for_cluster([a, b], timeout=WAIT)
        line_crosses(a, b, "after-copy", b"linked by a reload\n")

        # a new key named in cluster.key_file: A's reload ends its links; B (old key) is
        # refused until it has the same
        new_key = tmp_path / "rotated.key"
        subprocess.run([sys.executable, "-m", "zbroker", "keygen", str(new_key)], check=True,
                       capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
        left_before = len([e for e in b.log_events() if e.get("event") == "peer left"])
        set_key_file(a, new_key)
        out = reload(a)
        assert "changed cluster.key_file; the cluster key changed" in out, out
        b.wait_for_log("peer left", timeout=10, count=left_before + 1)
        left = [e for e in b.log_events() if e.get("event") == "peer left"][-1]
        assert "the cluster key changed" in left["why"], left
        time.sleep(2 * 2.0)  # two peer timeouts: B keeps knocking with the old key
        assert a.peers() == set() and b.peers() == set()
        set_key_file(b, new_key)
        reload(b)
        bed.wait_for_cluster([a, b], timeout=WAIT)
        line_crosses(b, a, "after-rotation", b"linked again with the new key\n")
        status = a.zbroker("status")
        assert f"key {new_key}" in status, status

        # what a reload cannot apply is named, and the running value stays
        set_key_file(a, new_key, bind="tcp://*:5671")
        out = reload(a)
        assert "nothing applied now" in out and "restart needed for: cluster.bind" in out, out
        a.wait_for_log("restart needed for: cluster.bind", timeout=5)
        assert a.zbroker("get", "cluster.bind").strip() == "tcp://*:5670"
        assert a.peers() == {b.endpoint}
    finally:
        bed.close()


def refused(host: netns.Host) -> int:
    """Handshakes the host's broker refused (its status)."""
    status = json.loads(host.zbroker("status", "--json"))
    return int((status.get("cluster") or {}).get("refused") or 0)


def set_key_file(host: netns.Host, key: Path, **cluster) -> None:
    """Rewrite the host's config with cluster.key_file ``key`` (and ``cluster``)."""
    import yaml

    path = host.dir / "zbroker.cfg"
    cfg = yaml.safe_load(path.read_text())
    cfg["cluster"].update(key_file=str(key), **cluster)
    path.write_text(yaml.safe_dump(cfg))


def line_crosses(a, b, pipe, line):
    """A reader on ``b``, then a writer on ``a`` once ``a`` can find it: ``line`` arrives."""
    r = b.zpipes("read", pipe, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    a.wait_findable(pipe, "reader", timeout=10)
    w = a.zpipes("write", pipe, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    w.stdin.write(line)
    w.stdin.close()
    assert r.communicate(timeout=30)[0] == line
    assert w.wait(30) == 0
