"""Reading a stream queue: RANGE answers plain (a message in five frames or more) and
packed (RANGE ... BATCH), against Redis Streams' XRANGE, all in the same run.

    python bench/bench_pzq_stream.py                      # 200 000 messages of 100 B
    python bench/bench_pzq_stream.py --size 4096 --messages 50000 --rounds 5

A ``pzq --mode stream`` is filled with the batch path's Producer, then read from offset 0 to
its head with StreamConsumer, ``--rounds`` times each way, alternating (reads do not commit,
so every pass reads the same messages). Redis Streams (when ``redis-server`` is installed) is
filled with the same number of entries and read with XRANGE, ``--count`` entries a call, as
StreamConsumer asks for ``--count`` messages a RANGE. For each pass: messages a second and the
server's CPU a message (utime + stime from /proc/PID/stat, over the pass); the summary gives
the medians and ranges, and the packed answers against the plain ones and against Redis.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pzq_baselines import cpu_seconds, redis_missing, start_redis, stop_redis  # noqa: E402
from pzq_load import free_port  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def start_stream_queue(data: Path) -> tuple[subprocess.Popen, str, str]:
    from bench_pzq import wait_listening

    receive = f"tcp://127.0.0.1:{free_port()}"
    stream = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "zbroker.services.pzq", "--database", str(data), "--mode", "stream",
         "--receive-dsn", receive, "--send-dsn", f"tcp://127.0.0.1:{free_port()}",
         "--stream-dsn", stream, "--monitor-dsn", f"ipc://{data}.monitor",
         "--max-backlog", "4GiB", "--log-level", "warning"],
        env=env, stdin=subprocess.DEVNULL)
    wait_listening(stream)
    return proc, receive, stream


def fill(receive: str, n: int, size: int) -> None:
    from pzq.client import Producer

    body = b"x" * size
    with Producer(receive, window=512, batch=256) as p:
        for _ in range(n):
            p.send(body)
        p.flush(120)


def read_pass(stream: str, pid: int, batch: bool, count: int, n: int) -> dict:
    """Read every message once; the rate and the queue's CPU a message."""
    from pzq.client import StreamConsumer

    with StreamConsumer(stream, batch=batch, timeout=30) as s:
        head = s.head()
        if head != n:
            raise SystemExit(f"the queue holds {head} messages, not {n}")
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        got = 0
        for _ in s.read(0, head, max_bytes=64 << 20, max_messages=count):
            got += 1
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
        if batch and not s.batch:
            raise SystemExit("the queue does not answer RANGE ... BATCH")
    if got != n:
        raise SystemExit(f"read {got} messages, not {n}")
    return {"rate": got / elapsed, "cpu_us": cpu / got * 1e6}


def redis_passes(n: int, size: int, count: int, rounds: int) -> list[dict]:
    import redis

    proc, port, work = start_redis()
    try:
        r = redis.Redis(port=port)
        body = b"x" * size
        for i in range(0, n, 1000):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(1000, n - i)):
                pipe.xadd("bench", {"b": body})
            pipe.execute()
        out = []
        for _ in range(rounds):
            cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
            got, start = 0, "-"
            while True:
                entries = r.xrange("bench", start, "+", count=count)
                if not entries:
                    break
                got += len(entries)
                start = "(" + entries[-1][0].decode()
            elapsed, cpu = time.perf_counter() - t0, cpu_seconds(proc.pid) - cpu0
            if got != n:
                raise SystemExit(f"redis: read {got} entries, not {n}")
            out.append({"rate": got / elapsed, "cpu_us": cpu / got * 1e6})
        return out
    finally:
        stop_redis(proc, work)


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000, help="messages in the stream")
    ap.add_argument("--size", type=int, default=100, help="bytes a body")
    ap.add_argument("--count", type=int, default=10_000,
                    help="messages a RANGE (and entries an XRANGE) asks for")
    ap.add_argument("--rounds", type=int, default=3, help="read passes each way")
    ap.add_argument("--dir", type=Path, default=None, help="where the queue's data goes")
    args = ap.parse_args()
    if args.messages < 1 or args.size < 0 or args.count < 1 or args.rounds < 1:
        ap.error("--messages, --count and --rounds must be at least 1, --size at least 0")

    base = Path(tempfile.mkdtemp(prefix="bench-pzq-stream-", dir=args.dir))
    proc, receive, stream = start_stream_queue(base / "q")
    passes: dict[str, list[dict]] = {"plain": [], "batch": []}
    try:
        fill(receive, args.messages, args.size)
        for _ in range(args.rounds):
            for form in ("plain", "batch"):
                passes[form].append(read_pass(stream, proc.pid, form == "batch", args.count,
                                              args.messages))
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)
    why = redis_missing()
    if why is None:
        passes["redis"] = redis_passes(args.messages, args.size, args.count, args.rounds)
    print(f"reading {args.messages:,} messages of {args.size} B, {args.count:,} a request, "
          f"{args.rounds} passes each, median [range]")
    names = {"plain": "pzq RANGE", "batch": "pzq RANGE ... BATCH", "redis": "Redis XRANGE"}
    for form, runs in passes.items():
        print(f"  {names[form]:20s} {spread([r['rate'] for r in runs], ',.0f')} msg/s, "
              f"server CPU {spread([r['cpu_us'] for r in runs], '.2f')} µs a message")
    if why is not None:
        print(f"  Redis XRANGE: skipped, {why}")

    def ratio(a: str, b: str, key: str) -> str:
        return spread([x[key] / y[key] for x, y in zip(passes[a], passes[b], strict=True)],
                      ".2f") + "x"

    print(f"  BATCH/plain: rate {ratio('batch', 'plain', 'rate')}, "
          f"server CPU a message {ratio('batch', 'plain', 'cpu_us')}")
    if "redis" in passes:
        print(f"  BATCH/Redis: rate {ratio('batch', 'redis', 'rate')}, "
              f"server CPU a message {ratio('batch', 'redis', 'cpu_us')}")


if __name__ == "__main__":
    main()
