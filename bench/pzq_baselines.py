"""Baselines for bench_pzq.py, measured in the same run as pzq itself:

- **relay**: a bare Python relay of the original pzq wire: a ROUTER that ACKs each producer
  message at once, a DEALER that pushes it to consumers and takes their ACKs; no disk, no
  bookkeeping; pyzmq's recv_multipart/send_multipart with a poller. What one multipart
  message per queue message costs in Python before any queue logic runs.
- **redis**: Redis Streams with ``appendfsync always`` (every write fsynced before the reply):
  a producer pipelining WINDOW XADDs, a consumer reading with XREADGROUP COUNT WINDOW and
  ACKing each read with one XACK. Needs ``redis-server`` on PATH and the ``redis`` package.

Each returns the same figures as a pzq case: end-to-end rate, ACK latencies and the server
process's CPU per message (from /proc/PID/stat).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import zmq
from pzq_load import free_port


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(n: int, t0: float, t_end: float, last: float, lat: list[float], cpu: float
            ) -> dict:
    lat.sort()
    return {"n": n, "produce": n / (t_end - t0), "e2e": n / (last - t0),
            "p50": lat[len(lat) // 2] * 1e3, "p99": lat[int(len(lat) * 0.99)] * 1e3,
            "cpu_us": cpu / n * 1e6}


# --- the bare relay --------------------------------------------------------------------------


def relay(receive: str, send: str) -> None:
    ctx = zmq.Context()
    rin = ctx.socket(zmq.ROUTER)
    rin.bind(receive)
    out = ctx.socket(zmq.DEALER)
    out.setsockopt(zmq.SNDHWM, 0)
    out.bind(send)
    poller = zmq.Poller()
    poller.register(rin, zmq.POLLIN)
    poller.register(out, zmq.POLLIN)
    n = 0
    sent = b"%d" % (time.time_ns() // 1000)
    while True:
        for sock, _ in poller.poll():
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if sock is rin:  # [peer][id][""][body...]: ACK, then push on
                    peer, msg_id = frames[0], frames[1]
                    rin.send_multipart([peer, msg_id, b"1", b""])
                    n += 1
                    out.send_multipart([b"%d" % n, sent, b"5000000", b"", *frames[3:]])
                # else: a consumer's [key]["1"]: nothing to keep


def relay_case(size: int, window: int, n: int, producer, consumer,
               max_bytes: int | None = None) -> dict:
    """The bare relay on one case (``max_bytes``: the producer's byte window, if any)."""
    receive = f"tcp://127.0.0.1:{free_port()}"
    send = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("fork")
    proc = ctx.Process(target=relay, args=(receive, send), daemon=True)
    proc.start()
    try:
        return _windowed_case(proc.pid, receive, send, size, window, n, producer, consumer,
                              max_bytes)
    finally:
        proc.kill()
        proc.join()


def _windowed_case(pid: int, receive: str, send: str, size: int, window: int, n: int,
                   producer, consumer, max_bytes: int | None = None) -> dict:
    ctx = mp.get_context("fork")
    (p_in, p_out), (c_in, c_out) = ctx.Pipe(False), ctx.Pipe(False)
    start = time.time() + 0.5
    cpu0 = cpu_seconds(pid)
    cons = ctx.Process(target=consumer, args=(send, n, c_out))
    prod = ctx.Process(target=producer,
                       args=(receive, n, size, window, max_bytes, start, p_out))
    cons.start()
    prod.start()
    try:
        if not p_in.poll(300) or not c_in.poll(120):
            raise SystemExit("baseline case timed out")
        t0, elapsed, lat, _failed = p_in.recv()
        last, _got = c_in.recv()
        cpu = cpu_seconds(pid) - cpu0
    finally:
        for p in (prod, cons):
            p.join(10)
            if p.is_alive():
                p.kill()
    return summary(n, t0, t0 + elapsed, last, lat, cpu)


# --- Redis Streams ---------------------------------------------------------------------------


def redis_missing() -> str | None:
    """Why the Redis baseline cannot run here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis Python package is not installed (pip install redis)"
    return None


def redis_producer(port: int, n: int, size: int, window: int, start: float, out) -> None:
    import redis
    r = redis.Redis(port=port)
    body = b"x" * size
    lat = []
    while time.time() < start:
        time.sleep(0.001)
    t0 = time.monotonic()
    i = 0
    while i < n:
        k = min(window, n - i)
        pipe = r.pipeline(transaction=False)
        for _ in range(k):
            pipe.xadd("bench", {"b": body})
        t = time.monotonic()
        pipe.execute()
        done = time.monotonic()
        lat.extend([done - t] * k)
        i += k
    out.send((t0, time.monotonic(), lat))


def redis_consumer(port: int, n: int, window: int, out) -> None:
    import redis
    r = redis.Redis(port=port)
    got = 0
    while got < n:
        reply = r.xreadgroup("g", "c", {"bench": ">"}, count=window, block=20_000)
        if not reply:
            raise SystemExit(f"redis consumer: nothing for 20 s after {got} messages")
        ids = [mid for _, entries in reply for mid, _ in entries]
        r.xack("bench", "g", *ids)
        got += len(ids)
    out.send((time.monotonic(), got))


def start_redis(*options: str) -> tuple[subprocess.Popen, int, str]:
    """A redis-server on a free loopback port, with ``options``, once it answers: the process,
    its port and its working directory (for :func:`stop_redis`)."""
    import redis
    port = free_port()
    work = tempfile.mkdtemp(prefix="bench-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", work, *options,
         "--save", "", "--protected-mode", "yes", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            r.ping()
            return proc, port, work
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                stop_redis(proc, work)
                raise SystemExit("redis-server did not start") from None
            time.sleep(0.05)


def stop_redis(proc: subprocess.Popen, work: str) -> None:
    proc.kill()
    proc.wait()
    shutil.rmtree(work, ignore_errors=True)


def redis_case(size: int, window: int, n: int) -> dict:
    proc, port, work = start_redis("--appendonly", "yes", "--appendfsync", "always")
    try:
        import redis
        redis.Redis(port=port).xgroup_create("bench", "g", id="$", mkstream=True)
        ctx = mp.get_context("fork")
        (p_in, p_out), (c_in, c_out) = ctx.Pipe(False), ctx.Pipe(False)
        start = time.time() + 0.5
        cpu0 = cpu_seconds(proc.pid)
        cons = ctx.Process(target=redis_consumer, args=(port, n, window, c_out))
        prod = ctx.Process(target=redis_producer, args=(port, n, size, window, start, p_out))
        cons.start()
        prod.start()
        if not p_in.poll(300) or not c_in.poll(120):
            raise SystemExit("redis case timed out")
        t0, t_end, lat = p_in.recv()
        last, _got = c_in.recv()
        cpu = cpu_seconds(proc.pid) - cpu0
        for p in (prod, cons):
            p.join(10)
        return summary(n, t0, t_end, last, lat, cpu)
    finally:
        stop_redis(proc, work)
