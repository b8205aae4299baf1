"""pzq benchmark: produce rate, end-to-end rate and producer ACK latency of a real ``pzq``
process, beside a raw write+fdatasync baseline measured in the same run on the same disk.

    python bench/bench_pzq.py                       # all cases, sync: batch
    python bench/bench_pzq.py --sync none --cases 100:64
    python bench/bench_pzq.py --dir /var/tmp        # where the data goes (default: a temp dir)
    python bench/bench_pzq.py --cases 65536:64 65536:64:1MiB 100:64
    python bench/bench_pzq.py --cases 100:64 --rounds 5   # medians and ranges of 5 rounds

Beside each plain case (SIZE:WINDOW) it runs two baselines on the same case, from
pzq_baselines.py: a bare Python relay of the same wire, and Redis Streams with appendfsync
always when redis-server and the redis package are there (``pip install -e .[bench]``); it
prints pzq's ratios against both, end to end and in server CPU per message. Beside a case
with a byte window it runs the relay with that byte window: it writes nothing, so it is the
most any queue could make of the case with these clients on this machine.

A case is SIZE:WINDOW[:backlog][:BYTES] (message bytes : producer messages outstanding, and
with BYTES at most that many bytes of bodies outstanding: a byte window, as the client's
``Producer(max_inflight_bytes=...)``). The producer and the consumer are separate processes (the
consumer ACKs each message); the queue is started fresh for each case, with an empty data
directory. With ``backlog`` the consumer connects only after the last producer ACK, so every
message is written and fsynced (no write avoidance); its end-to-end rate includes the drain.
With ``batch`` the case runs the batch path: the client's Producer packs up to 256 messages a
batch (and at most half of WINDOW, the most messages unACKed), the consumer takes batches on
the credit endpoint and ACKs each batch in one message; Redis Streams runs beside it
pipelining 64 (its best here; the bare relay speaks only the original wire). A batch case
with a byte window (65536:64:batch:1MiB) has neither beside it: with ``--rounds`` its
ratio is to the raw write of 1 MiB + fdatasync measured before each round.

At the end it checks the queue's speed targets against the run (medians over the rounds):
the batch path against Redis Streams, the original wire against the bare relay, 64 KiB with
a 1 MiB byte window against the raw write. A target in µs of server CPU is checked as it is
and scaled by this run's baseline over the one it was set against (TARGETS_SET_ON): this
machine's speed varies from run to run by up to 2x, for the queue and its baselines alike.

Metrics (``--metrics``): each case through a queue hosted by a broker, once without metrics
and once with the broker's metrics endpoint scraped every second (as Prometheus would),
interleaved (``--metrics-runs`` times each); it prints both and the difference, and what the
one count the ACK path keeps for metrics (the latency histogram) costs a message.

The ACK latency of a producer that keeps its window full is, on average, what it has in flight
divided by the rate (Little's law): 64 messages of 64 KiB at 400 MB/s is 10.5 ms before any
queueing jitter, which is why the byte-window case exists. The raw baselines printed first
(write + fdatasync of 100 B, 1 MiB and 4 MiB in a loop, same disk, same run) are the disk's own
latency and ceiling for comparison.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq
from pzq_baselines import cpu_seconds, redis_case, redis_missing, relay_case
from pzq_load import ack_arrived, free_port, produce_windowed

from zbroker.config import parse_size
from zbroker.services.pzq.core.group_commit import DEFAULT_SYNC, SYNC_MODES

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ("100:1", "100:64", "100:64:backlog", "100:256:batch", "100:64:batch",
                 "65536:1", "65536:64", "65536:64:1MiB", "65536:64:batch:1MiB",
                 "65536:64:backlog", "65536:64:backlog:1MiB")
BATCH = 256  # messages in a batch of the batch path's producer
#: the queue's speed targets, and the baselines of the run they were set against (Redis
#: Streams' and the bare relay's server CPU a message, on a 2-core machine): a target in µs
#: is also checked scaled by this run's baseline over that one, as this machine's speed
#: varies from run to run by up to 2x
TARGETS_SET_ON = {"redis": 10.2, "relay": 46.0}


def fsync_baseline(directory: Path, seconds: float = 1.0) -> tuple[float, float]:
    """(appends per second, p50 µs) of write(100 B) + fdatasync in a loop."""
    path = directory / "fsync-baseline"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lat = []
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            t = time.perf_counter()
            os.write(fd, b"x" * 100)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        path.unlink()
    return len(lat) / seconds, statistics.median(lat) * 1e6


def write_baseline(directory: Path, chunk: int, seconds: float = 1.0
                   ) -> tuple[float, float, float]:
    """(MB/s, p50 ms, p99 ms) of write(chunk) + fdatasync in a loop: the disk's own ceiling
    and latency for batches of big messages."""
    path = directory / "write-baseline"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    buf = os.urandom(chunk)
    lat = []
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            os.write(fd, buf)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
    finally:
        elapsed = time.perf_counter() - t0
        os.close(fd)
        path.unlink()
    lat.sort()
    return (len(lat) * chunk / elapsed / 1e6, lat[len(lat) // 2] * 1e3,
            lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3)


def producer(endpoint: str, n: int, size: int, window: int, max_bytes: int | None,
             start: float, out) -> None:
    bound = window if max_bytes is None else max(1, min(window, max_bytes // size))
    try:
        p = produce_windowed(endpoint, n, size, bound, start=start, ack_wait=10.0)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None
    out.send((p.t0, p.t_end - p.t0, p.lat, p.failed))


def batch_producer(endpoint: str, n: int, size: int, window: int, max_bytes: int | None,
                   start: float, out) -> None:
    """The batch path: the client's Producer gathering up to BATCH messages a batch (at
    most half the window), at most ``window`` messages unACKed; the ACK latency of each
    message is timed."""
    from pzq.client import Producer

    sent_at: dict[bytes, float] = {}
    lat: list[float] = []
    failed = 0

    def on_ack(msg_id: bytes, ok: bool, _text: str) -> None:
        nonlocal failed
        lat.append(time.monotonic() - sent_at.pop(msg_id))
        failed += not ok

    body = b"x" * size
    with Producer(endpoint, window=window, batch=BATCH, on_ack=on_ack,
                  max_inflight_bytes=max_bytes) as p:
        while time.time() < start:
            time.sleep(0.001)
        t0 = time.monotonic()
        for i in range(n):
            mid = b"%d" % i
            sent_at[mid] = time.monotonic()
            p.send(body, msg_id=mid)
        p.flush(60)
        out.send((t0, time.monotonic() - t0, lat, failed))


def batch_consumer(endpoint: str, n: int, window: int, out) -> None:
    """A batch consumer of the credit endpoint: takes what came, ACKs it in one message."""
    from pzq.client import Consumer

    got = 0
    last = 0.0
    with Consumer(endpoint, credit=window, credit_bytes=4 << 20) as c:
        while got < n:
            batch = c.recv_many(window, timeout=20)
            if not batch:
                raise SystemExit(f"consumer: nothing for 20 s after {got} messages")
            c.ack_many(batch)
            got += len(batch)
            last = time.monotonic()
        c.confirm(10)
    out.send((last, got))


def consumer(endpoint: str, n: int, out) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 2000)
    s.connect(endpoint)
    got = 0
    last = 0.0
    while got < n:
        if not s.poll(20_000):
            raise SystemExit(f"consumer: nothing for 20 s after {got} messages")
        got += len(ack_arrived(s))
        last = time.monotonic()
    s.close()
    ctx.term()
    out.send((last, got))


def wait_listening(endpoint: str, timeout: float = 10.0) -> None:
    """Until the tcp://127.0.0.1:PORT ``endpoint`` takes connections (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", int(endpoint.rsplit(":", 1)[1]))) == 0:
                return
        time.sleep(0.05)


