"""Join through a seed, learn the rest, across a router: two subnets of two hosts each (two
bridges joined by a router namespace that forwards IP and no multicast, see netns.py), each
broker given one seed in the other subnet only. The same logic without sockets:
test_gossip.py."""

from __future__ import annotations

import json
import os
import subprocess
import time

import netns
import pytest
from helpers import wait_steady

why_not = netns.available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))

PEER_TIMEOUT = 2.0


@pytest.fixture
def two_subnets(tmp_path):
    bed = netns.Testbed([2, 2], tmp_path)
    yield bed
    bed.close()


def status_peers(host) -> set[str]:
    """The endpoints of the peers ``host``'s broker has, as `zbroker status --json` says."""
    out = host.zbroker("status", "--json")
    return {p["endpoint"] for p in json.loads(out)["cluster"]["peers"]}


def wait_for(what, condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def pipes_cross_between_every_pair(hosts, tag):
    """A `zpipes write` on each host read by a `zpipes read` on every other one."""
    for a in hosts:
        others = [b for b in hosts if b is not a]
        data = {b: f"{tag}: {a.name} to {b.name}\n".encode() + os.urandom(64 << 10).hex().encode()
                for b in others}
        readers = {b: b.zpipes("read", f"{tag}-{a.name}-{b.name}", stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE) for b in others}
        for b in others:
            a.wait_findable(f"{tag}-{a.name}-{b.name}", "reader", 15)
        writers = {b: a.zpipes("write", f"{tag}-{a.name}-{b.name}", stdin=subprocess.PIPE,
                               stderr=subprocess.PIPE) for b in others}
        for b, w in writers.items():
            w.stdin.write(data[b])
            w.stdin.close()
        for b in others:
            try:
                out, err = readers[b].communicate(timeout=30)
            except subprocess.TimeoutExpired:  # what each side saw, for whoever looks
                w = writers[b]
                state = "was running" if w.poll() is None else f"exited {w.returncode}"
                w.kill()
                w.wait()
                raise AssertionError(
                    f"{b.name} read nothing of {a.name}'s pipe in 30 s; the writer {state}"
                    f", said {w.stderr.read()!r}\n--- {a.name}\n{a.log_tail(60)}"
                    f"\n--- {b.name}\n{b.log_tail(60)}") from None
            assert readers[b].returncode == 0, (a.name, b.name, err)
            assert out == data[b], (a.name, b.name, len(out))
            assert writers[b].wait(30) == 0, writers[b].stderr.read()


def test_one_seed_in_the_other_subnet_each_links_every_broker_to_every_other(two_subnets):
    """Zeroconf off: what each broker knows beyond its one seed, it learned from gossip."""
    a, b, c, d = two_subnets.hosts
    assert (a.subnet, b.subnet, c.subnet, d.subnet) == (0, 0, 1, 1)
    seeds = {a: c, b: d, c: b, d: a}
    for host, seed in seeds.items():
        host.start_broker({"cluster": {"discovery": False, "peers": [seed.endpoint],
                                       "peer_timeout": PEER_TIMEOUT}})
    started = time.monotonic()
    two_subnets.wait_for_cluster(timeout=20)
    print(f"every broker linked to every other {time.monotonic() - started:.2f} s after the "
          f"last one started")
    everyone = {h.endpoint for h in two_subnets.hosts}
    # the seeds name 4 of the 6 pairs, never the two within a subnet: those came from gossip
    for host in two_subnets.hosts:
        assert status_peers(host) == everyone - {host.endpoint}, host.name
    assert any(e.get("event") == "members learned" for h in (a, b) for e in h.log_events())
    assert any(e.get("event") == "members learned" for h in (c, d) for e in h.log_events())
    pipes_cross_between_every_pair(two_subnets.hosts, "seeded")
    # a broker killed is dropped everywhere within the bound, seed of another or not
    killed = time.monotonic()
    c.kill_broker()
    rest = [a, b, d]
    wait_for("c dropped everywhere", lambda: all(c.endpoint not in h.peers() for h in rest),
             PEER_TIMEOUT + 3)
    took = time.monotonic() - killed
    print(f"c dropped by all in {took:.2f} s")
    assert took < PEER_TIMEOUT + 1.0, took
    for host in rest:
        assert status_peers(host) == {h.endpoint for h in rest} - {host.endpoint}
    # and stays dropped: gossip goes on without bringing it back
    time.sleep(PEER_TIMEOUT * 2)
    assert all(c.endpoint not in h.peers() for h in rest)
    assert all("Traceback" not in (h.dir / "broker.stderr").read_text() for h in two_subnets.hosts)


def test_zeroconf_inside_a_subnet_one_seed_across_and_a_partition_heals(two_subnets):
    """Zeroconf finds the broker beside each one; one broker only has a seed, in the other
    subnet; the router's link to one subnet is then cut and brought back."""
    a, b, c, d = two_subnets.hosts
    for host in (a, b, c, d):  # all at once: each zeroconf registration takes over a second
        seed = [c.endpoint] if host is a else []
        host.start_broker({"cluster": {"discovery": True, "peers": seed,
                                       "peer_timeout": PEER_TIMEOUT}}, wait=False)
    for host in (a, b, c, d):
        host.wait_for_log("broker started", timeout=15)
    two_subnets.wait_for_cluster(timeout=30)
    two_subnets.router_link(1, up=False)
    cut = time.monotonic()
    wait_for("the subnets lose each other",
             lambda: a.peers() == {b.endpoint} and b.peers() == {a.endpoint}
             and c.peers() == {d.endpoint} and d.peers() == {c.endpoint}, PEER_TIMEOUT + 3)
    assert time.monotonic() - cut < PEER_TIMEOUT + 1.0
    time.sleep(3 * PEER_TIMEOUT)  # longer than a learned contact is kept
    before = {host.name: len(host.log_events()) for host in (a, b, c, d)}
    two_subnets.router_link(1, up=True)
    healed = time.monotonic()
    two_subnets.wait_for_cluster(timeout=20)
    print(f"healed {time.monotonic() - healed:.2f} s after the link returned")
    pipes_cross_between_every_pair([b, d], "healed")
    # a HELLO held back by the partition (sent again by the kernel once the link returned)
    # started no life of a session its sender had given up: such a life ends at its first
    # message or PING, failing the pipes through it if it came before them
    ended = [(host.name, e.get("why")) for host in (a, b, c, d)
             for e in host.log_events()[before[host.name]:]
             if e.get("event") == "peer left"
             and "another session with us" in (e.get("why") or "")]
    assert ended == []


HOSTILE_PEER = r"""
import json, select, sys, time, uuid
import zmq
from zbroker.cluster.gossip import MAX_FRAME
from zbroker.cluster.membership import PROTOCOL_VERSION

target, me = sys.argv[1], sys.argv[2]
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER)  # where it claims to be: it answers the challenge there
router.bind(f"tcp://{me}:5670")
my_id = uuid.uuid4().hex
dealer = ctx.socket(zmq.DEALER)
dealer.setsockopt(zmq.ROUTING_ID, my_id.encode())
dealer.connect(target)


def hello(echo="", reply=False):
    return [b"HELLO", json.dumps({"id": my_id, "name": "evil", "cluster": "default",
                                  "endpoint": f"tcp://{me}:5670", "version": PROTOCOL_VERSION,
                                  "reply": reply, "nonce": "n" * 32, "echo": echo,
                                  "gossip": True}).encode()]


def next_hello(timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if router.poll(100):
            frames = router.recv_multipart()
            if frames[1] == b"HELLO":
                return json.loads(frames[2])
    raise SystemExit("no HELLO from the broker")


dealer.send_multipart([b"MEMBERS", b'{"members": []}'])  # a stranger's gossip
dealer.send_multipart(hello())
dealer.send_multipart(hello(echo=next_hello()["nonce"]))  # it answers the challenge
while not next_hello().get("reply"):
    pass
ghosts = [{"id": uuid.uuid4().hex, "name": f"ghost{i}",
           "endpoint": f"tcp://10.231.0.{100 + i % 150}:{5000 + i}"} for i in range(2000)]
odd = [{"id": "x", "name": "x", "endpoint": e} for e in
       ["tcp://*:5670", "inproc://zeromq.zap.01", "ipc://@/zpipes/local", "tcp://nonsense"]]
for frames in ([b"MEMBERS", b"\xff not json"], [b"MEMBERS", b" " * (MAX_FRAME + 1)],
               [b"MEMBERS", json.dumps({"members": [{"id": 1}, "x", None, {}]}).encode()],
               [b"MEMBERS", b'{"members": {"a": 1}}'], [b"MEMBERS"], [b"MEMBERS", b"{}", b"x"],
               [b"MEMBERS", json.dumps({"members": odd}).encode()],
               [b"MEMBERS", b"[" * 100000],
               [b"MEMBERS", json.dumps({"members": ghosts}).encode()]):
    dealer.send_multipart(frames)
print("sent", flush=True)
while not select.select([sys.stdin], [], [], 0.3)[0]:
    dealer.send_multipart([b"PING"])  # stays a peer
    while router.poll(0):
        router.recv_multipart()
"""


def test_hostile_gossip_is_refused_or_bounded_and_a_real_broker_still_joins(tmp_path):
    """A process that passes the HELLO round trip (a peer, as with a stolen key) gossips junk,
    oversized frames, endpoints no peer can be at and 2000 made-up members; before that, as a
    stranger, it gossips too. The broker refuses or bounds all of it, admits no made-up
    member, gives up what it learned, and a real broker then joins through it."""
    bed = netns.Testbed(3, tmp_path)
    try:
        a, b, evil = bed.hosts
        a.start_broker({"cluster": {"discovery": False, "peer_timeout": PEER_TIMEOUT}})
        base = wait_steady(a.zmq_sockets, 10, "the broker's ZeroMQ sockets")  # started
        peer = evil.python(HOSTILE_PEER, a.endpoint, evil.address, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert peer.stdout.readline() == b"sent\n", peer.stderr.read()
        a.wait_for_log("peer joined", 5, endpoint=evil.endpoint)
        peak = base
        deadline = time.monotonic() + 4 * PEER_TIMEOUT + 5  # learned contacts are given up
        while time.monotonic() < deadline:
            peak = max(peak, a.zmq_sockets())
            if peak > base + 100 and a.zmq_sockets() <= base + 8:
                break
            time.sleep(0.1)
        after = a.zmq_sockets()
        events = a.log_events()
        whys = [e.get("why") for e in events if e.get("event", "").startswith("invalid gossip")]
        print(f"ZeroMQ sockets: {base} before, peak {peak}, {after} after; invalid gossip: "
              f"{whys}")
        assert a.broker.poll() is None
        assert "Traceback" not in (a.dir / "broker.stderr").read_text()
        assert any(e.get("event") == "gossip refused" for e in events)
        assert any(e.get("event", "").startswith("gossip partly ignored") for e in events)
        assert whys[0] == "not JSON"  # the first; the others are counted (repeat filter)
        learned = [e for e in events if e.get("event") == "members learned"]
        assert [e["contacts"] for e in learned] == [512], learned  # of 2000 named
        assert a.peers() == {evil.endpoint}  # no ghost was admitted
        assert base + 100 < peak <= base + 2 * 512 + 64, (base, peak)  # bounded, and tried
        assert after <= base + 8, (base, after)
        # a real broker joins through it (and is told of the evil one, which never answers it)
        b.start_broker({"cluster": {"discovery": False, "peers": [a.endpoint],
                                    "peer_timeout": PEER_TIMEOUT}})
        bed.wait_for_cluster([a, b])
        pipes_cross_between_every_pair([a, b], "after-gossip")
        assert b.peers() == {a.endpoint}
        peer.stdin.close()
        peer.wait(10)
    finally:
        bed.close()
