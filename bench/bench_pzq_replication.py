"""pzq replication benchmark: what copies over the cluster cost, with real broker processes.

    python bench/bench_pzq_replication.py                 # every case
    python bench/bench_pzq_replication.py --quick         # fewer messages, a quick look
    python bench/bench_pzq_replication.py --messages 50000 --dir /var/tmp

Each broker is ``python -m zbroker NAME --config FILE`` in its own temporary directory (its
working directory, XDG_RUNTIME_DIR and data), hosting the queue ``jobs`` (``sync: batch``) and
joined to the others as a static cluster peer on 127.0.0.1 (``discovery: false``: never
multicast). The producer and the consumer are separate processes on raw DEALER sockets, as in
bench_pzq.py; the consumer ACKs each message. A fresh cluster is started for each case. Cases:

1. 100 B messages, producer window 64, on 1 broker with ``replicas: 0`` (the baseline of
   this run), 2 brokers with ``replicas: 1`` and 3 brokers with ``replicas: 2``. Twice each:
   with a consumer connected (produce rate until the last producer ACK, end-to-end rate until
   the last delivery, producer ACK latency), then with no consumer (produce rate alone; the
   copies stay on the holders, whose ``replicas_held`` is checked, then a consumer drains).
   Ratios are to the baseline of the same run.
2. 64 KiB messages, window 16, ``replicas`` 0 vs 1: MB/s and ratios, as above.
3. Takeover: 2 brokers, ``replicas: 1``, N messages produced and not ACKed, a consumer
   waiting on the holder; the origin is SIGKILLed. Times from the kill until the holder's
   ``replicas_taken_over`` reaches N, until its consumer gets the first message, and all N.
   The loss is detected by the cluster's heartbeat, so ``--peer-timeout`` (1 s by default,
   for this case only) dominates.

The counters printed show that the copies really went: ``replicated`` (messages whose copies
were all confirmed before the producer ACK) and ``replication_failed`` at the origin,
``replicas_held`` / ``replicas_taken_over`` at each holder.

Every process started is stopped at the end, also on error or Ctrl-C (SIGTERM, then SIGKILL),
and the temporary directories are removed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
import zmq
from pzq_load import ack_arrived, free_port, produce_windowed

from pzq.client import monitor

REPO_ROOT = Path(__file__).resolve().parents[1]
QUEUE = "jobs"
THROUGHPUT_PEER_TIMEOUT = 3.0  # the broker's default: no spurious loss under load

# everything started, for the final clean-up: broker Popens and multiprocessing children
_BROKERS: list[subprocess.Popen[bytes]] = []
_CHILDREN: list[Any] = []


# --- helpers ----------------------------------------------------------------------------------


def accepts(endpoint: str) -> bool:
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, int(port))) == 0


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


class BenchError(Exception):
    pass


# --- brokers ----------------------------------------------------------------------------------


class Broker:
    """One broker process in its own directory."""

    def __init__(self, base: Path, label: str, config: dict[str, Any]):
        self.label = label
        self.name = f"{label}-{uuid.uuid4().hex[:8]}"
        self.dir = base / label
        self.dir.mkdir(parents=True)
        self.config = config
        q = config["services"]["pzq"]["queues"][QUEUE]
        self.receive, self.send = q["receive_endpoint"], q["send_endpoint"]
        self.monitor_endpoint = q["monitor_endpoint"]
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    def start(self) -> None:
        cfg = self.dir / "zbroker.cfg"
        cfg.write_text(yaml.safe_dump(self.config, sort_keys=False), encoding="utf-8")
        env = dict(os.environ, XDG_RUNTIME_DIR=str(self.dir))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                          env.get("PYTHONPATH")]))
        self._stderr = open(self.dir / "stderr.txt", "wb")  # a file: never a full pipe
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zbroker", self.name, "--config", str(cfg)],
            cwd=self.dir, env=env, stdin=subprocess.DEVNULL, stdout=self._stderr,
            stderr=self._stderr)
        _BROKERS.append(self.proc)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu(self) -> float:
        """CPU seconds (user + system) the broker used so far; NaN if unknown."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, AttributeError):
            return float("nan")

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = (self.dir / "stderr.txt").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if not self.alive():
            raise BenchError(f"broker {self.label} exited "
                             f"({self.proc and self.proc.returncode}):\n{self.stderr_tail()}")

    def wait_up(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not accepts(self.receive):
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"broker {self.label}: queue not up within {timeout} s")
            time.sleep(0.05)

    def counters(self) -> dict[str, int]:
        self.check_alive()
        return monitor(self.monitor_endpoint, timeout=5.0)

    def wait(self, what: str, predicate: Callable[[dict[str, int]], bool],
             timeout: float = 20.0, interval: float = 0.02) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while True:
            c = self.counters()
            if predicate(c):
                return c
            if time.monotonic() > deadline:
                raise BenchError(f"broker {self.label}: no {what} within {timeout} s "
                                 f"(counters {c})")
            time.sleep(interval)

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


