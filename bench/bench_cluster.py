"""Cross-broker ZPIPES throughput over TCP between two network namespaces, against raw pyzmq
(PUSH -> PULL, 1 MiB messages, zero-copy) over the same link in the same run. Needs root.

    python bench/bench_cluster.py [--mib 512] [--runs 3]
"""

from __future__ import annotations

import argparse
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


def raw(a, b, mib: int) -> float:
    pull = b.python(RAW_PULL, str(mib), stdout=subprocess.PIPE)
    assert pull.stdout.readline().strip() == b"ready"
    t = time.perf_counter()
    push = a.python(RAW_PUSH, str(mib), f"tcp://{b.address}:6000")
    assert pull.stdout.readline().strip() == b"done"
    dt = time.perf_counter() - t
    push.wait(60)
    pull.wait(60)
    return dt


def zpipes(a, b, mib: int, run: int) -> float:
    pipe = f"bench{run}"
    r = b.popen(["sh", "-c", f"{sys.executable} -m zpipes read {pipe} > /dev/null"])
    a.wait_for_log("remote end attached", 10, pipe=pipe, role="reader")
    t = time.perf_counter()
    w = a.popen(["sh", "-c", f"head -c {mib << 20} /dev/zero | "
                             f"{sys.executable} -m zpipes write {pipe}"])
    assert w.wait(300) == 0 and r.wait(300) == 0
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
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
            raws, pipes = [], []
            for run in range(args.runs):  # interleaved: noise hits both alike
                raws.append(raw(a, b, args.mib))
                pipes.append(zpipes(a, b, args.mib, run))
        finally:
            bed.close()
    nbytes = args.mib << 20
    r, z = statistics.median(raws), statistics.median(pipes)
    print(f"cross-host {args.mib} MiB: raw pyzmq {nbytes / r / 1e6:7.0f} MB/s   zpipes "
          f"(write | broker A | broker B | read) {nbytes / z / 1e6:7.0f} MB/s   ratio "
          f"{r / z:.2f}x   (median of {args.runs})")


if __name__ == "__main__":
    main()
