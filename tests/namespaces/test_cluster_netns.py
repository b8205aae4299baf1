"""The cluster on a multi-host testbed: brokers in network namespaces that find each other with
zeroconf, and pipes that cross hosts (see netns.py)."""

from __future__ import annotations

import hashlib
import json
import os
import select
import socket
import subprocess
import threading
import time

import netns
import pytest
from helpers import wait_for, wait_steady

why_not = netns.available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))

PEER_TIMEOUT = 2.0


@pytest.fixture
def testbed(tmp_path):
    made = []

    def make(hosts=3, start=True, config=None):
        bed = netns.Testbed(hosts, tmp_path)
        made.append(bed)
        if start:
            # all at once, as hosts booting together would (each broker's zeroconf
            # registration takes over a second: one after the other, that adds up)
            for host in bed.hosts:
                host.start_broker(config, wait=False)
            for host in bed.hosts:
                host.wait_for_log("broker started", timeout=15)
            wait_for_cluster(bed.hosts)
        return bed

    yield make
    for bed in made:
        bed.close()


def wait_for_cluster(hosts, timeout=20.0):
    hosts[0].bed.wait_for_cluster(hosts, timeout)


def reader(host, pipe, **kw):
    return host.zpipes("read", pipe, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def writer(host, pipe, **kw):
    return host.zpipes("write", pipe, stdin=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def wait_attached(host, pipe, role, count=1, timeout=10.0):
    """Until an end opened on ``host`` would find ``count`` remote ends of ``pipe`` in
    ``role`` (its broker knows of them, or they are registered with the pipe's home)."""
    host.wait_findable(pipe, role, timeout, count=count)


def wait_logged(host, event, pipe, role, count=1, timeout=10.0):
    """Until ``host``'s broker has logged ``event`` for ``count`` ends of ``pipe`` in
    ``role`` ("pipe opened": by its clients; "remote end attached": of other hosts)."""
    deadline = time.monotonic() + timeout
    while sum(1 for e in host.log_events() if e.get("event") == event
              and e.get("pipe") == pipe and e.get("role") == role) < count:
        assert time.monotonic() < deadline, f"not {count} x {event} {role} {pipe!r} on {host.name}"
        time.sleep(0.05)


def line_crosses(a, b, pipe, line):
    """A reader on ``b``, then a writer on ``a`` once ``a`` knows of it: ``line`` arrives."""
    r = reader(b, pipe)
    wait_attached(a, pipe, "reader")
    w = writer(a, pipe)
    w.stdin.write(line)
    w.stdin.close()
    assert r.communicate(timeout=30)[0] == line
    assert w.wait(30) == 0


def test_brokers_find_each_other_with_zeroconf(testbed):
    bed = testbed(3)
    for host in bed.hosts:
        assert host.peers() == {h.endpoint for h in bed.hosts} - {host.endpoint}
    joined = [e for e in bed.hosts[0].log_events() if e.get("event") == "peer joined"]
    assert {e["endpoint"] for e in joined} == {h.endpoint for h in bed.hosts[1:]}


@pytest.mark.parametrize("reader_first", [True, False], ids=["reader-first", "writer-first"])
def test_writer_on_a_reader_on_b(testbed, reader_first):
    a, b, _ = testbed(3).hosts
    data = os.urandom(3 << 20)
    if reader_first:
        r = reader(b, "ab")
        wait_attached(a, "ab", "reader")
        w = writer(a, "ab")
    else:
        w = writer(a, "ab")
        wait_attached(b, "ab", "writer")
        r = reader(b, "ab")
    w.stdin.write(data)
    w.stdin.close()
    out, err = r.communicate(timeout=30)
    assert w.wait(30) == 0, w.stderr.read()
    assert r.returncode == 0, err
    assert out == data


def test_fan_out_to_readers_on_two_hosts(testbed):
    a, b, c = testbed(3).hosts
    rb, rc = reader(b, "fan"), reader(c, "fan")
    wait_attached(a, "fan", "reader", count=2)
    w = writer(a, "fan")
    data = os.urandom(1 << 20)
    w.stdin.write(data)
    w.stdin.close()
    assert w.wait(30) == 0
    assert rb.communicate(timeout=30)[0] == data
    assert rc.communicate(timeout=30)[0] == data


def link_counts(host):
    """What the host's broker says crossed its links: DATA messages and bytes, CREDITs."""
    return json.loads(host.zbroker("status", "--json"))["services"]["zpipes"]["link"]


def test_fan_out_to_two_readers_on_one_host_crosses_the_link_once(testbed):
    a, b, _ = testbed(3).hosts
    readers = [b.popen(["sh", "-c", f"{netns.sys.executable} -m zpipes read fan2 | sha256sum"],
                       stdout=subprocess.PIPE) for _ in range(2)]
    wait_attached(a, "fan2", "reader", count=2)
    before_a, before_b = link_counts(a), link_counts(b)
    w = writer(a, "fan2")
    digest = hashlib.sha256()
    block = os.urandom(1 << 20)
    size = 0
    for i in range(64):
        chunk = block[i:] + block[:i]
        digest.update(chunk)
        w.stdin.write(chunk)
        size += len(chunk)
    w.stdin.close()
    assert w.wait(120) == 0
    for r in readers:
        assert r.communicate(timeout=120)[0].split()[0].decode() == digest.hexdigest()
    sent = link_counts(a)["data_bytes_sent"] - before_a["data_bytes_sent"]
    received = link_counts(b)["data_bytes_received"] - before_b["data_bytes_received"]
    assert sent == received == size  # once, not once per reader
    # the windows of its peers' readers are sized to the round trips its heartbeats measure
    deadline = time.monotonic() + 20
    while len(windows := link_counts(a)["windows"]) < 2:
        assert time.monotonic() < deadline, windows
        time.sleep(0.2)
    assert all(1 << 20 <= w <= 16 << 20 for w in windows.values()), windows


def test_a_reader_killed_beside_another_on_its_host_does_not_stall_it(testbed):
    """Two readers of one stream on host b: the slow one holds the writer back (its window
    is full) until it is killed; then the other gets the whole stream, and the writer ends."""
    a, b, _ = testbed(3).hosts
    fast = b.popen(["sh", "-c", f"{netns.sys.executable} -m zpipes read fan3 | sha256sum"],
                   stdout=subprocess.PIPE)
    slow = b.python("import sys, time, zpipes\n"
                    "with zpipes.open('fan3', 'r') as r:\n"
                    "    print(len(r.read1(1 << 16)), flush=True)\n"
                    "    time.sleep(600)\n", stdout=subprocess.PIPE)
    wait_attached(a, "fan3", "reader", count=2)
    w = writer(a, "fan3")
    digest = hashlib.sha256()
    block = os.urandom(1 << 20)
    chunks = [block[i:] + block[:i] for i in range(32)]
    for chunk in chunks:
        digest.update(chunk)

    def feed():
        for chunk in chunks:
            w.stdin.write(chunk)
        w.stdin.close()

    feeder = threading.Thread(target=feed)
    feeder.start()
    assert int(slow.stdout.readline()) > 0  # it took some, and takes no more
    time.sleep(1)  # the writer is held back by the slow reader's window
    slow.kill()
    feeder.join(120)
    assert w.wait(120) == 0, w.stderr.read()
    assert fast.communicate(timeout=120)[0].split()[0].decode() == digest.hexdigest()


def test_256mib_cross_host_sha256_agrees(testbed):
    a, b, _ = testbed(3).hosts
    r = b.popen(["sh", "-c", f"{netns.sys.executable} -m zpipes read big | sha256sum"],
                stdout=subprocess.PIPE)
    wait_attached(a, "big", "reader")
    w = writer(a, "big")
    digest = hashlib.sha256()
    block = os.urandom(1 << 20)
    for i in range(256):
        chunk = block[i:] + block[:i]
        digest.update(chunk)
        w.stdin.write(chunk)
    w.stdin.close()
    assert w.wait(120) == 0
    assert r.communicate(timeout=120)[0].split()[0].decode() == digest.hexdigest()


def test_sigkill_of_the_writers_broker_fails_the_reader(testbed):
    """Defect 7: a vanished peer is noticed and its pipes fail; nothing pretends to work."""
    a, b, _ = testbed(3).hosts
    r = reader(b, "doomed")
    wait_attached(a, "doomed", "reader")
    w = writer(a, "doomed")
    w.stdin.write(b"some data\n")
    w.stdin.flush()
    assert r.stdout.readline() == b"some data\n"
    killed = time.monotonic()
    a.kill_broker()
    assert r.wait(PEER_TIMEOUT + 5) == 1
    took = time.monotonic() - killed
    # which broker: every host's is named "local", so its host's name and address are said
    said = r.stderr.read().decode()
    assert f"writer lost: peer lost: broker local@{socket.gethostname()} ({a.address})" \
        in said, said
    assert took < PEER_TIMEOUT + 1.0, took
    w.kill()


def test_reader_host_cut_off_fails_the_writer_and_heals(testbed):
    a, b, c = testbed(3).hosts
    r = reader(b, "cut")
    wait_attached(a, "cut", "reader")
    w = writer(a, "cut")
    w.stdin.write(b"before\n")
    w.stdin.flush()
    assert r.stdout.readline() == b"before\n"
    b.link(up=False)
    cut = time.monotonic()
    a.wait_for_log("peer left", timeout=PEER_TIMEOUT + 3)
    assert time.monotonic() - cut < PEER_TIMEOUT + 1.0
    try:
        w.stdin.write(b"after\n")
        w.stdin.flush()
        w.stdin.close()
    except BrokenPipeError:
        pass
    assert w.wait(10) == 1
    assert "peer lost" in w.stderr.read().decode()
    b.link(up=True)
    wait_for_cluster([a, b, c])
    # A link that comes back may flap once more (a send refused while it is made again ends
    # the peer's life on both sides): a pipe caught in that moment fails and says so, one
    # opened after works; a writer is never told OK for data its reader did not get.
    r2 = None
    for _ in range(3):
        if r2 is None or r2.poll() is not None:
            if r2 is not None:
                assert "peer lost" in r2.stderr.read().decode()
            r2 = reader(b, "healed")
        wait_attached(a, "healed", "reader")
        w2 = writer(a, "healed")
        w2.stdin.write(b"works again\n")
        w2.stdin.close()
        if w2.wait(30) == 0:
            break
        assert "peer lost" in w2.stderr.read().decode()
    else:
        raise AssertionError("no pipe worked in three tries after the heal")
    assert r2.communicate(timeout=30)[0] == b"works again\n"
    r.kill()


def test_broker_joining_late_finds_a_pipe_opened_before(testbed):
    """Defect 8 and seed "sometimes reader and writer pipes don't connect"."""
    bed = testbed(2, start=False)
    a, b = bed.hosts
    a.start_broker()
    w = writer(a, "early")
    w.stdin.write(b"waited for you\n")
    w.stdin.close()
    # the writer's pipe exists before b's broker does
    wait_logged(a, "pipe opened", "early", "writer")
    b.start_broker()
    wait_for_cluster([a, b])
    r = reader(b, "early")
    assert r.communicate(timeout=30)[0] == b"waited for you\n"
    assert w.wait(30) == 0


def test_static_peers_without_discovery(testbed):
    bed = testbed(2, start=False)
    a, b = bed.hosts
    a.start_broker({"cluster": {"discovery": False, "peers": [b.endpoint]}})
    b.start_broker({"cluster": {"discovery": False, "peers": [a.endpoint]}})
    wait_for_cluster([a, b])
    line_crosses(a, b, "static", b"no multicast needed\n")


def test_other_cluster_names_do_not_pair(testbed):
    bed = testbed(2, start=False)
    a, b = bed.hosts
    a.start_broker({"cluster": {"name": "blue"}})
    b.start_broker({"cluster": {"name": "green"}})
    time.sleep(3)  # a window in which they would have paired: they do not
    assert a.peers() == set() and b.peers() == set()


def test_slow_remote_reader_keeps_both_brokers_flat(testbed):
    a, b, _ = testbed(3).hosts
    code = (
        "import sys, time, zpipes\n"
        "n = 0\n"
        "with zpipes.open('slow', 'r') as r:\n"
        "    while True:\n"
        "        d = r.read1(256 << 10)\n"
        "        if not d: break\n"
        "        n += len(d)\n"
        "        time.sleep(0.002)\n"
        "print(n)\n"
    )
    r = b.python(code, stdout=subprocess.PIPE)
    wait_attached(a, "slow", "reader")
    base = a.rss_bytes(), b.rss_bytes()
    peak = list(base)
    w = writer(a, "slow")
    block = os.urandom(1 << 20)
    for i in range(256):
        w.stdin.write(block)
        if i % 16 == 0:
            peak = [max(peak[0], a.rss_bytes()), max(peak[1], b.rss_bytes())]
    w.stdin.close()
    assert w.wait(120) == 0
    assert int(r.communicate(timeout=120)[0]) == 256 << 20
    growth = [(p - q) >> 20 for p, q in zip(peak, base, strict=True)]
    assert max(growth) < 64, f"RSS growth of the brokers in MiB: {growth}"


def keyed_pair_and_a_third(testbed, tmp_path, third_key):
    """Brokers a and b share a cluster key; c, with no key (``third_key`` None) or a key of its
    own, names a and b as static peers."""
    from zbroker.cluster.security import generate_key_file

    key = tmp_path / "cluster.key"
    generate_key_file(key)
    bed = testbed(3, start=False)
    a, b, c = bed.hosts
    keyed = {"cluster": {"key_file": str(key), "discovery": False,
                         "peers": [a.endpoint, b.endpoint]}}
    a.start_broker(keyed)
    b.start_broker(keyed)
    third = {"discovery": False, "peers": [a.endpoint, b.endpoint]}
    if third_key is not None:
        generate_key_file(tmp_path / third_key)
        third["key_file"] = str(tmp_path / third_key)
    c.start_broker({"cluster": third})
    return a, b, c


def test_curve_keyed_brokers_pair_and_a_keyless_one_is_refused(testbed, tmp_path):
    a, b, c = keyed_pair_and_a_third(testbed, tmp_path, third_key=None)
    wait_for_cluster([a, b])
    a.wait_for_log("cluster connection refused", timeout=10)
    time.sleep(1)  # a window in which c's further tries go on: none is let in
    assert c.peers() == set() and a.peers() == {b.endpoint}
    # traffic still flows between the keyed brokers, encrypted
    line_crosses(a, b, "secret", b"for key holders only\n")
    # and a keyless broker's pipe of the same name never meets them
    rc = reader(c, "secret")
    wait_logged(c, "pipe opened", "secret", "reader")
    time.sleep(0.5)  # a window in which a remote end would attach: none does
    assert not any(e.get("event") == "remote end attached" for e in c.log_events())
    rc.kill()


def test_a_broker_with_another_key_is_refused_in_a_few_log_lines(testbed, tmp_path):
    """A broker with another cluster's key reconnects again and again (several times a
    second); each refusal used to be a warning line. Now: one, naming it, then a count."""
    a, b, c = keyed_pair_and_a_third(testbed, tmp_path, third_key="other.key")
    wait_for_cluster([a, b])
    a.wait_for_log("cluster connection refused", timeout=10, peer=c.address,
                   why="another cluster key")
    line_crosses(a, b, "keyed", b"beside the refusals\n")
    # c knocks again and again meanwhile: counted, not logged
    wait_for(lambda: json.loads(a.zbroker("status", "--json"))["cluster"]["refused"] > 3, 15,
             "more refusals of c")
    refused = [e for e in a.log_events() if "refused" in e.get("event", "")]
    assert [(e["event"], e["peer"]) for e in refused] == [
        ("cluster connection refused", c.address)], refused
    assert json.loads(a.zbroker("status", "--json"))["cluster"]["refused"] > 3
    assert c.peers() == set() and a.peers() == {b.endpoint}


def test_cluster_simulation(testbed):
    """The seed's "full cluster test case": 5 brokers, random sessions, every byte checked.
    More brokers or time: ZBROKER_SIM_BROKERS / ZBROKER_SIM_SECONDS, or run netns_simulation.py."""
    from netns_simulation import simulate

    brokers = int(os.environ.get("ZBROKER_SIM_BROKERS", "5"))
    seconds = float(os.environ.get("ZBROKER_SIM_SECONDS", "25"))
    bed = testbed(brokers)
    report = simulate(bed.hosts, duration=seconds, seed=7)
    print(report.summary())
    assert report.failures == []
    assert report.sessions >= 5 and report.latencies_ms


def test_seed_bugs_multi_broker_sequences(testbed):
    """The original's multi-broker bug reports, replayed on real hosts:
    "segv on multi-broker" (writer on one broker, reader on another),
    "zpipes_client_new asserts on rapid open" (writer A, reader B, writer A in quick succession),
    "rapid writer opens asserts" (writer A, reader B, new writer B, write),
    "sometimes reader and writer pipes don't connect" (writer, sleep 1 s, reader elsewhere, write;
    here the reader comes once the writer's pipe is open).
    """
    a, b, _ = testbed(3).hosts
    # segv on multi-broker + rapid open: three opens in quick succession, nothing crashes
    w1 = writer(a, "seed")
    r = reader(b, "seed")
    w2 = writer(a, "seed")
    # rapid writer opens: a new writer on the reader's host writes too
    w3 = writer(b, "seed")
    wait_attached(b, "seed", "writer", count=2)
    # and every end open (the four processes may open in any order: one that opened after
    # the others had finished would find no stream to join), the reader known where the
    # writers of a are (so it is in their audience)
    wait_logged(a, "pipe opened", "seed", "writer", count=2)
    wait_logged(b, "pipe opened", "seed", "writer")
    wait_logged(b, "pipe opened", "seed", "reader")
    wait_logged(a, "remote end attached", "seed", "reader")
    for w, line in ((w1, b"w1\n"), (w2, b"w2\n"), (w3, b"w3\n")):
        w.stdin.write(line)
        w.stdin.close()
    for w in (w1, w2, w3):
        assert w.wait(30) == 0, w.stderr.read()
    out, err = r.communicate(timeout=30)
    assert r.returncode == 0, err
    # all-or-none per writer: every line that arrived is whole; the reader opened before any
    # writer wrote, so it gets all three
    assert sorted(out.splitlines()) == [b"w1", b"w2", b"w3"]
    # sometimes reader and writer pipes don't connect
    w = writer(a, "connect")
    wait_logged(a, "pipe opened", "connect", "writer")  # the writer's pipe is open first
    r = reader(b, "connect")
    w.stdin.write(b"connected\n")
    w.stdin.close()
    assert w.wait(30) == 0
    assert r.communicate(timeout=30)[0] == b"connected\n"
    assert a.broker.poll() is None and b.broker.poll() is None


HELLO_FLOOD = r"""
import json, sys, uuid
import zmq
from zbroker.cluster.membership import PROTOCOL_VERSION

target, me, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = zmq.Context()
# live ZMTP sockets that accept a broker's link but never answer it as a broker would
sinks = []
for k in range(10):
    s = ctx.socket(zmq.ROUTER)
    s.bind(f"tcp://{me}:{7000 + k}")
    sinks.append(s)
odd = ["tcp://nonsense", f"tcp://{me}:notaport", "tcp://*:abc", "inproc://zeromq.zap.01",
       "ipc://@/zpipes/local", "udp://10.231.0.3:1", "tcp://", "x" * 5000]


def endpoint(i):
    if i % 10 == 0:
        return odd[(i // 10) % len(odd)]
    if i % 10 == 1:
        return f"tcp://{me}:{7000 + i % 10}" if i < 20 else f"tcp://{me}:{7000 + (i // 10) % 10}"
    if i % 3 == 0:
        return f"tcp://10.231.0.{100 + i % 150}:5670"  # no such host
    return f"tcp://{me}:{20000 + i}"  # nothing listens there


def hello(peer_id, i, reply=False):
    return [b"HELLO", json.dumps({"id": peer_id, "name": f"evil{i}", "cluster": "default",
                                  "endpoint": endpoint(i), "version": PROTOCOL_VERSION,
                                  "reply": reply}).encode()]


# half from one connection that names a new broker id in every HELLO
one = ctx.socket(zmq.DEALER)
one.setsockopt(zmq.ROUTING_ID, b"evil-" + uuid.uuid4().hex.encode())
one.connect(target)
for i in range(0, count, 2):
    one.send_multipart(hello(uuid.uuid4().hex, i, reply=i % 4 == 2))
# half from a new connection each, whose routing id is the id its HELLO names
for i in range(1, count, 2):
    peer_id = uuid.uuid4().hex
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.ROUTING_ID, peer_id.encode())
    d.setsockopt(zmq.LINGER, 2000)
    d.connect(target)
    d.send_multipart(hello(peer_id, i))
    d.close()
one.close(linger=2000)
print("sent", count, flush=True)
sys.stdin.read()  # keep the sinks open until the test is done
"""


def fd_count(host):
    return len(os.listdir(f"/proc/{host.broker_pid()}/fd"))


def test_hello_flood_is_bounded_and_a_real_broker_still_joins(testbed):
    """A hostile process says HELLO 600 times with made-up ids and endpoints (closed ports, hosts
    that do not exist, ZeroMQ sockets that never answer as a broker, malformed ones): the
    broker's descriptors stay bounded, nothing crashes, no made-up peer is admitted, and a real
    broker then joins and carries a pipe."""
    bed = testbed(3, start=False)
    a, b, evil = bed.hosts
    a.start_broker({"cluster": {"discovery": False}})
    # the started broker's descriptors (its ZeroMQ sockets among them) hold still
    base = wait_steady(lambda: fd_count(a), 10, "the broker's descriptors")
    base_sockets = a.zmq_sockets()
    peak_sockets = base_sockets
    flood = evil.python(HELLO_FLOOD, a.endpoint, evil.address, "600", stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = base
    deadline = time.monotonic() + 30
    line = b""
    while not line and time.monotonic() < deadline:
        peak, peak_sockets = max(peak, fd_count(a)), max(peak_sockets, a.zmq_sockets())
        if flood.poll() is not None:
            raise AssertionError(flood.stderr.read().decode())
        time.sleep(0.05)
        if select.select([flood.stdout], [], [], 0)[0]:
            line = flood.stdout.readline()
    assert line.startswith(b"sent"), line
    for _ in range(60):  # the flood reaches the broker and what it made up expires
        peak, peak_sockets = max(peak, fd_count(a)), max(peak_sockets, a.zmq_sockets())
        time.sleep(0.1)
    settle = time.monotonic() + 20
    while fd_count(a) > base + 16 and time.monotonic() < settle:
        peak, peak_sockets = max(peak, fd_count(a)), max(peak_sockets, a.zmq_sockets())
        time.sleep(0.2)
    after = fd_count(a)
    stderr = (a.dir / "broker.stderr").read_text(errors="replace")
    print(f"broker fds: {base} before, peak {peak}, {after} after the flood; ZeroMQ sockets: "
          f"{base_sockets} before, peak {peak_sockets}; "
          f"{stderr.count('Traceback')} tracebacks; {len(a.peers())} peers admitted; "
          f"{len(a.log_events())} log lines")
    assert a.broker.poll() is None
    assert "Traceback" not in stderr and "Traceback" not in a.log_path.read_text(), stderr[-3000:]
    assert a.peers() == set(), a.peers()  # nothing made up was admitted
    # a link per pending contact (at most 64), none left once they are given up; the flood's
    # own connections come and go. Closed links linger until ZeroMQ's reaper thread gets to
    # them: a moment on a quiet machine (peak ~72), up to ~75 more when every core is busy
    # (seen: 148). Unbounded, the 600 HELLOs would make 300+ links.
    assert peak_sockets <= base_sockets + 64 + 128, (base_sockets, peak_sockets)
    assert after <= base + 16, (base, after)
    # refusals and give-ups counted, not one line each of the 600: 20-26 lines on a quiet
    # machine, 45 seen under a loaded suite (give-ups come in smaller batches)
    assert len(a.log_events()) < 100
    # a real broker joins and a pipe crosses
    b.start_broker({"cluster": {"discovery": False, "peers": [a.endpoint]}})
    wait_for_cluster([a, b])
    line_crosses(a, b, "after-flood", b"still works\n")
    flood.stdin.close()
    flood.wait(10)


# --- closed to strangers: a cluster has a key unless told to have none ----------------------


def test_a_cluster_without_a_key_file_makes_one_and_only_its_holders_pair(testbed):
    """With no cluster.key_file, a broker makes a key of its own on first start and says
    where; a broker with another key is refused until it has the same file."""
    bed = testbed(2, start=False)
    a, b = bed.hosts
    default = {"cluster": {"insecure": False, "discovery": False,
                           "peers": [a.endpoint, b.endpoint]}}
    a.start_broker(default)
    b.start_broker(default)
    key_a = a.dir / "config" / "zbroker" / "cluster-default.key"
    key_b = b.dir / "config" / "zbroker" / "cluster-default.key"
    a.wait_for_log("cluster key made: copy this file to every broker of the cluster (or name "
                   "one in cluster.key_file)", timeout=10, key_file=str(key_a))
    assert key_a.stat().st_mode & 0o777 == 0o600
    assert key_a.read_bytes() != key_b.read_bytes()
    a.wait_for_log("cluster connection refused", timeout=10)
    time.sleep(1)  # a window in which they would pair: they do not
    assert a.peers() == set() and b.peers() == set()
    b.kill_broker()
    key_b.write_bytes(key_a.read_bytes())  # what the operator is told to do
    b.start_broker(default)
    wait_for_cluster([a, b])
    line_crosses(a, b, "keyed", b"made on first start\n")
    status = a.zbroker("status")
    assert f"key {key_a}" in status and "INSECURE" not in status


def test_clustering_without_a_key_only_when_asked_for(testbed):
    bed = testbed(2, start=False)
    a, b = bed.hosts
    peers = {"discovery": False, "peers": [a.endpoint, b.endpoint]}
    a.start_broker({"cluster": {**peers, "insecure": True}})
    a.wait_for_log("cluster without a key (cluster.insecure): any host that says the "
                   "cluster's name can join and reach every pipe and queue", timeout=10)
    b.start_broker({"cluster": {**peers, "insecure": False}})  # the default: keyed
    time.sleep(3)  # a window in which they would pair: they do not
    assert a.peers() == set() and b.peers() == set()
    b.kill_broker()
    b.start_broker({"cluster": {**peers, "insecure": True}})
    wait_for_cluster([a, b])
    joined = [e for e in a.log_events() if e.get("event") == "peer joined"]
    assert joined and all(e.get("level") == "warning" and "no cluster key" in e["insecure"]
                          for e in joined)
    assert "INSECURE: no key" in a.zbroker("status")