class Cluster:
    """``count`` brokers, every one a static cluster peer of every other, each hosting
    ``jobs`` with ``replicas``; broker 0 is the origin the producers use."""

    def __init__(self, base: Path, label: str, count: int, replicas: int, peer_timeout: float,
                 queue_extra: dict[str, Any]):
        self.dir = base / label
        ports = [free_port() for _ in range(count)]
        self.brokers = []
        for i in range(count):
            bdir = self.dir / f"b{i}"
            mon = f"ipc://{bdir}/{QUEUE}.monitor"
            if len(mon) - 6 > getattr(zmq, "IPC_PATH_MAX_LEN", 107):
                mon = f"ipc://@/bench-pzq-replication/{uuid.uuid4().hex}/{QUEUE}.monitor"
            config = {
                "log": {"level": "warning"},
                "cluster": {"enabled": True, "discovery": False, "insecure": True,
                            "peer_timeout": peer_timeout,
                            "bind": f"tcp://127.0.0.1:{ports[i]}",
                            "peers": [f"tcp://127.0.0.1:{p}" for j, p in enumerate(ports)
                                      if j != i]},
                "services": {"pzq": {"enabled": True, "queues": {QUEUE: {
                    "receive_endpoint": f"tcp://127.0.0.1:{free_port()}",
                    "send_endpoint": f"tcp://127.0.0.1:{free_port()}",
                    "monitor_endpoint": mon,
                    "data_dir": str(bdir / "data"),
                    "sync": "batch", "replicas": replicas, "inflight_window": 256,
                    "max_backlog": 2 << 30, **queue_extra}}}},
            }
            self.brokers.append(Broker(self.dir, f"b{i}", config))
        self.replicas = replicas

    @property
    def origin(self) -> Broker:
        return self.brokers[0]

    @property
    def holders(self) -> list[Broker]:
        return self.brokers[1:]

    def __enter__(self) -> Cluster:
        try:
            for b in self.brokers:
                b.start()
            for b in self.brokers:
                b.wait_up()
            if self.replicas:
                self.origin.wait(f"{self.replicas} replica holder(s)",
                                 lambda c: c.get("replica_holders") == self.replicas, 30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for b in reversed(self.brokers):  # holders first: no takeover of the origin's copies
            b.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- client processes -------------------------------------------------------------------------


def producer(endpoint: str, n: int, size: int, window: int, tag: bytes, start: float,
             out: Any) -> None:
    """Send ``n`` messages keeping ``window`` unACKed; report the ACK latencies."""
    try:
        p = produce_windowed(endpoint, n, size, window, tag + b"-", start)
        out.send({"t0": p.t0, "t_end": p.t_end, "lat": p.lat, "failed": p.failed,
                  "repl_failed": p.repl_failed})
    except BaseException as exc:  # the parent reports it
        out.send({"error": f"{type(exc).__name__}: {exc}"})


def consumer(endpoint: str, n: int, first_timeout: float, out: Any) -> None:
    """ACK each message until ``n`` distinct keys came; report the first and last time."""
    try:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 2000)
        s.connect(endpoint)
        keys: set[bytes] = set()
        got = 0
        t_first = t_last = 0.0
        wait_ms = int(first_timeout * 1000)
        while len(keys) < n:
            if not s.poll(wait_ms):
                raise BenchError(f"consumer: nothing for {wait_ms / 1000:.0f} s after "
                                 f"{got} messages")
            wait_ms = 20_000
            arrived = ack_arrived(s)
            keys.update(arrived)
            got += len(arrived)
            t_last = time.monotonic()
            if not t_first:
                t_first = t_last
        s.close()
        ctx.term()
        out.send({"t_first": t_first, "t_last": t_last, "got": got, "unique": len(keys)})
    except BaseException as exc:
        out.send({"error": f"{type(exc).__name__}: {exc}"})


