"""The pipe directory at scale, in memory: ZPIPES server cores, each the service of a broker's
cluster core, on the in-memory network of those cores (tests/zpipes_cluster.py on
tests/cluster_cores.py), without sockets, 5 to 300 brokers, each pipe a writer and a reader on
two random brokers. Printed per cluster size:

* cluster messages per pipe opened (REGISTER, INTRODUCE, ATTACH: not DATA nor CREDIT), mean
  and worst, and per pipe closed;
* what each broker holds for 10 000 open pipes cluster-wide: entries (its own ends, proxies of
  other brokers' ends, directory entries as a home) and bytes (tracemalloc, the cluster's
  growth over opening the pipes divided by the brokers);
* a broker joining (through one seed, learning the others from it), then one lost (killed):
  ZPIPES messages, pipes whose home moved, pipes failed among those that do not touch the lost
  broker (must be 0), and those that do (their streams break, as they must);
* heartbeats (the membership layer, zbroker/cluster/membership.py, not changed here): PINGs a
  broker sends per second when idle, and MEMBERS; the join's seconds until every member has
  the new broker as a peer and it has every member, and the cluster layer's messages then.

The same with every broker telling every peer of every end (the way before, and still the way
towards brokers that do not speak the directory) at the sizes where it fits in memory.

    python bench/bench_directory.py [--sizes 5,20,100,300] [--pipes 10000] [--broadcast 5,20]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from zpipes_cluster import Cluster  # noqa: E402

from zbroker.cluster.core.protocol import KIND_SVCN  # noqa: E402
from zbroker.cluster.membership import Hello, Membership  # noqa: E402
from zpipes import protocol as p  # noqa: E402


def open_pipes(net: Cluster, count: int, rng: random.Random, tag: str) -> tuple[list, list[int]]:
    names = sorted(net.servers)
    pipes, costs = [], []
    for i in range(count):
        name = b"%s%d" % (tag.encode(), i)
        writer, reader = rng.sample(names, 2)
        before = net.control_messages()
        opens = [(reader, b"r", p.Input(name)), (writer, b"w", p.Output(name))]
        for broker, role, msg in opens if i % 2 else opens[::-1]:
            net.send(broker, role + name, msg)
            net.servers[broker].outbox.clear()  # the client's OK: not the cluster's memory
        costs.append(net.control_messages() - before)
        pipes.append((name, writer, reader))
    return pipes, costs


def flows(net: Cluster, pipes: list, chunk: bytes) -> list[bool]:
    """Each pipe's writer writes ``chunk`` and its reader reads it: True where it arrived."""
    ok = []
    for name, writer, reader in pipes:
        net.send(writer, b"w" + name, p.Write(chunk, 0))
        net.send(reader, b"r" + name, p.Read(1 << 10, 0))
        last = net.replies(reader, b"r" + name)[-1:]
        net.replies(writer, b"w" + name)
        ok.append(last == [p.ReadOk(chunk)])
    return ok


def held(net: Cluster) -> tuple[float, int]:
    """Entries a broker holds, mean and max: ends in its pipe table (its own and proxies) and
    directory entries."""
    counts = [len(s.pipes._readers) + len(s.pipes._writers) + s.directory.held.entries()
              for s in net.servers.values()]
    return sum(counts) / len(counts), max(counts)


def heartbeats(n: int, timeout: float = 3.0, seconds: float = 30.0) -> tuple[float, float]:
    """PINGs per second and MEMBERS per second one idle broker sends with ``n - 1`` peers (the
    membership core, its own clock)."""
    m = Membership(Hello("me", "me", "c", "tcp://10.0.0.1:1"), timeout)
    for i in range(n - 1):
        m.hello(Hello(f"p{i}", "p", "c", f"tcp://10.1.{i // 250}.{i % 250}:1", reply=True,
                      echo=m.nonce(f"tcp://10.1.{i // 250}.{i % 250}:1")), 0.0)
    pings = members = 0
    now = 0.0
    while now < seconds:
        now += 0.05
        for peer in m.peers.values():
            peer.last_heard = now  # everyone is alive
        due, _ = m.due(now)
        for peer in due:
            m.sent(peer.id, now)
        pings += len(due)
        members += m.gossip_due(now) is not None
    return pings / seconds, members / seconds


