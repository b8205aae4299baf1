"""A cluster simulation (the seed's "full cluster test case"): N brokers in network namespaces,
and random writers and readers opening, streaming and closing pipes across them for a bounded
time. Every byte is checked; throughput and write-to-read latency are reported.

Sessions of two kinds run concurrently, each with its own pipe:

* bulk: one writer streams seeded random bytes (1 to 8 MiB, in chunks of random sizes) to one
  or two readers on random hosts. Each reader must get either the whole stream, byte for byte,
  or (a second reader that came after the stream started) nothing at all; at least one gets it
  whole. A reader that opens after the stream has ended waits for a writer, like a reader of a
  Unix FIFO: it gives up after a few seconds with nothing, which counts as "nothing".
* latency: one writer sends 100 timestamped lines, a few ms apart, to one reader; the reader
  measures how long each line took (the namespaces share the machine's monotonic clock).

    python tests/netns_simulation.py --brokers 8 --duration 60     # by hand, larger
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

WORKER = r"""
import hashlib, json, random, sys, time, zpipes
role, pipe, size, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role == "bulk-writer":
    rng = random.Random(seed)
    data = rng.randbytes(size)
    t = time.monotonic()
    with zpipes.open(pipe, "w", timeout=60) as w:
        pos = 0
        while pos < size:
            n = rng.choice((1, 100, 4096, 65536, 1 << 20))
            w.write(data[pos:pos + n])
            pos += n
    print(json.dumps({"seconds": time.monotonic() - t}))
elif role == "bulk-reader":
    h, n, waited = hashlib.sha256(), 0, False
    with zpipes.open(pipe, "r", timeout=60) as r:
        r.timeout = 8  # a reader that opens after the whole stream went by waits for ever
        while True:
            try:
                d = r.read1(1 << 20)
            except TimeoutError:
                if n:
                    raise
                waited = True  # it came too late: it saw no stream, which is fine
                break
            if not d:
                break
            r.timeout = 60
            h.update(d)
            n += len(d)
    print(json.dumps({"sha256": h.hexdigest(), "bytes": n, "waited": waited}))
elif role == "latency-writer":
    with zpipes.open(pipe, "w", timeout=60) as w:
        w.write(b"start\n")
        w.flush()  # WRITE_OK: a reader is attached, so what follows is timed fairly
        for i in range(size):
            w.write(b"%d %d\n" % (i, time.monotonic_ns()))
            time.sleep(0.003)
    print(json.dumps({}))
elif role == "latency-reader":
    lat, seq = [], []
    with zpipes.open(pipe, "r", timeout=60) as r:
        assert r.readline() == b"start\n"
        for line in r:
            now = time.monotonic_ns()
            i, t = line.split()
            seq.append(int(i))
            lat.append((now - int(t)) / 1e6)
    print(json.dumps({"latency_ms": lat, "seq": seq}))
"""


@dataclass
class Session:
    kind: str
    pipe: str
    writer_host: object
    reader_hosts: list
    size: int
    seed: int
    procs: list = field(default_factory=list)
    started: float = 0.0


@dataclass
class Report:
    sessions: int = 0
    bulk_bytes: int = 0
    seconds: float = 0.0
    latencies_ms: list = field(default_factory=list)
    failures: list = field(default_factory=list)

    def summary(self) -> str:
        lat = sorted(self.latencies_ms)

        def pct(q):
            return lat[int(q * (len(lat) - 1))] if lat else float("nan")

        return (f"{self.sessions} sessions, {self.bulk_bytes / 1e6:.1f} MB checked in "
                f"{self.seconds:.1f} s ({self.bulk_bytes / 1e6 / max(self.seconds, 1e-9):.1f} "
                f"MB/s overall); write-to-read latency p50 {pct(.5):.2f} ms, p90 {pct(.9):.2f} "
                f"ms, p99 {pct(.99):.2f} ms over {len(lat)} lines; failures: "
                f"{len(self.failures)}")


def _spawn(host, role: str, pipe: str, size: int, seed: int) -> subprocess.Popen:
    return host.python(WORKER, role, pipe, str(size), str(seed), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)


def _start(session: Session, rng: random.Random) -> None:
    s = session
    kind = s.kind
    readers = [(h, f"{kind}-reader") for h in s.reader_hosts]
    writer = (s.writer_host, f"{kind}-writer")
    order = [*readers, writer] if rng.random() < 0.5 else [writer, *readers]
    s.started = time.monotonic()
    for host, role in order:
        s.procs.append((role, _spawn(host, role, s.pipe, s.size, s.seed)))


def _check(session: Session, report: Report) -> None:
    s = session
    expected = hashlib.sha256(random.Random(s.seed).randbytes(s.size)).hexdigest() \
        if s.kind == "bulk" else None
    results = []
    for role, proc in s.procs:
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            report.failures.append(f"{s.pipe} {role}: exit {proc.returncode}: "
                                   f"{err.decode(errors='replace')[-300:]}")
            continue
        results.append((role, json.loads(out)))
    report.sessions += 1
    readers = [r for role, r in results if role.endswith("reader")]
    if s.kind == "bulk":
        whole = [r for r in readers if r["sha256"] == expected and r["bytes"] == s.size]
        empty = [r for r in readers if r["bytes"] == 0]
        if len(whole) + len(empty) != len(readers) or not whole:
            report.failures.append(f"{s.pipe}: readers got {[r['bytes'] for r in readers]} "
                                   f"bytes of {s.size}, not all-or-none")
        report.bulk_bytes += s.size * len(whole)
    else:
        for r in readers:
            if r["seq"] != list(range(s.size)):
                report.failures.append(f"{s.pipe}: lines out of order or missing")
            report.latencies_ms += r["latency_ms"]


def simulate(hosts: list, duration: float, seed: int = 1, concurrency: int = 3) -> Report:
    """Run random sessions over ``hosts`` (their brokers running) for about ``duration`` s."""
    rng = random.Random(seed)
    report = Report()
    running: list[Session] = []
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < duration or running:
        while len(running) < concurrency and time.monotonic() - t0 < duration:
            n += 1
            kind = "latency" if rng.random() < 0.3 else "bulk"
            writer_host = rng.choice(hosts)
            readers = rng.sample(hosts, 1 if kind == "latency" or rng.random() < 0.6 else 2)
            size = 100 if kind == "latency" else rng.randint(1 << 20, 8 << 20)
            session = Session(kind, f"sim-{seed}-{n}", writer_host, readers, size,
                              rng.randrange(1 << 30))
            _start(session, rng)
            running.append(session)
        for session in list(running):
            if all(p.poll() is not None for _, p in session.procs):
                running.remove(session)
                _check(session, report)
            elif time.monotonic() - session.started > 120:
                for _, p in session.procs:
                    p.kill()
        time.sleep(0.05)
    report.seconds = time.monotonic() - t0
    return report


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import netns

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", type=int, default=5)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    why = netns.available()
    if why:
        raise SystemExit(why)
    with tempfile.TemporaryDirectory() as tmp:
        bed = netns.Testbed(args.brokers, Path(tmp))
        try:
            for host in bed.hosts:
                host.start_broker()
            bed.wait_for_cluster()
            report = simulate(bed.hosts, args.duration, args.seed, args.concurrency)
        finally:
            bed.close()
    print(report.summary())
    for failure in report.failures:
        print("FAILED:", failure)
    raise SystemExit(1 if report.failures else 0)


if __name__ == "__main__":
    main()