def spawn(target: Callable[..., None], *args: Any) -> tuple[Any, Any]:
    ctx = mp.get_context("fork")
    recv_end, send_end = ctx.Pipe(False)
    p = ctx.Process(target=target, args=(*args, send_end), daemon=True)
    p.start()
    _CHILDREN.append(p)
    return p, recv_end


def result(proc: Any, pipe: Any, timeout: float, watch: list[Broker]) -> dict[str, Any]:
    """The child's report; fails early when a broker of ``watch`` dies."""
    deadline = time.monotonic() + timeout
    while not pipe.poll(0.2):
        for b in watch:
            b.check_alive()
        if time.monotonic() > deadline or not proc.is_alive() and not pipe.poll(0.2):
            proc.kill()
            raise BenchError(f"{proc.name}: no result within {timeout} s")
    r = pipe.recv()
    proc.join(10)
    if "error" in r:
        raise BenchError(r["error"])
    return r


# --- cases ------------------------------------------------------------------------------------


def throughput(base: Path, brokers: int, replicas: int, size: int, window: int, n: int,
               queue_extra: dict[str, Any]) -> dict[str, Any]:
    """One cluster: a run with a consumer connected, then a run with none (the copies stay
    on the holders) and its drain."""
    label = f"{brokers}b-r{replicas}-{size}"
    r: dict[str, Any] = {"brokers": brokers, "replicas": replicas, "size": size,
                         "window": window, "n": n}
    with Cluster(base, label, brokers, replicas, THROUGHPUT_PEER_TIMEOUT, queue_extra) as c:
        o = c.origin
        # live: producer and consumer together
        cpu0 = [b.cpu() for b in c.brokers]
        cp, cpipe = spawn(consumer, o.send, n, 60.0)
        pp, ppipe = spawn(producer, o.receive, n, size, window, b"live", time.time() + 0.5)
        pr = result(pp, ppipe, 600, c.brokers)
        cr = result(cp, cpipe, 600, c.brokers)
        r["cpu_live"] = [(b.cpu() - t) * 1e3 / n * 1000 for b, t in zip(c.brokers, cpu0,
                                                                          strict=True)]
        lat = sorted(pr["lat"])
        r.update(produce=n / (pr["t_end"] - pr["t0"]), e2e=n / (cr["t_last"] - pr["t0"]),
                 p50=pct(lat, 0.5) * 1e3, p99=pct(lat, 0.99) * 1e3, failed=pr["failed"],
                 repl_failed=pr["repl_failed"])
        for h in c.holders:  # the consumer ACKed everything: the copies are dropped
            h.wait("copies dropped", lambda s: s.get("replicas_held") == 0)
        # held: no consumer, the copies stay on the holders
        cpu0 = [b.cpu() for b in c.brokers]
        pp, ppipe = spawn(producer, o.receive, n, size, window, b"held", time.time() + 0.2)
        pr = result(pp, ppipe, 600, c.brokers)
        r["cpu_alone"] = [(b.cpu() - t) * 1e3 / n * 1000 for b, t in zip(c.brokers, cpu0,
                                                                           strict=True)]
        r.update(produce_alone=n / (pr["t_end"] - pr["t0"]),
                 failed=r["failed"] + pr["failed"],
                 repl_failed_alone=pr["repl_failed"])
        lat = sorted(pr["lat"])
        r.update(p50_alone=pct(lat, 0.5) * 1e3, p99_alone=pct(lat, 0.99) * 1e3)
        r["held"] = [h.counters() for h in c.holders]
        t_drain = time.monotonic()
        cp, cpipe = spawn(consumer, o.send, n, 60.0)
        cr = result(cp, cpipe, 600, c.brokers)
        r["drain"] = n / (cr["t_last"] - t_drain)
        r["drained"] = [h.wait("copies dropped after the drain",
                               lambda s: s.get("replicas_held") == 0) for h in c.holders]
        r["origin"] = o.counters()
    return r