def run(n: int, pipes: int, directory: bool, seed: int = 1) -> dict:
    rng = random.Random(seed)
    names = [f"b{i:03d}" for i in range(n)]
    # counted by kind only: a count per link would be part of the memory measured
    net = Cluster(names, directory=directory, per_link=False)
    net.join_all()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.monotonic()
    opened, costs = open_pipes(net, pipes, rng, "p")
    open_s = time.monotonic() - t0
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    mean_held, max_held = held(net)
    assert all(flows(net, opened, b"first")), "a pipe did not work"
    out = {"n": n, "mode": "directory" if directory else "broadcast",
           "open_mean": sum(costs) / len(costs), "open_max": max(costs),
           "bytes_per_broker": grown / n, "held_mean": mean_held, "held_max": max_held,
           "open_s": open_s}
    # a broker joins: homes move to it
    before_homes = {name: net.home(name) for name, *_ in opened} if directory else {}
    sent, layer, t0 = net.control_messages(), cluster_messages(net), net.now
    net.join("new", via=names[0])
    out["join_msgs"] = net.control_messages() - sent
    out["join_s"], out["join_member_msgs"] = net.now - t0, cluster_messages(net) - layer
    out["moved_join"] = sum(net.home(name) != before_homes[name]
                            for name, *_ in opened) if directory else 0
    out["failed_join"] = flows(net, opened, b"after join").count(False)
    # a broker is lost: its pipes break, no other
    victim = names[n // 2]
    before_homes = {name: net.home(name) for name, *_ in opened} if directory else {}
    sent = net.control_messages()
    net.lose(victim)
    out["lose_msgs"] = net.control_messages() - sent
    out["moved_lose"] = sum(net.home(name) != before_homes[name]
                            for name, *_ in opened) if directory else 0
    touching = [x for x in opened if victim in x[1:]]
    others = [x for x in opened if victim not in x[1:]]
    out["failed_others"] = flows(net, others, b"after loss").count(False)
    out["touching"] = len(touching)
    # new pipes after the changes still cost the same; closing costs
    _, costs = open_pipes(net, min(pipes, 1000), rng, "q")
    out["open_after_max"] = max(costs)
    sent = net.control_messages()
    for name, writer, reader in others:
        net.send(writer, b"w" + name, p.Close())
        net.send(reader, b"r" + name, p.Close())
    out["close_mean"] = (net.control_messages() - sent) / len(others)
    out["pings_s"], out["members_s"] = heartbeats(n)
    return out


def cluster_messages(net: Cluster) -> int:
    """The cluster layer's messages sent so far (HELLO, PING, MEMBERS, BYE: not the services')."""
    return sum(n for kind, n in net.net.sent.items() if kind != KIND_SVCN)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5,20,100,300")
    ap.add_argument("--pipes", type=int, default=10_000)
    ap.add_argument("--broadcast", default="5,20", help="sizes to run the way before at too")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    broadcast = [int(x) for x in args.broadcast.split(",") if x]
    print(f"{args.pipes} pipes (a writer and a reader on two random brokers each, opened "
          f"reader or writer first in turn); heartbeats with peer_timeout 3 s")
    header = (f"{'brokers':>7} {'mode':>9} | {'msgs/open':>9} {'worst':>5} {'msgs/close':>10} | "
              f"{'entries/broker':>14} {'max':>6} {'KiB/broker':>10} | {'join msgs':>9} "
              f"{'moved':>5} {'failed':>6} | {'loss msgs':>9} {'moved':>5} {'failed':>6} "
              f"{'cut':>5} | {'PING/s':>6} {'MEMBERS/s':>9} {'join s':>6} {'msgs':>5}")
    print(header)
    print("-" * len(header))
    for n in sizes:
        for directory in (True, False) if n in broadcast else (True,):
            r = run(n, args.pipes, directory)
            print(f"{r['n']:>7} {r['mode']:>9} | {r['open_mean']:>9.2f} {r['open_max']:>5} "
                  f"{r['close_mean']:>10.2f} | {r['held_mean']:>14.0f} {r['held_max']:>6} "
                  f"{r['bytes_per_broker'] / 1024:>10.0f} | {r['join_msgs']:>9} "
                  f"{r['moved_join']:>5} {r['failed_join']:>6} | {r['lose_msgs']:>9} "
                  f"{r['moved_lose']:>5} {r['failed_others']:>6} {r['touching']:>5} | "
                  f"{r['pings_s']:>6.0f} {r['members_s']:>9.2f} {r['join_s']:>6.3f} "
                  f"{r['join_member_msgs']:>5}", flush=True)
            assert r["failed_join"] == 0 and r["failed_others"] == 0
            if r["mode"] == "directory":
                assert r["open_max"] <= 4 and r["open_after_max"] <= 4
    print("msgs/open: cluster messages to open one pipe (not DATA or CREDIT); moved: pipes "
          "whose home changed; failed: pipes not touching the lost broker that broke (must be "
          "0); cut: pipes with an end on the lost broker (they fail, as they must). PING/s, "
          "MEMBERS/s: what one idle broker sends (peer_timeout 3 s: a PING per peer per "
          "second); join s: until a broker that joins through one seed is everyone's peer "
          "(simulated clock, 1 ms steps), msgs: the cluster layer's messages meanwhile, "
          "every broker's heartbeats too.")


if __name__ == "__main__":
    main()