def start_pzq(data: Path, sync: str, window_us: int, max_sync: int | None
              ) -> tuple[subprocess.Popen, str, str, str, str]:
    receive = f"tcp://127.0.0.1:{free_port()}"
    send = f"tcp://127.0.0.1:{free_port()}"
    credit = f"tcp://127.0.0.1:{free_port()}"
    mon = f"ipc://{data}.monitor"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "zbroker.services.pzq", "--database", str(data),
         "--receive-dsn", receive,
         "--send-dsn", send, "--credit-dsn", credit, "--monitor-dsn", mon, "--sync", sync,
         "--sync-window", str(window_us), "--inflight-window", "256",
         "--max-backlog", "2GiB", "--log-level", "warning",
         *(["--sync-max-bytes", str(max_sync)] if max_sync else [])],
        env=env, stdin=subprocess.DEVNULL)
    wait_listening(send)
    return proc, receive, send, credit, mon


def start_broker_queue(data: Path, sync: str, window_us: int, max_sync: int | None,
                       metrics_port: int | None = None
                       ) -> tuple[subprocess.Popen, str, str, str, str]:
    """The same queue hosted by a broker (``services.pzq``), with or without metrics."""
    import uuid

    import yaml

    receive = f"tcp://127.0.0.1:{free_port()}"
    send = f"tcp://127.0.0.1:{free_port()}"
    credit = f"tcp://127.0.0.1:{free_port()}"
    mon = f"ipc://{data}.monitor"
    queue = {"data_dir": str(data), "receive_endpoint": receive, "send_endpoint": send,
             "credit_endpoint": credit, "monitor_endpoint": mon, "sync": sync,
             "sync_window": window_us / 1e6,
             "inflight_window": 256, "max_backlog": "2GiB",
             **({"sync_max_bytes": max_sync} if max_sync else {})}
    config = {"broker": {"run_dir": f"{data}.run"}, "log": {"level": "warning"},
              "services": {"zpipes": {"enabled": False},
                           "pzq": {"enabled": True, "queues": {"bench": queue}}},
              **({"metrics": {"bind": f"127.0.0.1:{metrics_port}"}} if metrics_port else {})}
    path = Path(f"{data}.cfg")
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "zbroker", f"bench-{uuid.uuid4().hex[:8]}",
                             "--config", str(path)], env=env, stdin=subprocess.DEVNULL)
    wait_listening(send)
    return proc, receive, send, credit, mon


