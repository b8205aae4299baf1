"""Throughput and latency of ZPIPES on one host, against baselines measured in the same run.

    python bench/bench_pipes.py            # 1 GiB bulk, 1 M small lines, 2000 latency samples
    python bench/bench_pipes.py --quick    # smaller, for a smoke run

Bulk and lines: ``SOURCE | zpipes write p`` into ``zpipes read p > /dev/null``, against
``SOURCE | cat > FIFO`` into ``cat FIFO > /dev/null`` through a mkfifo pipe. Latency: one small
line written through the client library until the reader has it, against the same through an
os.pipe in one process. The machine is noisy: compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import zpipes

ZPIPES = [sys.executable, "-m", "zpipes"]
ZBROKER = [sys.executable, "-m", "zbroker"]


def start_broker(name: str) -> subprocess.Popen:
    proc = subprocess.Popen([*ZBROKER, name, "--log-level", "warning"],
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    import socket

    while time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(f"\0/zpipes/{name}")
            return proc
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()
    proc.kill()
    raise SystemExit("broker did not start")


def timed_pair(writer_cmd: str, reader_cmd: str, env: dict) -> float:
    """Seconds from start until both shell commands have ended."""
    t = time.perf_counter()
    reader = subprocess.Popen(reader_cmd, shell=True, env=env)
    writer = subprocess.Popen(writer_cmd, shell=True, env=env)
    if writer.wait(600) or reader.wait(600):
        raise SystemExit(f"failed: {writer_cmd!r} / {reader_cmd!r}")
    return time.perf_counter() - t


def throughput(name: str, source: str, nbytes: int, broker: str, tmp: Path, runs: int) -> None:
    env = dict(os.environ)
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    zp = " ".join(ZPIPES)
    fifo_s, pipe_s = [], []
    for i in range(runs):  # interleaved, so that noise hits both alike
        fifo_s.append(timed_pair(f"{source} | cat > {fifo}", f"cat {fifo} > /dev/null", env))
        pipe_s.append(timed_pair(f"{source} | {zp} write --broker {broker} bench{i}",
                                 f"{zp} read --broker {broker} bench{i} > /dev/null", env))
    fifo.unlink()
    f, z = statistics.median(fifo_s), statistics.median(pipe_s)
    print(f"{name:<28} fifo {nbytes / f / 1e6:8.0f} MB/s   zpipes {nbytes / z / 1e6:8.0f} MB/s"
          f"   ratio {f / z:5.2f}x   (median of {runs})")


def latency(broker: str, samples: int) -> None:
    line = b"a short line of text\n"
    # baseline: an OS pipe in one process
    r, w = os.pipe()
    base = []
    for _ in range(samples):
        t = time.perf_counter()
        os.write(w, line)
        os.read(r, 1 << 16)
        base.append(time.perf_counter() - t)
    os.close(r)
    os.close(w)
    got = []
    opened = threading.Event()
    reader_box: list = []

    def open_reader():
        reader_box.append(zpipes.open("latency", "r", broker=broker))
        opened.set()

    threading.Thread(target=open_reader).start()
    with zpipes.open("latency", "w", broker=broker) as writer:
        opened.wait(10)
        reader = reader_box[0]
        for _ in range(samples):
            t = time.perf_counter()
            writer.write(line)
            data = reader.read1(1 << 16)
            got.append(time.perf_counter() - t)
            assert data == line, data
        writer.flush()
    reader.close()

    def pct(xs, q):
        return sorted(xs)[int(q * (len(xs) - 1))] * 1e6

    print(f"{'latency, one small line':<28} os.pipe p50 {pct(base, .5):6.1f} us   zpipes p50 "
          f"{pct(got, .5):6.1f} us  p99 {pct(got, .99):7.1f} us   ({samples} samples)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, one run each")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    size = (128 << 20) if args.quick else (1 << 30)
    lines = 100_000 if args.quick else 1_000_000
    runs = 1 if args.quick else args.runs
    broker = f"bench-{uuid.uuid4().hex[:8]}"
    proc = start_broker(broker)
    tmp = Path(tempfile.mkdtemp())
    try:
        print(f"zbroker ZPIPES benchmark, {os.cpu_count()} cores")
        throughput(f"bulk {size >> 20} MiB", f"head -c {size} /dev/zero", size, broker, tmp, runs)
        text = "a line of log text, about sixty bytes long, for the bench"
        nbytes = lines * (len(text) + 1)
        throughput(f"{lines} lines of {len(text) + 1} B", f"yes '{text}' | head -n {lines}",
                   nbytes, broker, tmp, runs)
        latency(broker, 200 if args.quick else 2000)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
