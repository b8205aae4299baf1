"""What a small message's round trip costs on this machine, and why: the work of the process in
the middle, or the wake-ups between processes.

    python bench/bench_wakeups.py              # 5000 round trips per case
    python bench/bench_wakeups.py --samples 2000

One small message back and forth, one at a time, from a client process through a middle process
(two Unix stream connections: into the middle, and out of it to the same client):

* ``relay +W us``: a minimal relay on uvloop that spends W microseconds of CPU on each message
  before it forwards it (W = 0, 10, 20, 40, 80): what the machine charges as a process's work
  per message grows, with nothing else changed.
* ``broker``: a ZPIPES WRITE through the broker to a waiting READ (raw ZMTP clients, no client
  library), the broker free to run where the kernel puts it; then the same with the broker and
  the client pinned to one CPU (``taskset``), where a wake-up is a switch on that CPU and never a
  wake-up of another.

Printed: the round trip's p50 and p99, and the middle's CPU time (user + system, from
``/proc/PID/stat``) per round trip. On a virtual machine whose idle CPUs halt, waking a process
on another CPU is far dearer than a switch on the same one; whether the kernel keeps a round
trip on one CPU can depend on how long each process runs per message, so the rows show where
that happens, in the same run as the broker's figures.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import uuid

from bench_pipes import (
    add_halt_poll_option,
    bounded,
    cpu_seconds,
    halt_poll_set,
    halt_polling,
    start_broker,
)

from zpipes import protocol as p
from zpipes import zmtp
from zpipes.zmtp_framing import frame_head

LINE = b"a short line of text\n"
RELAY = r"""
import asyncio, sys, time, uvloop
a, b = ("\0" + name for name in sys.argv[1:3])  # abstract socket names
work = float(sys.argv[3]) * 1e-6
out = {}
class Out(asyncio.Protocol):
    def connection_made(self, transport):
        out["t"] = transport
class In(asyncio.Protocol):
    def data_received(self, data):
        end = time.perf_counter() + work
        while time.perf_counter() < end:
            pass
        out["t"].write(data)
async def main():
    loop = asyncio.get_running_loop()
    await loop.create_unix_server(Out, b)
    await loop.create_unix_server(In, a)
    print("ready", flush=True)
    await asyncio.Event().wait()
uvloop.run(main())
"""


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * (len(xs) - 1))] * 1e6


def report(label: str, times: list[float], cpu: float) -> None:
    print(f"{label:<34} p50 {pct(times, .5):7.1f} us   p99 {pct(times, .99):7.1f} us   "
          f"middle's CPU {cpu / len(times) * 1e6:6.1f} us per round trip")


def relay_case(work_us: int, samples: int) -> None:
    tag = uuid.uuid4().hex[:8]
    names = f"/bench-wakeups/{tag}/in", f"/bench-wakeups/{tag}/out"
    a, b = ("\0" + name for name in names)
    relay = subprocess.Popen([sys.executable, "-c", RELAY, *names, str(work_us)],
                             stdout=subprocess.PIPE)
    try:
        if relay.stdout.readline() != b"ready\n":  # type: ignore[union-attr]
            raise SystemExit("the relay did not start")
        dst = bounded(socket.socket(socket.AF_UNIX))
        dst.connect(b)
        time.sleep(0.05)  # (accepted as the relay's way out before the way in comes)
        src = bounded(socket.socket(socket.AF_UNIX))
        src.connect(a)
        for _ in range(100):  # warm-up
            src.sendall(LINE)
            dst.recv(1 << 16)
        times = []
        cpu = cpu_seconds(relay.pid)
        for _ in range(samples):
            t = time.perf_counter()
            src.sendall(LINE)
            data = dst.recv(1 << 16)
            times.append(time.perf_counter() - t)
            assert data == LINE, data
        cpu = cpu_seconds(relay.pid) - cpu
        src.close()
        dst.close()
    finally:
        relay.kill()
        relay.wait()
    report(f"relay +{work_us} us", times, cpu)


def _link(name: str) -> socket.socket:
    sock = zmtp.connect(socket.AF_UNIX, f"\0/zpipes/{name}", 5)
    zmtp.DealerLink(sock).handshake(5)
    return bounded(sock)


def _framed(message: p.Message) -> bytes:
    frame = p.encode(message)
    return frame_head(len(frame)) + frame


def _reply(sock: socket.socket) -> bytes:
    data = sock.recv(1 << 16)
    if not data:
        raise SystemExit("the broker closed the connection")
    return data


def broker_case(label: str, broker: subprocess.Popen, name: str, pipe: bytes,
                samples: int) -> None:
    """WRITEs of one line, each to a READ waiting for it; the writer's WRITE_OKs are taken
    now and then (they do not wake the client: it waits on the reader's connection)."""
    reader, writer = _link(name), _link(name)
    reader.sendall(_framed(p.Input(pipe)))
    _reply(reader)
    writer.sendall(_framed(p.Output(pipe)))
    _reply(writer)
    read, write = _framed(p.Read(1 << 20, 0)), _framed(p.Write(LINE, 0))
    reader.sendall(read * 4)
    times = []
    cpu = 0.0
    for i in range(100 + samples):
        if i == 100:
            cpu = cpu_seconds(broker.pid)
        t = time.perf_counter()
        writer.sendall(write)
        data = _reply(reader)
        if i >= 100:
            times.append(time.perf_counter() - t)
        assert data.endswith(LINE), data
        reader.sendall(read)
        if i % 64 == 0:
            try:
                while writer.recv(1 << 16, socket.MSG_DONTWAIT):
                    pass
            except BlockingIOError:
                pass
    cpu = cpu_seconds(broker.pid) - cpu
    reader.close()
    writer.close()
    report(label, times, cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=5000)
    add_halt_poll_option(ap)
    args = ap.parse_args()
    with halt_poll_set(args.halt_poll_ns):
        run(args)


def run(args: argparse.Namespace) -> None:
    print(f"round trips of one small message through a middle process, {os.cpu_count()} cores, "
          f"{halt_polling()}")
    for work in (0, 10, 20, 40, 80):
        relay_case(work, args.samples)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    broker = start_broker(name)
    try:
        broker_case("broker, free", broker, name, b"free", args.samples)
        everywhere = os.sched_getaffinity(0)
        one = {min(everywhere)}
        os.sched_setaffinity(broker.pid, one)
        os.sched_setaffinity(0, one)
        try:
            broker_case("broker, pinned with the client", broker, name, b"pinned",
                        args.samples)
        finally:
            os.sched_setaffinity(0, everywhere)
            os.sched_setaffinity(broker.pid, everywhere)
        broker_case("broker, free again", broker, name, b"free-again", args.samples)
    finally:
        broker.terminate()
        broker.wait(10)


if __name__ == "__main__":
    main()