def takeover(base: Path, n: int, peer_timeout: float, queue_extra: dict[str, Any]
             ) -> dict[str, Any]:
    r: dict[str, Any] = {"n": n, "peer_timeout": peer_timeout}
    with Cluster(base, "takeover", 2, 1, peer_timeout, queue_extra) as c:
        origin, holder = c.brokers
        # waiting on the holder from the start: it gets nothing while the origin lives
        cp, cpipe = spawn(consumer, holder.send, n, 600.0)
        pp, ppipe = spawn(producer, origin.receive, n, 100, 64, b"t", time.time() + 0.5)
        pr = result(pp, ppipe, 600, c.brokers)
        r["produce"] = n / (pr["t_end"] - pr["t0"])
        r["repl_failed"] = pr["repl_failed"]
        r["origin"] = origin.counters()
        r["before"] = holder.wait("every copy held", lambda s: s.get("replicas_held") == n)
        t_kill = time.monotonic()
        origin.kill()  # SIGKILL
        t_dead = time.monotonic()
        after = holder.wait("every copy taken over",
                            lambda s: s.get("replicas_taken_over", 0) >= n,
                            timeout=60 + 10 * peer_timeout, interval=0.005)
        t_taken = time.monotonic()
        cr = result(cp, cpipe, 600, [holder])
        r["end"] = holder.wait("the taken-over messages ACKed",
                               lambda s: s.get("messages") == 0)
        r.update(after=after, kill=t_dead - t_kill, taken=t_taken - t_kill,
                 first=cr["t_first"] - t_kill, all=cr["t_last"] - t_kill,
                 # (None: all of them came in the first read, too fast to time)
                 deliver_rate=(n / (cr["t_last"] - cr["t_first"])
                               if cr["t_last"] - cr["t_first"] > 1e-3 else None),
                 got=cr["got"], unique=cr["unique"])
    return r


# --- report -----------------------------------------------------------------------------------


def fmt_ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def report_throughput(rows: list[dict[str, Any]], title: str, big: bool) -> None:
    base = rows[0]
    unit = "MB/s" if big else "msg/s"

    def rate(row: dict[str, Any], key: str) -> float:
        return row[key] * row["size"] / 1e6 if big else row[key]

    print(f"\n{title}")
    print(f"{'brokers':>7} {'replicas':>8} {'msgs':>7} | {'produce ' + unit:>14} {'x base':>6} "
          f"{'e2e ' + unit:>11} {'x base':>6} {'ack p50':>8} {'ack p99':>8} | "
          f"{'alone ' + unit:>12} {'x base':>6} {'ack p50':>8} {'ack p99':>8} "
          f"{'drain ' + unit:>12} {'x base':>6}")
    for row in rows:
        line = (f"{row['brokers']:>7} {row['replicas']:>8} {row['n']:>7} | "
                f"{rate(row, 'produce'):>14,.1f} {fmt_ratio(row['produce'], base['produce']):>6} "
                f"{rate(row, 'e2e'):>11,.1f} {fmt_ratio(row['e2e'], base['e2e']):>6} "
                f"{row['p50']:>6.2f}ms {row['p99']:>6.2f}ms | "
                f"{rate(row, 'produce_alone'):>12,.1f} "
                f"{fmt_ratio(row['produce_alone'], base['produce_alone']):>6} "
                f"{row['p50_alone']:>6.2f}ms {row['p99_alone']:>6.2f}ms "
                f"{rate(row, 'drain'):>12,.1f} {fmt_ratio(row['drain'], base['drain']):>6}")
        if row["failed"]:
            line += f"  REFUSED {row['failed']}"
        print(line)
    print("  counters (origin after both runs; holders after the run without a consumer, then "
          "after its drain):")
    for row in rows:
        o = row["origin"]
        n2 = 2 * row["n"]
        acks = row["repl_failed"] + row["repl_failed_alone"]
        text = (f"  {row['brokers']} broker(s), replicas {row['replicas']}: origin "
                f"replicated={o.get('replicated')} (of 2 x {row['n']}) "
                f"replication_failed={o.get('replication_failed')} "
                f"REPLICATION_FAILED acks={acks} avoided_messages={o.get('avoided_messages')}")
        if row["replicas"]:
            text += f" replica_holders={o.get('replica_holders')}"
        for i, (held, drained) in enumerate(zip(row["held"], row["drained"], strict=True)):
            text += (f"; b{i + 1}: replicas_held={held.get('replicas_held')} (of {row['n']}) "
                     f"then {drained.get('replicas_held')}, "
                     f"replicas_taken_over={drained.get('replicas_taken_over')}, "
                     f"messages={drained.get('messages')}")
        ok = (o.get("replicated") == (n2 if row["replicas"] else 0)
              and o.get("replication_failed") == 0
              and all(h.get("replicas_held") == row["n"] for h in row["held"]))
        print(text + ("" if ok else "  <-- NOT FULLY REPLICATED"))
    print("  broker CPU ms per 1000 messages, with a consumer / without (b0 is the origin):")
    for row in rows:
        print(f"  {row['brokers']} broker(s), replicas {row['replicas']}: " + ", ".join(
            f"b{i} {live:.0f} / {alone:.0f}"
            for i, (live, alone) in enumerate(zip(row["cpu_live"], row["cpu_alone"],
                                                  strict=True))))


