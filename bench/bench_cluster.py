"""Cross-broker ZPIPES throughput over TCP between two network namespaces, against raw pyzmq
(PUSH -> PULL, 1 MiB messages, zero-copy) over the same link in the same run, and the CPU
seconds each broker spends per GiB moved. Needs root.

    python bench/bench_cluster.py [--mib 512] [--runs 3] [--capacities 1MiB,4MiB,16MiB]
                                  [--floor]

``--capacities``: the ZPIPES capacity per reader (which is also a remote reader's credit
window: the bytes in flight to it) to compare, set on both brokers in turn within each run
(`zbroker set`), so that the machine's noise hits every one alike.

``--readers N``: N readers of the stream on host B (one copy of each chunk crosses the link:
the bytes of pipe data the writer's broker sent, per byte of the stream, are printed).

``--floor``: also measure, in each run, the same hops with no Python in the middle: ``head |``
a pyzmq PUSH over ipc to a C relay (``zmq.proxy``) on host A, over TCP to a C relay on host B,
over ipc to a pyzmq PULL ``> /dev/null``. No broker can beat what that shape costs: it is the
ceiling of a stream that goes client -> broker -> broker -> client.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import netns  # noqa: E402

RAW_PULL = r"""
import sys, zmq
n = int(sys.argv[1]); ctx = zmq.Context(); s = ctx.socket(zmq.PULL)
s.bind("tcp://*:6000")
print("ready", flush=True)
for _ in range(n):
    s.recv(copy=False)
print("done", flush=True)
"""
RAW_PUSH = r"""
import sys, zmq
n, addr = int(sys.argv[1]), sys.argv[2]; ctx = zmq.Context(); s = ctx.socket(zmq.PUSH)
s.connect(addr); block = bytes(1 << 20)
for _ in range(n):
    s.send(block, copy=False)
s.close(linger=-1); ctx.term()
"""


RELAY = r"""
import sys, zmq
ctx = zmq.Context(); a = ctx.socket(zmq.PULL); a.bind(sys.argv[1])
b = ctx.socket(zmq.PUSH); b.connect(sys.argv[2])
zmq.proxy(a, b)
"""
FLOOR_PUSH = r"""
import zmq
ctx = zmq.Context(); s = ctx.socket(zmq.PUSH); s.connect("ipc://@bench-floor-in")
src = open(0, "rb", buffering=0)
while True:
    buf = bytearray(1 << 20); n = src.readinto(buf)
    while n and n < len(buf):
        m = src.readinto(memoryview(buf)[n:])
        if not m: break
        n += m
    if not n: break
    s.send(memoryview(buf)[:n], copy=False)
s.send(b""); s.close(linger=-1); ctx.term()
"""
FLOOR_PULL = r"""
import zmq
ctx = zmq.Context(); s = ctx.socket(zmq.PULL); s.bind("ipc://@bench-floor-out")
print("ready", flush=True)
out = open(1, "wb", buffering=0)
while True:
    frame = s.recv(copy=False)
    if not len(frame): break
    out.write(frame.buffer)