def histogram_cost(samples: int = 200_000) -> float:
    """Microseconds that one producer ACK's latency observation costs (QueueCore's
    producer side)."""
    import timeit

    from zbroker.services.pzq.core.queue import QueueCore

    producers = QueueCore().producers
    key = b"%d|%s%012x" % (time.time_ns() // 1000, b"x" * 24, 1)
    now_us = time.time_ns() // 1000 + 1500
    return timeit.timeit(lambda: producers.ack_latency_of(key, now_us),
                         number=samples) / samples * 1e6


def metrics_cost(base: Path, cases: list[str], sync: str, window_us: int,
                 max_sync: int | None, scale: float, runs: int) -> None:
    from scraper import Scraper

    print(f"pzq hosted by a broker, metrics off and on (scraped every 1 s), sync={sync}")
    for case in cases:
        parts = case.split(":")
        size, window = int(parts[0]), int(parts[1])
        n = int((2_000 if window == 1 else 60_000 if size < 4096 else 6_000) * scale)
        got: dict[str, list[dict]] = {"off": [], "on": []}
        scrapes = 0
        for _ in range(runs):  # interleaved, so that noise hits both alike
            got["off"].append(run_case(base, size, window, n, sync, window_us,
                                       max_sync=max_sync, start=start_broker_queue))
            port = free_port()
            scraper = Scraper(port)
            try:
                got["on"].append(run_case(
                    base, size, window, n, sync, window_us, max_sync=max_sync,
                    start=lambda d, s, w, m, port=port: start_broker_queue(d, s, w, m, port),
                    started=lambda proc, scraper=scraper: scraper.__enter__()))
            finally:
                scraper.__exit__()
            scrapes += scraper.scrapes
        e2e = {k: statistics.median(r["e2e"] for r in v) for k, v in got.items()}
        cpu = {k: statistics.median(r["cpu_us"] for r in v) for k, v in got.items()}
        p99 = {k: statistics.median(r["p99"] for r in v) for k, v in got.items()}
        print(f"{size:>6} B, window {window:>3}: off {e2e['off']:>9,.0f} msg/s "
              f"{cpu['off']:5.1f} µs/msg p99 {p99['off']:5.2f} ms   on {e2e['on']:>9,.0f} msg/s "
              f"{cpu['on']:5.1f} µs/msg p99 {p99['on']:5.2f} ms ({scrapes} scrapes)   "
              f"difference: e2e {(e2e['on'] / e2e['off'] - 1) * 100:+.1f} %, CPU "
              f"{(cpu['on'] / cpu['off'] - 1) * 100:+.1f} %   (median of {runs})")
    cost = histogram_cost()
    print(f"the ACK latency histogram (always kept): {cost:.2f} µs a message")


def monitor(endpoint: str) -> dict[str, int]:
    from pzq.wire import parse_monitor_text

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send(b"MONITOR")
    counters = parse_monitor_text(s.recv_multipart()[-1]) if s.poll(3000) else {}
    s.close()
    return counters


def run_case(base: Path, size: int, window: int, n: int, sync: str, window_us: int,
             backlog: bool = False, max_bytes: int | None = None,
             max_sync: int | None = None, batch: bool = False, start=start_pzq,
             started=None) -> dict:
    """``start``: what runs the queue (start_pzq, start_broker_queue); ``started(proc)`` is
    called once it listens."""
    data = base / f"q-{size}-{window}"
    shutil.rmtree(data, ignore_errors=True)
    proc, receive, send, credit, mon = start(data, sync, window_us, max_sync)
    if started is not None:
        started(proc)
    ctx = mp.get_context("fork")
    (p_in, p_out), (c_in, c_out) = ctx.Pipe(False), ctx.Pipe(False)
    start = time.time() + 0.5
    cpu0 = cpu_seconds(proc.pid)
    if batch:
        cons = ctx.Process(target=batch_consumer, args=(credit, n, window, c_out))
    else:
        cons = ctx.Process(target=consumer, args=(send, n, c_out))
    prod = ctx.Process(target=batch_producer if batch else producer,
                       args=(receive, n, size, window, max_bytes, start, p_out))
    if not backlog:
        cons.start()
    prod.start()
    try:
        if not p_in.poll(300):
            raise SystemExit("benchmark case timed out")
        t0, elapsed, lat, failed = p_in.recv()
        if backlog:
            cons.start()
        if not c_in.poll(120):
            raise SystemExit("benchmark case timed out")
        last, got = c_in.recv()
        cpu = cpu_seconds(proc.pid) - cpu0
        counters = monitor(mon)
    finally:
        for p in (prod, cons):
            p.join(10)
            if p.is_alive():
                p.kill()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        shutil.rmtree(data, ignore_errors=True)
    lat.sort()
    e2e = n / (last - t0)  # the first send to the last delivery (one monotonic clock)
    return {
        "size": size, "window": window, "n": n, "failed": failed,
        "produce": n / elapsed, "e2e": e2e, "mbps": e2e * size / 1e6,
        "p50": lat[len(lat) // 2] * 1e3, "p99": lat[int(len(lat) * 0.99)] * 1e3,
        "cpu_us": cpu / n * 1e6,  # the queue process's CPU per message
        "syncs": counters.get("syncs", -1), "avoided": counters.get("avoided_messages", -1),
        "written": counters.get("bytes_written", -1),
    }


def baselines(size: int, window: int, n: int, ours: dict, batch: bool = False,
              max_bytes: int | None = None) -> dict[str, dict]:
    """The bare relay (of the original wire: not for the batch path) and Redis Streams on
    the same case, and pzq's ratios against them; returns their figures by name. With a
    byte window, the relay only (with the same byte window): it writes nothing, so it is
    the most a queue could make of that case on this machine."""
    rows = [] if batch else [("relay", relay_case(size, window, n, producer, consumer,
                                                  max_bytes))]
    why = redis_missing() if max_bytes is None else "not run with a byte window"
    if why is None:  # Redis pipelining at most 64 (the faster; more is slower here)
        rows.append(("redis", redis_case(size, min(window, 64), n)))
    for name, b in rows:
        print(f"{'':>6} {name:>12} {'':>7} {n:>7} {b['produce']:>10,.0f} {b['e2e']:>10,.0f} "
              f"{b['e2e'] * size / 1e6:>9,.1f} {b['p50']:>10.2f} {b['p99']:>10.2f} {'':>7} "
              f"{'':>10} {'':>8} {b['cpu_us']:>10.1f}")
    skipped = "" if why is None else f"Redis Streams skipped: {why}"
    if rows:
        print("       pzq/" + ", pzq/".join(
            f"{name}: e2e {ours['e2e'] / b['e2e']:.2f}x, server CPU a message "
            f"{ours['cpu_us'] / b['cpu_us']:.2f}x" for name, b in rows)
            + (f"  ({skipped})" if skipped else ""))
    else:  # a batch case with a byte window: only the raw write (at the top, or per round)
        print(f"       (no relay: it speaks only the original wire; {skipped})")
    return dict(rows)


def summary(case: str, rounds: list[tuple[dict, dict[str, dict]]]) -> None:
    """Medians and ranges over the rounds of one case: pzq's end-to-end rate and server CPU,
    and its ratios to each baseline of the same round (the raw write of 1 MiB + fdatasync
    measured just before it, for a case with a byte window), and the bare relay's to the
    raw write (the relay stores nothing: the most a queue could reach with these clients).
    A backlog case also gets its produce rate's ratio to the raw write: each of its
    messages is ACKed once written and fdatasynced, so that is the log's own rate."""
    def spread(values: list[float], fmt: str) -> str:
        return (f"{statistics.median(values):{fmt}} "
                f"[{min(values):{fmt}}-{max(values):{fmt}}]")

    line = (f"{case}, median [range] of {len(rounds)} rounds: pzq e2e "
            f"{spread([r['e2e'] for r, _ in rounds], ',.0f')} msg/s, "
            f"{spread([r['mbps'] for r, _ in rounds], ',.1f')} MB/s, server CPU "
            f"{spread([r['cpu_us'] for r, _ in rounds], '.1f')} µs a message")
    for name in rounds[0][1]:
        key = "mbps" if name == "raw" else "e2e"
        line += f"; pzq/{name} " + spread([r[key] / b[name][key] for r, b in rounds],
                                          ".2f") + "x"
    if "backlog" in case.split(":") and "raw" in rounds[0][1]:
        # every message written and fdatasynced before its ACK: the produce rate is the log's
        line += "; produced/raw " + spread([r["produce"] * r["size"] / 1e6 / b["raw"]["mbps"]
                                            for r, b in rounds], ".2f") + "x"
    if "raw" in rounds[0][1] and "relay" in rounds[0][1]:  # the most any queue could reach
        line += "; relay/raw " + spread([b["relay"]["e2e"] * r["size"] / 1e6 / b["raw"]["mbps"]
                                         for r, b in rounds], ".2f") + "x"
    print(line)


def targets(results: dict[str, list[tuple[dict, dict[str, dict]]]], raw_mbps: float
            ) -> None:
    """The queue's speed targets against this run's figures (medians over the rounds): the
    batch path (100:256:batch) against Redis Streams, the original wire (100:64) against the
    bare relay, 64 KiB with a 1 MiB byte window against the raw 1 MiB write + fdatasync
    (``raw_mbps``, or the one measured before each round). A target in µs is checked as it
    is, and scaled by this run's baseline (TARGETS_SET_ON)."""
    rows: list[tuple[str, str, bool]] = []  # (target, this run's figure, met)

    def median(case: str, figure) -> float:
        return statistics.median(figure(r, b) for r, b in results[case])

    batch, wire = "100:256:batch", "100:64"
    if batch in results and "redis" in results[batch][0][1]:
        ratio = median(batch, lambda r, b: r["e2e"] / b["redis"]["e2e"])
        rows.append(("batch path: e2e >= 3x Redis Streams", f"{ratio:.2f}x", ratio >= 3))
        cpu = median(batch, lambda r, b: r["cpu_us"])
        theirs = median(batch, lambda r, b: b["redis"]["cpu_us"])
        rows.extend(_cpu_target("batch path", cpu, 8, "Redis'", theirs,
                                TARGETS_SET_ON["redis"]))
        p99 = median(batch, lambda r, b: r["p99"])
        rows.append(("batch path: ACK p99 <= 10 ms", f"{p99:.2f} ms", p99 <= 10))
    if wire in results and "relay" in results[wire][0][1]:
        cpu = median(wire, lambda r, b: r["cpu_us"])
        theirs = median(wire, lambda r, b: b["relay"]["cpu_us"])
        rows.extend(_cpu_target("original wire", cpu, 50, "the relay's", theirs,
                                TARGETS_SET_ON["relay"]))
        ratio = median(wire, lambda r, b: r["e2e"] / b["relay"]["e2e"])
        rows.append(("original wire: e2e >= 0.9x the bare relay", f"{ratio:.2f}x",
                     ratio >= 0.9))
    for case in ("65536:64:1MiB", "65536:64:batch:1MiB"):
        if case in results:
            ratio = median(case, lambda r, b: r["mbps"] / b.get("raw", {"mbps": raw_mbps})["mbps"])
            rows.append((f"{case}: e2e >= 0.9x raw 1 MiB write+fdatasync", f"{ratio:.2f}x",
                         ratio >= 0.9))
    if rows:
        print(f"targets (medians of {len(next(iter(results.values())))} round(s)):")
        for target, figure, met in rows:
            print(f"  {target:<76} {figure:>9}  {'met' if met else 'NOT MET'}")


def _cpu_target(path: str, cpu: float, bound: float, whose: str, theirs: float,
                then: float) -> list[tuple[str, str, bool]]:
    """A server CPU target in µs a message: as it is, and scaled by this run's baseline."""
    scaled = bound * theirs / then
    return [(f"{path}: server CPU <= {bound:g} µs a message", f"{cpu:.1f} µs", cpu <= bound),
            (f"  scaled by {whose} CPU ({theirs:.1f} µs here, {then:g} then): "
             f"<= {scaled:.1f} µs", f"{cpu:.1f} µs", cpu <= scaled)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=list(DEFAULT_CASES), metavar="SIZE:WINDOW")
    ap.add_argument("--sync", default=DEFAULT_SYNC, choices=SYNC_MODES)
    ap.add_argument("--sync-window", type=int, default=2000, metavar="US")
    ap.add_argument("--sync-max-bytes", type=parse_size, default=None, metavar="BYTES",
                    help="the queue's sync_max_bytes (default: the queue's default)")
    ap.add_argument("--dir", default=None, help="where the queue's data goes")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    ap.add_argument("--no-baselines", action="store_true",
                    help="skip the bare relay and Redis Streams runs beside each plain case")
    ap.add_argument("--metrics", action="store_true",
                    help="only: a broker-hosted queue with metrics off and on, in the same run")
    ap.add_argument("--metrics-runs", type=int, default=2, metavar="N")
    ap.add_argument("--rounds", type=int, default=1, metavar="N",
                    help="run each case N times, its baselines beside each run, and print "
                         "the medians and ranges of pzq's figures and ratios")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-pzq-", dir=args.dir))
    if args.metrics:
        try:
            cases = args.cases if args.cases != list(DEFAULT_CASES) else ["100:64", "65536:64"]
            metrics_cost(base, cases, args.sync, args.sync_window, args.sync_max_bytes,
                         args.scale, args.metrics_runs)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return
    try:
        rate, p50 = fsync_baseline(base)
        print(f"raw write(100 B)+fdatasync on {base}: {rate:,.0f}/s, p50 {p50:.0f} µs")
        raw_mbps = {}
        for chunk in (1 << 20, 4 << 20):
            raw_mbps[chunk], c50, c99 = write_baseline(base, chunk)
            print(f"raw write({chunk >> 20} MiB)+fdatasync: {raw_mbps[chunk]:,.0f} MB/s, "
                  f"p50 {c50:.2f} ms, p99 {c99:.2f} ms")
        results: dict[str, list[tuple[dict, dict[str, dict]]]] = {}
        print(f"pzq sync={args.sync} sync_window={args.sync_window} µs sync_max_bytes="
              + (str(args.sync_max_bytes) if args.sync_max_bytes else "default"))
        print(f"{'size':>6} {'in flight':>12} {'':>7} {'msgs':>7} {'produce/s':>10} "
              f"{'e2e msg/s':>10} {'e2e MB/s':>9} {'ack p50 ms':>10} {'ack p99 ms':>10} "
              f"{'fsyncs':>7} {'msgs/fsync':>10} {'avoided':>8} {'cpu µs/msg':>10}")
        for case in args.cases:
            parts = case.split(":")
            size, window = int(parts[0]), int(parts[1])
            backlog = "backlog" in parts[2:]
            batch = "batch" in parts[2:]
            byte_window = [p for p in parts[2:] if p not in ("backlog", "batch")]
            max_bytes = parse_size(byte_window[0]) if byte_window else None
            n = int((2_000 if window == 1 else 60_000 if size < 4096 else 6_000)
                    * (4 if batch and size < 4096 else 1) * args.scale)
            rounds = []
            for _ in range(max(1, args.rounds)):
                theirs: dict[str, dict] = {}
                if args.rounds > 1 and byte_window and not args.no_baselines:
                    mbps, _, _ = write_baseline(base, 1 << 20)
                    theirs["raw"] = {"mbps": mbps}
                    print(f"raw write(1 MiB)+fdatasync: {mbps:,.0f} MB/s")
                r = run_case(base, size, window, n, args.sync, args.sync_window, backlog,
                             max_bytes, args.sync_max_bytes, batch)
                per = r["n"] / r["syncs"] if r["syncs"] > 0 else float("nan")
                mode = "backlog" if backlog else "batch" if batch else ""
                flight = f"{window} msgs" + (f"/{byte_window[0]}" if byte_window else "")
                print(f"{size:>6} {flight:>12} {mode:>7} {n:>7} {r['produce']:>10,.0f} "
                      f"{r['e2e']:>10,.0f} "
                      f"{r['mbps']:>9,.1f} {r['p50']:>10.2f} {r['p99']:>10.2f} "
                      f"{r['syncs']:>7} {per:>10.1f} {r['avoided']:>8} {r['cpu_us']:>10.1f}"
                      + (f"  FAILED {r['failed']}" if r["failed"] else ""))
                if not args.no_baselines and not backlog and window > 1:
                    theirs.update(baselines(size, window, n, r, batch, max_bytes))
                rounds.append((r, theirs))
            if args.rounds > 1:
                summary(case, rounds)
            results[case] = rounds
        targets(results, raw_mbps[1 << 20])
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