def report_takeover(t: dict[str, Any]) -> None:
    n = t["n"]
    before, after, end = t["before"], t["after"], t["end"]
    print(f"\ntakeover: 2 brokers, replicas 1, cluster peer_timeout {t['peer_timeout']:g} s, "
          f"{n:,} unACKed 100 B messages (produced at {t['produce']:,.0f} msg/s, "
          f"REPLICATION_FAILED acks {t['repl_failed']}, origin replicated="
          f"{t['origin'].get('replicated')})")
    print(f"  holder before the kill: replicas_held={before.get('replicas_held')} "
          f"replica_origins={before.get('replica_origins')} messages={before.get('messages')}")
    print(f"  SIGKILL of the origin (kill + reap {t['kill'] * 1e3:.1f} ms), then:")
    print(f"    replicas_taken_over == {n:,} (monitor polled every 5 ms): {t['taken']:.3f} s "
          f"(= {t['taken'] / t['peer_timeout']:.2f} x peer_timeout)")
    print(f"    first message at the holder's consumer: {t['first']:.3f} s")
    rate = (f"delivery {t['deliver_rate']:,.0f} msg/s once started"
            if t["deliver_rate"] is not None else "all in the first read")
    print(f"    all {n:,} received: {t['all']:.3f} s ({rate}; {t['got']:,} deliveries, "
          f"{t['unique']:,} distinct)")
    print(f"  holder after: replicas_taken_over={after.get('replicas_taken_over')} "
          f"replicas_held={end.get('replicas_held')} messages={end.get('messages')} "
          f"delivered={end.get('delivered')} redelivered={end.get('redelivered')}")


# --- main -------------------------------------------------------------------------------------


def cleanup() -> None:
    """Stop whatever is still running: SIGTERM, a few seconds, then SIGKILL."""
    for p in _CHILDREN:
        if p.is_alive():
            p.kill()
    for proc in _BROKERS:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for proc in _BROKERS:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    for p in _CHILDREN:
        p.join(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=None,
                    help="100 B messages per run (default 20000; --quick: 5000)")
    ap.add_argument("--big-messages", type=int, default=None,
                    help="64 KiB messages per run (default 1500; --quick: 400)")
    ap.add_argument("--takeover-messages", type=int, default=None,
                    help="unACKed messages at the takeover (default 20000; --quick: 5000)")
    ap.add_argument("--peer-timeout", type=float, default=1.0,
                    help="cluster peer_timeout of the takeover case, seconds (default 1)")
    ap.add_argument("--replication-timeout", type=float, default=None,
                    help="the queues' replication_timeout (default: the queue's, 0.1 s)")
    ap.add_argument("--quick", action="store_true", help="fewer messages")
    ap.add_argument("--dir", default=None, help="where the brokers' directories go")
    args = ap.parse_args()
    n = args.messages or (5_000 if args.quick else 20_000)
    n_big = args.big_messages or (400 if args.quick else 1_500)
    n_take = args.takeover_messages or (5_000 if args.quick else 20_000)
    extra = ({} if args.replication_timeout is None
             else {"replication_timeout": args.replication_timeout})

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    base = Path(tempfile.mkdtemp(prefix="bench-pzq-repl-", dir=args.dir))
    started = time.monotonic()
    try:
        print(f"pzq replication over the cluster: sync batch, {os.cpu_count()} CPUs, "
              f"replication_timeout "
              f"{args.replication_timeout if extra else 'default (0.1 s)'}, "
              f"cluster peer_timeout {THROUGHPUT_PEER_TIMEOUT:g} s "
              f"(takeover: {args.peer_timeout:g} s)")
        small = [throughput(base, b, r, 100, 64, n, extra) for b, r in ((1, 0), (2, 1), (3, 2))]
        report_throughput(small, "100 B messages, producer window 64 (baseline: 1 broker, "
                          "replicas 0, this run)", big=False)
        big = [throughput(base, b, r, 65536, 16, n_big, extra) for b, r in ((1, 0), (2, 1))]
        report_throughput(big, "64 KiB messages, producer window 16 (baseline: 1 broker, "
                          "replicas 0, this run)", big=True)
        report_takeover(takeover(base, n_take, args.peer_timeout, extra))
        print(f"\ntotal {time.monotonic() - started:.0f} s")
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        cleanup()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