"""


def floor(a, b, mib: int) -> tuple[float, float, float, float]:
    """The same hops as a ZPIPES stream with C relays in place of the brokers: seconds, and
    the CPU seconds of relay A, relay B and the clients (head, sender, receiver)."""
    pull = b.popen(["sh", "-c", f"{sys.executable} -c '{FLOOR_PULL}' > /dev/null; echo done"],
                   stdout=subprocess.PIPE)
    relay_b = b.python(RELAY, "tcp://*:6001", "ipc://@bench-floor-out")
    relay_a = a.python(RELAY, "ipc://@bench-floor-in", f"tcp://{b.address}:6001")
    time.sleep(1.0)  # (connected by then; the relays run until killed)
    t = time.perf_counter()
    push = a.popen(["sh", "-c", f"head -c {mib << 20} /dev/zero | "
                                f"{sys.executable} -c '{FLOOR_PUSH}'"])
    assert pull.stdout.readline().strip() == b"done"
    dt = time.perf_counter() - t
    relays = pid_cpu_seconds(relay_a.pid), pid_cpu_seconds(relay_b.pid)
    for relay in (relay_a, relay_b):
        relay.kill()
        relay.wait()
    return dt, relays[0], relays[1], finish(push) + finish(pull)


def finish(proc: subprocess.Popen) -> float:
    """Wait for ``proc`` to exit successfully; the CPU seconds it and the children it waited
    for (a shell's pipeline) spent."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, proc.args
    return usage.ru_utime + usage.ru_stime


def raw(a, b, mib: int) -> tuple[float, float]:
    """Seconds to move ``mib`` MiB, and the CPU seconds sender and receiver spent."""
    pull = b.python(RAW_PULL, str(mib), stdout=subprocess.PIPE)
    assert pull.stdout.readline().strip() == b"ready"
    t = time.perf_counter()
    push = a.python(RAW_PUSH, str(mib), f"tcp://{b.address}:6000")
    assert pull.stdout.readline().strip() == b"done"
    dt = time.perf_counter() - t
    return dt, finish(push) + finish(pull)


def cpu_seconds(host) -> float:
    """User + system CPU time of ``host``'s broker so far (from /proc/PID/stat)."""
    return pid_cpu_seconds(host.broker_pid())


def pid_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def set_capacity(hosts, capacity: str) -> None:
    for host in hosts:
        host.zbroker("set", "services.zpipes.capacity", capacity)
        got = host.zbroker("get", "services.zpipes.capacity").strip()
        assert got.isdigit(), f"{host.name}: capacity not set: {got}"


def zpipes(a, b, mib: int, run: int, readers: int = 1) -> tuple[float, float]:
    """Seconds to stream ``mib`` MiB from a writer on ``a`` to ``readers`` readers on ``b``,
    and the CPU seconds of the clients."""
    pipe = f"bench{run}"
    rs = [b.popen(["sh", "-c", f"{sys.executable} -m zpipes read {pipe} > /dev/null"])
          for _ in range(readers)]
    a.wait_findable(pipe, "reader", 10, count=readers)
    t = time.perf_counter()
    w = a.popen(["sh", "-c", f"head -c {mib << 20} /dev/zero | "
                             f"{sys.executable} -m zpipes write {pipe}"])
    clients = finish(w) + sum(finish(r) for r in rs)
    return time.perf_counter() - t, clients


def data_bytes_sent(host) -> int | None:
    """Bytes of pipe data the broker sent to its peers (None: a broker that does not count)."""
    status = json.loads(host.zbroker("status", "--json"))
    return status["services"]["zpipes"].get("link", {}).get("data_bytes_sent")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--capacities", default="",
                    help="comma-separated capacities to compare (default: the brokers' own)")
    ap.add_argument("--readers", type=int, default=1,
                    help="readers of the stream on host B (fan-out: one copy crosses the link)")
    ap.add_argument("--floor", action="store_true",
                    help="also measure the same hops with C relays in place of the brokers")
    args = ap.parse_args()
    capacities = [c.strip() for c in args.capacities.split(",") if c.strip()] or [""]
    why = netns.available()
    if why:
        raise SystemExit(why)
    with tempfile.TemporaryDirectory() as tmp:
        bed = netns.Testbed(2, Path(tmp))
        try:
            a, b = bed.hosts
            for host in bed.hosts:
                host.start_broker()
            bed.wait_for_cluster()
            raws: list[tuple[float, float]] = []
            floors: list[tuple[float, float, float, float]] = []
            # by position: a capacity named twice (A,B,A) is measured twice
            pipes: list[list[tuple[float, float]]] = [[] for _ in capacities]
            cpu: list[list[tuple[float, float]]] = [[] for _ in capacities]
            link: list[list[float]] = [[] for _ in capacities]  # bytes over the link per byte
            n = 0
            for _ in range(args.runs):  # interleaved: noise hits all alike
                raws.append(raw(a, b, args.mib))
                if args.floor:
                    floors.append(floor(a, b, args.mib))
                for i, capacity in enumerate(capacities):
                    if capacity:
                        set_capacity((a, b), capacity)
                    before = cpu_seconds(a), cpu_seconds(b)
                    sent = data_bytes_sent(a)
                    n += 1
                    pipes[i].append(zpipes(a, b, args.mib, n, args.readers))
                    cpu[i].append((cpu_seconds(a) - before[0], cpu_seconds(b) - before[1]))
                    if sent is not None:
                        link[i].append((data_bytes_sent(a) - sent) / (args.mib << 20))
        finally:
            bed.close()
    nbytes = args.mib << 20
    gib = nbytes / (1 << 30)
    r = statistics.median(t for t, _ in raws)
    raw_cpu = statistics.median(c for _, c in raws) / gib
    print(f"cross-host {args.mib} MiB, median of {args.runs}: raw pyzmq "
          f"{nbytes / r / 1e6:7.0f} MB/s, sender + receiver CPU {raw_cpu:.2f} s per GiB")
    # each run against the raw pyzmq of its own run: the range of the ratios
    ratios = [sorted(raws[k][0] / runs[k][0] for k in range(args.runs)) for runs in pipes]
    if floors:
        f = statistics.median(t for t, *_ in floors)
        span = sorted(raws[k][0] / floors[k][0] for k in range(args.runs))
        print(f"  C relays (head | push | relay A | relay B | pull): {nbytes / f / 1e6:7.0f} MB/s"
              f"   ratio {r / f:.2f}x (runs {span[0]:.2f} to {span[-1]:.2f})   CPU per GiB: "
              f"relay A {statistics.median(x[1] for x in floors) / gib:.2f} s, relay B "
              f"{statistics.median(x[2] for x in floors) / gib:.2f} s, clients "
              f"{statistics.median(x[3] for x in floors) / gib:.2f} s")
    for i, capacity in enumerate(capacities):
        z = statistics.median(t for t, _ in pipes[i])
        clients = statistics.median(c for _, c in pipes[i]) / gib
        cpu_a = statistics.median(c[0] for c in cpu[i]) / gib
        cpu_b = statistics.median(c[1] for c in cpu[i]) / gib
        many = f" x {args.readers}" if args.readers > 1 else ""
        print(f"  zpipes (write | broker A | broker B | read{many})"
              f"{f', capacity {capacity}' if capacity else ''}: {nbytes / z / 1e6:7.0f} MB/s   "
              f"ratio {r / z:.2f}x (runs {ratios[i][0]:.2f} to {ratios[i][-1]:.2f})"
              f"{f'   link {statistics.median(link[i]):.2f}x the stream' if link[i] else ''}"
              f"   CPU per GiB: broker A {cpu_a:.2f} s, broker B "
              f"{cpu_b:.2f} s, clients (head, zpipes write, zpipes read{many}) {clients:.2f} s")


if __name__ == "__main__":
    main()
