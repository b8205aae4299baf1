"""Throughput, broker CPU and latency of ZPIPES on one host, against baselines measured in the
same run.

    python bench/bench_pipes.py            # 1 GiB per case, 1 M small lines, 2000 latency samples
    python bench/bench_pipes.py --quick    # smaller, for a smoke run
    python bench/bench_pipes.py --cases raw,bulk --runs 5

Raw wire (``raw``): a client that behaves like the original C client (one DEALER per end, one
request outstanding at a time, no PINGs): the writer sends a WRITE of one chunk and waits for
its WRITE_OK; the reader sends READ(chunk size, timeout 0) and waits for its READ_OK. Chunks of
64 KiB and 1 MiB. Baseline: the same two clients against a minimal relay written with pyzmq
alone (a ROUTER that acks WRITEs and answers READs from a buffer, no state machine, no logs):
what any Python broker pays for the messages themselves on libzmq. A second baseline, the
"zmtp relay": the same relay on asyncio (uvloop) over the broker's own ZMTP codec, with no
libzmq on the server side. Printed beside the rates: the CPU seconds (user + system) that each
spent per GiB moved, the median with the lowest and highest run in brackets, and its ratio to
the pyzmq relay's.

Bulk and lines (``bulk``, ``lines``): ``SOURCE | zpipes write p`` into ``zpipes read p >
/dev/null``, against ``SOURCE | cat > FIFO`` into ``cat FIFO > /dev/null`` through a mkfifo
pipe; beside, the CPU seconds per GiB of the broker and of the two ``zpipes`` clients (writer +
reader, each process's user + system time as the kernel counts it when it ends, start-up
included), and what one client's start-up alone costs (a pair that moves one byte): subtract
it twice per run for the cost of the stream itself (printed too: "the stream alone"). Latency
(``latency``): one small line written through the client library until the reader has it,
against the same through an os.pipe in one process. Sporadic lines (``sporadic``): a line every
2 ms, written with ``zpipes.open(..., "w")`` + ``flush()`` in one process and read line by line
in another, arrival minus write time on CLOCK_MONOTONIC (1900 samples after 100 of warm-up),
against the same two hops through a C relay (``zmq.proxy``) and a plain Unix-socket relay in
the same run; beside each, the CPU time per line of the writer, the reader and the middle.

Metrics (``--metrics``): the raw wire case (64 KiB WRITEs) through two brokers in the same
run, one without metrics and one with its metrics endpoint scraped every ``--scrape-interval``
seconds (as Prometheus would, default 1): rates, the broker's CPU per GiB, and the difference.

Runs are interleaved (baseline, zpipes, baseline, ...) and the medians compared: the machine
is noisy, so compare the ratios, not the absolute figures. The header says whether the machine's
idle CPUs poll before they halt (a virtual machine's guest halt polling): where they do not,
a small round trip's latency is mostly the wake-ups of halted CPUs, for every relay alike
(``bench_wakeups.py``); ``--halt-poll-ns 200000`` runs with the kernel's default, as root.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import zmq

import zpipes

ZPIPES = [sys.executable, "-m", "zpipes"]
ZBROKER = [sys.executable, "-m", "zbroker"]
GIB = 1 << 30
_TICK = os.sysconf("SC_CLK_TCK")


WAIT_S = 10  # a reply that takes longer: the middle is stuck (the receive fails, the run ends)


def bounded(sock: socket.socket) -> socket.socket:
    """``sock`` blocking (one system call a receive, no poll first, as the clients measured
    do), its receives bounded by the kernel (SO_RCVTIMEO): a stuck middle ends the run."""
    sock.setblocking(True)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", WAIT_S, 0))
    return sock


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds that process ``pid`` has used (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def start_broker(name: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([*ZBROKER, name, "--log-level", "warning", *args],
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
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


def _wait_cpu(proc: subprocess.Popen) -> float:
    """Wait for ``proc`` to end; the user + system CPU seconds it used (all its threads)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def zpipes_pair(source: str, bname: str, pipe: str, env: dict) -> tuple[float, float, float]:
    """``source | zpipes write pipe`` into ``zpipes read pipe > /dev/null``: (seconds until both
    have ended, the writer's CPU seconds, the reader's). The clients are started directly, not
    through a shell, so that their own CPU time is what is counted."""
    t = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        reader = subprocess.Popen([*ZPIPES, "read", "--broker", bname, pipe], stdout=sink,
                                  env=env)
    feed = subprocess.Popen(source, shell=True, stdout=subprocess.PIPE, env=env)
    writer = subprocess.Popen([*ZPIPES, "write", "--broker", bname, pipe], stdin=feed.stdout,
                              env=env)
    feed.stdout.close()
    writer_cpu = _wait_cpu(writer)
    reader_cpu = _wait_cpu(reader)
    feed.wait()
    if writer.returncode or reader.returncode:
        raise SystemExit(f"failed: zpipes write/read {pipe} ({writer.returncode}, "
                         f"{reader.returncode})")
    return time.perf_counter() - t, writer_cpu, reader_cpu


def throughput(name: str, source: str, nbytes: int, broker: subprocess.Popen, tmp: Path,
               runs: int) -> None:
    env = dict(os.environ)
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    bname = broker.args[len(ZBROKER)]
    fifo_s, pipe_s, cpu, writer_cpu, reader_cpu, start_cpu, start_s = [], [], [], [], [], [], []
    for i in range(runs):  # interleaved, so that noise hits both alike
        fifo_s.append(timed_pair(f"{source} | cat > {fifo}", f"cat {fifo} > /dev/null", env))
        c = cpu_seconds(broker.pid)
        t, w, r = zpipes_pair(source, bname, f"bench{i}", env)
        cpu.append(cpu_seconds(broker.pid) - c)
        pipe_s.append(t)
        writer_cpu.append(w)
        reader_cpu.append(r)
        t, w, r = zpipes_pair("printf x", bname, f"start{i}", env)
        start_cpu.append((w + r) / 2)
        start_s.append(t)
    fifo.unlink()
    f, z = statistics.median(fifo_s), statistics.median(pipe_s)
    clients = [w + r for w, r in zip(writer_cpu, reader_cpu, strict=True)]

    def per_gib(xs: list[float]) -> float:
        return statistics.median(xs) * GIB / nbytes

    # The stream alone: less what a pair that moves one byte takes (seconds until both ended)
    # and costs (each client's start-up), so that a short stream shows its own rate and cost.
    stream_s = z - statistics.median(start_s)
    stream_cpu = [c - 2 * s for c, s in zip(clients, start_cpu, strict=True)]
    print(f"{name:<28} fifo {nbytes / f / 1e6:8.0f} MB/s   zpipes {nbytes / z / 1e6:8.0f} MB/s"
          f"   ratio {f / z:5.2f}x   CPU s/GiB: broker {per_gib(cpu):5.2f} "
          f"{_spread(cpu, nbytes)}  clients {per_gib(clients):5.2f} {_spread(clients, nbytes)} "
          f"(write {per_gib(writer_cpu):.2f}, read {per_gib(reader_cpu):.2f}; start-up "
          f"{statistics.median(start_cpu):.2f} s each)   (median of {runs})")
    print(f"{'  the stream alone':<28} less a one-byte pair ({statistics.median(start_s):.2f} s): "
          f"zpipes {nbytes / stream_s / 1e6:8.0f} MB/s   ratio {f / stream_s:5.2f}x   "
          f"clients {per_gib(stream_cpu):5.2f} CPU s/GiB "
          f"({per_gib(stream_cpu) / per_gib(cpu):.1f}x the broker's)")


# --- raw wire: a client like the original C client -------------------------------------------

SIG = b"\xaa\xa0"
INPUT, INPUT_OK, OUTPUT, OUTPUT_OK, READ, READ_OK, READ_END = 1, 2, 4, 5, 7, 8, 9
WRITE, WRITE_OK, CLOSE, CLOSE_OK = 12, 13, 16, 17


def _expect(sock: zmq.Socket, mid: int) -> bytes:
    frame = sock.recv()
    if frame[:2] != SIG or frame[2] != mid:
        raise SystemExit(f"raw client: expected message {mid}, got {frame[:40]!r}")
    return frame


def raw_writer(endpoint: str, pipe: bytes, chunk: int, count: int, ready, go) -> None:
    """Like the C client: one WRITE at a time, each waits for its WRITE_OK; then CLOSE."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(SIG + bytes([OUTPUT, len(pipe)]) + pipe)
    _expect(sock, OUTPUT_OK)
    frame = SIG + bytes([WRITE]) + chunk.to_bytes(4, "big") + b"x" * chunk + bytes(4)
    ready.set()
    go.wait()
    for _ in range(count):
        sock.send(frame, copy=False)
        _expect(sock, WRITE_OK)
    sock.send(SIG + bytes([CLOSE]))
    _expect(sock, CLOSE_OK)
    sock.close()
    ctx.term()


def raw_reader(endpoint: str, pipe: bytes, chunk: int, nbytes: int, ready, go) -> None:
    """Like the C client: READ(chunk, timeout 0), wait for READ_OK, until all has come."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(SIG + bytes([INPUT, len(pipe)]) + pipe)
    _expect(sock, INPUT_OK)
    read = SIG + bytes([READ]) + chunk.to_bytes(4, "big") + bytes(4)
    ready.set()
    go.wait()
    got = 0
    while got < nbytes:
        sock.send(read)
        frame = sock.recv(copy=False)
        buf = frame.buffer
        if buf[2] != READ_OK:
            raise SystemExit(f"raw reader: expected READ_OK, got message {buf[2]}")
        got += len(buf) - 7
    sock.send(SIG + bytes([CLOSE]))
    _expect(sock, CLOSE_OK)
    sock.close()
    ctx.term()


def _send_read_ok(sock: zmq.Socket, rid, data) -> None:
    # zero-copy only for big frames: pyzmq frees each one in a thread of its own
    sock.send(rid, zmq.SNDMORE)
    sock.send(SIG + bytes([READ_OK]) + len(data).to_bytes(4, "big") + data,
              copy=len(data) < 1 << 18)


def relay(endpoint: str, capacity: int, ready) -> None:
    """The baseline: a minimal ZPIPES relay for one writer and one reader, pyzmq alone. It
    buffers up to ``capacity`` bytes, answers a WRITE at once while there is room and a READ
    with one buffered chunk, and holds a request that must wait."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.set()
    chunks: list = []
    queued = 0
    held_write = held_read = None
    while True:
        rid, frame = sock.recv_multipart(copy=False)
        buf = frame.buffer
        mid = buf[2]
        if mid == WRITE:
            if queued >= capacity:
                held_write = (rid, buf)
                continue
            chunks.append(buf[7:-4])
            queued += len(buf) - 11
            sock.send_multipart([rid, SIG + bytes([WRITE_OK])])
            if held_read is not None:
                data = chunks.pop(0)
                queued -= len(data)
                _send_read_ok(sock, held_read, data)
                held_read = None
        elif mid == READ:
            if not chunks:
                held_read = rid
                continue
            data = chunks.pop(0)
            queued -= len(data)
            _send_read_ok(sock, rid, data)
            if held_write is not None and queued < capacity:
                wrid, wbuf = held_write
                held_write = None
                chunks.append(wbuf[7:-4])
                queued += len(wbuf) - 11
                sock.send_multipart([wrid, SIG + bytes([WRITE_OK])])
        elif mid in (INPUT, OUTPUT):
            sock.send_multipart([rid, SIG + bytes([mid + 1])])
        elif mid == CLOSE:
            sock.send_multipart([rid, SIG + bytes([CLOSE_OK])])
        else:
            break


def zmtp_relay(endpoint: str, capacity: int, ready) -> None:
    """The second baseline: the same relay on asyncio (uvloop) over the broker's own ZMTP codec
    (``zbroker/zmtp/``) instead of libzmq: no I/O thread, reads of up to 1 MiB."""
    import asyncio

    import uvloop

    from zbroker import zmtp

    scratch = memoryview(bytearray(1 << 20))
    chunks: list = []
    state = {"queued": 0, "held_write": None, "held_read": None}

    def read_ok(link, data) -> None:
        n = len(data)
        head = (b"\x02" + (n + 7).to_bytes(8, "big") if n + 7 > 255 else bytes([0, n + 7]))
        link.transport.writelines([head + SIG + bytes([READ_OK]) + n.to_bytes(4, "big"), data])

    def reply(link, mid: int) -> None:
        link.transport.write(bytes([0, 3]) + SIG + bytes([mid]))

    def take_write(link, buf) -> None:
        chunks.append(buf[7:-4])
        state["queued"] += len(buf) - 11
        reply(link, WRITE_OK)

    def pop() -> bytes:
        data = chunks.pop(0)
        state["queued"] -= len(data)
        return data

    def on_message(link, buf) -> None:
        mid = buf[2]
        if mid == WRITE:
            if state["queued"] >= capacity:
                state["held_write"] = (link, buf)
                return
            take_write(link, buf)
            if state["held_read"] is not None:
                read_ok(state["held_read"], pop())
                state["held_read"] = None
        elif mid == READ:
            if not chunks:
                state["held_read"] = link
                return
            read_ok(link, pop())
            held = state["held_write"]
            if held is not None and state["queued"] < capacity:
                state["held_write"] = None
                take_write(*held)
        elif mid in (INPUT, OUTPUT):
            reply(link, mid + 1)
        elif mid == CLOSE:
            reply(link, CLOSE_OK)

    class Link(asyncio.BufferedProtocol):
        def connection_made(self, transport) -> None:
            self.transport = transport
            self.conn = zmtp.Connection(4, 1 << 30)
            transport.write(self.conn.data_to_send())

        def get_buffer(self, sizehint: int) -> memoryview:
            return scratch

        def buffer_updated(self, nbytes: int) -> None:
            conn = self.conn
            conn.receive_data(scratch[:nbytes])
            for ev in conn.next_events():
                if type(ev) is zmtp.Message:
                    on_message(self, memoryview(ev.frames[-1]))
            out = conn.data_to_send()
            if out:
                self.transport.write(out)

    async def main() -> None:
        kind, address = endpoint.partition("://")[0], endpoint.partition("://")[2]
        assert kind == "ipc"
        path = "\0" + address[1:] if address.startswith("@") else address
        await asyncio.get_running_loop().create_unix_server(Link, path)
        ready.set()
        await asyncio.Event().wait()

    uvloop.run(main())


def raw_transfer(endpoint: str, pid: int, pipe: bytes, chunk: int, nbytes: int) -> tuple:
    """(seconds, CPU seconds of process ``pid``) for ``nbytes`` through ``endpoint``."""
    mp = multiprocessing.get_context("spawn")
    count = nbytes // chunk
    ready_w, ready_r, go = mp.Event(), mp.Event(), mp.Event()
    writer = mp.Process(target=raw_writer, args=(endpoint, pipe, chunk, count, ready_w, go))
    reader = mp.Process(target=raw_reader,
                        args=(endpoint, pipe, chunk, count * chunk, ready_r, go))
    reader.start()
    writer.start()
    if not (ready_r.wait(30) and ready_w.wait(30)):
        raise SystemExit("raw clients did not open their pipe ends")
    c, t = cpu_seconds(pid), time.perf_counter()
    go.set()
    writer.join(600)
    reader.join(600)
    t, c = time.perf_counter() - t, cpu_seconds(pid) - c
    if writer.exitcode or reader.exitcode:
        raise SystemExit("raw clients failed")
    return t, c


def raw_wire(broker: subprocess.Popen | None, chunk: int, nbytes: int, runs: int) -> None:
    """The raw wire case through the two relays and the broker (``None``: the relays only),
    interleaved run by run."""
    mp = multiprocessing.get_context("spawn")
    targets: list[tuple[str, str, int]] = []  # (label, endpoint, pid)
    relays = []
    for label, target in (("relay", relay), ("zmtp relay", zmtp_relay)):
        ep = f"ipc://@/zpipes-bench-relay/{uuid.uuid4().hex[:8]}"
        ready = mp.Event()
        proc = mp.Process(target=target, args=(ep, 1 << 20, ready), daemon=True)
        proc.start()
        ready.wait(10)
        relays.append(proc)
        targets.append((label, ep, proc.pid))
    if broker is not None:
        targets.append(("broker", zpipes.client.endpoint(broker.args[len(ZBROKER)]), broker.pid))
    secs: dict[str, list[float]] = {label: [] for label, _, _ in targets}
    cpu: dict[str, list[float]] = {label: [] for label, _, _ in targets}
    try:
        for i in range(runs):
            for label, ep, pid in targets:
                t, c = raw_transfer(ep, pid, f"raw{chunk}-{i}".encode(), chunk, nbytes)
                secs[label].append(t)
                cpu[label].append(c)
    finally:
        for proc in relays:
            proc.kill()
            proc.join()
    size = f"{chunk >> 10} KiB" if chunk < 1 << 20 else f"{chunk >> 20} MiB"
    base = statistics.median(cpu["relay"])
    parts = []
    for label, _, _ in targets:
        c = statistics.median(cpu[label])
        parts.append(f"{label} {nbytes / statistics.median(secs[label]) / 1e6:5.0f} MB/s "
                     f"{c * GIB / nbytes:5.2f} {_spread(cpu[label], nbytes)} ({c / base:4.2f}x)")
    print(f"{f'raw wire, {size} WRITEs':<26} CPU s/GiB vs relay: " + "   ".join(parts)
          + f"   (median of {runs})")


def _spread(cpu: list[float], nbytes: int) -> str:
    """The lowest and highest of the runs' CPU seconds per GiB: on a noisy machine the median
    alone hides how far apart the runs were."""
    return f"[{min(cpu) * GIB / nbytes:.2f}-{max(cpu) * GIB / nbytes:.2f}]"


def latency(broker: str, samples: int, tmp: Path) -> None:
    """One small line written and read back to back, in one process: through the broker
    (``zpipes.open`` both ends), and through the floors' relays of the sporadic case (the same
    two hops: into a relay process and out of it), in blocks interleaved so that a noisy
    machine weighs on each alike; an os.pipe in one process for scale."""
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

    opened = threading.Event()
    reader_box: list = []

    def open_reader():
        reader_box.append(zpipes.open("latency", "r", broker=broker))
        opened.set()

    threading.Thread(target=open_reader).start()
    writer = zpipes.open("latency", "w", broker=broker)
    opened.wait(10)
    reader = reader_box[0]

    tag = uuid.uuid4().hex[:8]
    c_in, c_out = f"ipc://@/zpipes-bench-c-in/{tag}", f"ipc://@/zpipes-bench-c-out/{tag}"
    u_in, u_out = str(tmp / "latency-in"), str(tmp / "latency-out")
    c_relay, u_relay = _spawn(C_RELAY, c_in, c_out), _spawn(UNIX_RELAY, u_in, u_out)
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    pull.rcvtimeo = WAIT_S * 1000
    push.connect(c_in)
    pull.connect(c_out)
    u_dst = bounded(socket.socket(socket.AF_UNIX))  # the relay accepts its reader first
    u_dst.connect(u_out)
    u_src = socket.socket(socket.AF_UNIX)
    u_src.connect(u_in)

    def through_zpipes() -> bytes:
        writer.write(line)
        return reader.read1(1 << 16)

    def through_c_relay() -> bytes:
        push.send(line)
        return pull.recv()

    def through_unix_relay() -> bytes:
        u_src.sendall(line)
        return u_dst.recv(1 << 16)

    ways = {"zpipes": through_zpipes, "C relay": through_c_relay,
            "unix relay": through_unix_relay}
    got: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for _ in range(4):
            for name, one in ways.items():
                for _ in range(max(1, samples // 4)):
                    t = time.perf_counter()
                    data = one()
                    got[name].append(time.perf_counter() - t)
                    assert data == line, (name, data)
        writer.flush()
    finally:
        writer.close()
        reader.close()
        push.close(0)
        pull.close(0)
        ctx.term()
        u_src.close()
        u_dst.close()
        for proc in (c_relay, u_relay):
            proc.kill()
            proc.wait()
        for path in (u_in, u_out):
            os.unlink(path)

    def pct(xs, q):
        return sorted(xs)[int(q * (len(xs) - 1))] * 1e6

    floors = "   ".join(f"{name} p50 {pct(got[name], .5):5.0f} us" for name in ways
                       if name != "zpipes")
    z50 = pct(got["zpipes"], .5)
    print(f"{'latency, one small line':<28} os.pipe p50 {pct(base, .5):6.1f} us   zpipes p50 "
          f"{z50:6.1f} us  p99 {pct(got['zpipes'], .99):7.1f} us   {floors}   "
          f"(zpipes / C relay {z50 / pct(got['C relay'], .5):.2f}x; {len(got['zpipes'])} "
          f"samples each)")


# --- sporadic lines: one line every few ms, as ``tail -f | zpipes write`` makes them ----------

# Each end runs in a process of its own (``python -c``): ``argv``: kind, address, pipe, lines,
# warm-up, interval in seconds. The writer stamps each line with CLOCK_MONOTONIC (one clock for
# every process of the machine) just before it writes it; the reader takes the arrival time as
# it has the line. Both count their own CPU time (user + system, all threads) over the lines
# after the warm-up. Kinds: "zpipes" (zpipes.open, write + flush, readline), "zmq" (pyzmq
# PUSH/PULL through a C relay, zmq.proxy), "unix" (plain Unix stream sockets through a
# minimal relay, no libzmq at all).
SPORADIC_WRITER = r"""
import os, resource, sys, time
kind, address, pipe, n, warm, every = sys.argv[1:7]
n, warm, every = int(n), int(warm), float(every)
if kind == "zpipes":
    import zpipes
    out = zpipes.open(pipe, "w", broker=address)
    def send(line):
        out.write(line)
        out.flush()
elif kind == "zmq":
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.connect(address)
    send = s.send
else:
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.connect(address)
    send = s.sendall
sys.stdin.readline()  # the reader is ready
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
tick = time.monotonic() + every
for i in range(n + warm):
    if i == warm:
        c = cpu()
    delay = tick - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    tick += every
    send(b"%d %d\n" % (time.monotonic_ns(), i))
c = cpu() - c
if kind == "zpipes":
    out.close()
print(c, flush=True)
"""

SPORADIC_READER = r"""
import resource, sys, time
kind, address, pipe, n, warm, every = sys.argv[1:7]
n, warm = int(n), int(warm)
if kind == "zpipes":
    import zpipes
    src = zpipes.open(pipe, "r", broker=address)
    readline = src.readline
elif kind == "zmq":
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.connect(address)
    readline = s.recv
else:
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.connect(address)
    readline = s.makefile("rb", buffering=0).readline
print("ready", flush=True)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
got = []
for i in range(n + warm):
    line = readline()
    now = time.monotonic_ns()
    if i == warm:
        c = cpu()
    if i >= warm:
        got.append(now - int(line.split()[0]))
c = cpu() - c
print(c, *got, flush=True)
"""

# The floors' relays: the C one forwards with libzmq alone (zmq.proxy runs in C); the Unix one
# is a plain Python loop over two sockets (what the kernel and one process in the middle cost).
C_RELAY = r"""
import sys, zmq
ctx = zmq.Context(); a = ctx.socket(zmq.PULL); a.bind(sys.argv[1])
b = ctx.socket(zmq.PUSH); b.bind(sys.argv[2])
print("ready", flush=True)
zmq.proxy(a, b)
"""
UNIX_RELAY = r"""
import os, socket, sys
srv_in = socket.socket(socket.AF_UNIX); srv_in.bind(sys.argv[1]); srv_in.listen()
srv_out = socket.socket(socket.AF_UNIX); srv_out.bind(sys.argv[2]); srv_out.listen()
print("ready", flush=True)
dst, _ = srv_out.accept()
src, _ = srv_in.accept()
while True:
    data = src.recv(1 << 16)
    if not data:
        break
    dst.sendall(data)
"""


def _sporadic_run(kind: str, address: tuple[str, str], pipe: str, n: int, warm: int,
                  every: float, pid: int, env: dict) -> tuple[list[float], float, float, float]:
    """One run of ``n`` lines: (latencies in seconds, the writer's CPU seconds, the reader's,
    the middle's: the broker's or the relay's)."""
    args = [kind, "", pipe, str(n), str(warm), str(every)]
    reader = subprocess.Popen([sys.executable, "-c", SPORADIC_READER, *args[:1], address[1],
                               *args[2:]], stdout=subprocess.PIPE, env=env)
    if reader.stdout.readline() != b"ready\n":  # type: ignore[union-attr]
        raise SystemExit(f"sporadic {kind}: the reader did not start")
    writer = subprocess.Popen([sys.executable, "-c", SPORADIC_WRITER, *args[:1], address[0],
                               *args[2:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=env)
    time.sleep(0.3)  # (connected and opened by then; the warm-up covers the rest)
    middle = cpu_seconds(pid)
    w_out, _ = writer.communicate(b"go\n", timeout=600)
    r_out, _ = reader.communicate(timeout=60)
    middle = cpu_seconds(pid) - middle
    if writer.returncode or reader.returncode:
        raise SystemExit(f"sporadic {kind}: writer/reader failed")
    fields = r_out.split()
    return ([int(x) * 1e-9 for x in fields[1:]], float(w_out), float(fields[0]), middle)


def _spawn(script: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE)
    if proc.stdout.readline() != b"ready\n":  # type: ignore[union-attr]
        raise SystemExit("a relay did not start")
    return proc


def sporadic(broker: subprocess.Popen, tmp: Path, n: int, warm: int, every: float,
             runs: int) -> None:
    """One line every ``every`` seconds through the broker (zpipes.open, write + flush in one
    process, readline in another), and the same two hops through the floors' relays, runs
    interleaved; arrival minus write time, and the CPU time per line of each process."""
    env = dict(os.environ)
    bname = broker.args[len(ZBROKER)]
    tag = uuid.uuid4().hex[:8]
    c_in, c_out = f"ipc://@/zpipes-bench-c-in/{tag}", f"ipc://@/zpipes-bench-c-out/{tag}"
    u_in, u_out = str(tmp / "relay-in"), str(tmp / "relay-out")
    c_relay = _spawn(C_RELAY, c_in, c_out)
    results: dict[str, list[tuple[list[float], float, float, float]]] = {
        "zpipes": [], "zmq": [], "unix": []}
    try:
        for i in range(runs):
            results["zpipes"].append(_sporadic_run("zpipes", (bname, bname), f"sporadic{i}", n,
                                                   warm, every, broker.pid, env))
            results["zmq"].append(_sporadic_run("zmq", (c_in, c_out), "", n, warm, every,
                                                c_relay.pid, env))
            u_relay = _spawn(UNIX_RELAY, u_in, u_out)  # (one pair of connections each)
            try:
                results["unix"].append(_sporadic_run("unix", (u_in, u_out), "", n, warm,
                                                     every, u_relay.pid, env))
            finally:
                u_relay.kill()
                u_relay.wait()
                for path in (u_in, u_out):
                    os.unlink(path)
    finally:
        c_relay.kill()
        c_relay.wait()

    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[int(q * (len(xs) - 1))] * 1e6

    def us_per_line(k: int, label: str) -> float:
        return statistics.median(r[k] for r in results[label]) / n * 1e6

    parts = []
    for label, name, middle in (("zpipes", "zpipes", "broker"), ("zmq", "C relay", "relay"),
                                ("unix", "unix relay", "relay")):
        every_sample = [x for r in results[label] for x in r[0]]
        parts.append(f"{name} p50 {pct(every_sample, .5):5.0f} us p99 "
                     f"{pct(every_sample, .99):6.0f} us (CPU us/line: write "
                     f"{us_per_line(1, label):.0f}, read {us_per_line(2, label):.0f}, "
                     f"{middle} {us_per_line(3, label):.0f})")
    print(f"{f'sporadic, a line every {every * 1e3:g} ms':<28} " + "   ".join(parts)
          + f"   ({n} samples after {warm} of warm-up, x{runs} runs)")


def metrics_cost(chunk: int, nbytes: int, runs: int, interval: float) -> None:
    """The raw wire case through a broker without metrics and one whose endpoint is scraped,
    interleaved in the same run."""
    from pzq_load import free_port
    from scraper import Scraper

    port = free_port()
    off = start_broker(f"bench-off-{uuid.uuid4().hex[:8]}")
    on = start_broker(f"bench-on-{uuid.uuid4().hex[:8]}", "--metrics", f"127.0.0.1:{port}")
    results: dict[str, tuple[list[float], list[float]]] = {"off": ([], []), "on": ([], [])}
    try:
        with Scraper(port, interval) as scraper:
            for i in range(runs):
                for label, proc in (("off", off), ("on", on)):
                    endpoint = zpipes.client.endpoint(proc.args[len(ZBROKER)])
                    t, c = raw_transfer(endpoint, proc.pid, f"m{label}{i}".encode(), chunk,
                                        nbytes)
                    results[label][0].append(t)
                    results[label][1].append(c)
    finally:
        for proc in (off, on):
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    rate = {k: nbytes / statistics.median(v[0]) / 1e6 for k, v in results.items()}
    cpu = {k: statistics.median(v[1]) * GIB / nbytes for k, v in results.items()}
    print(f"{f'metrics, {chunk >> 10} KiB WRITEs':<28} off {rate['off']:7.0f} MB/s "
          f"{cpu['off']:5.2f} CPU s/GiB   on {rate['on']:7.0f} MB/s {cpu['on']:5.2f} CPU s/GiB "
          f"({scraper.scrapes} scrapes, every {interval:g} s)   difference: rate "
          f"{(rate['on'] / rate['off'] - 1) * 100:+.1f} %, broker CPU "
          f"{(cpu['on'] / cpu['off'] - 1) * 100:+.1f} %   (median of {runs})")


#: a virtual machine's guest halt polling (the haltpoll cpuidle driver): how long an idle CPU
#: polls before it halts. With 0, every wake-up of a process on an idle CPU waits for that CPU
#: to leave a halt (a VM exit and entry), and a small round trip's latency is mostly that
HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def halt_polling() -> str:
    """The machine's guest halt polling, as printed in the benches' headers."""
    try:
        ns = int(HALT_POLL.read_text())
    except (OSError, ValueError):
        return "no guest halt polling driver"
    return f"guest halt polling {ns // 1000} us" if ns else "guest halt polling off"


@contextlib.contextmanager
def halt_poll_set(ns: int | None):
    """With ``ns``: the machine's guest halt polling set to it for the run, and put back
    after (root only; the benches never change it unless asked with --halt-poll-ns)."""
    if ns is None:
        yield
        return
    try:
        before = HALT_POLL.read_text()
        HALT_POLL.write_text(str(ns))
    except OSError as e:
        raise SystemExit(f"--halt-poll-ns: cannot set the guest halt polling ({e}): it needs "
                         "root, on a virtual machine whose kernel has the haltpoll driver") from e
    try:
        yield
    finally:
        HALT_POLL.write_text(before)


def add_halt_poll_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--halt-poll-ns", type=int, metavar="NS",
                    help="set the machine's guest halt polling (root, virtual machines) for the "
                    "run and put it back after: 200000 is the kernel's default, 0 is off")


def compile_packages() -> None:
    """Compile the packages' bytecode first, as an install does: the clients' start-up then
    counts what a user's start does, not the compiling of modules changed since their last
    compile (with PYTHONDONTWRITEBYTECODE set, a source tree's stale bytecode is compiled
    again in every process: 8 ms for the zpipes command)."""
    import compileall

    import zbroker

    for package in (zpipes, zbroker):
        compileall.compile_dir(os.path.dirname(package.__file__), quiet=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, one run each")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", type=int, metavar="MIB",
                    help="MiB per raw-wire and bulk transfer (default 1024, --quick 128)")
    ap.add_argument("--cases", default="raw,bulk,lines,latency,sporadic",
                    help="comma-separated subset of raw,bulk,lines,latency,sporadic "
                    "(default: all)")
    ap.add_argument("--metrics", action="store_true",
                    help="only: metrics off against metrics on and scraped, in the same run")
    ap.add_argument("--scrape-interval", type=float, default=1.0, metavar="SECONDS")
    add_halt_poll_option(ap)
    args = ap.parse_args()
    with halt_poll_set(args.halt_poll_ns):
        run(args)


def run(args: argparse.Namespace) -> None:
    size = (args.size << 20) if args.size else (128 << 20) if args.quick else (1 << 30)
    lines = 100_000 if args.quick else 1_000_000
    runs = 1 if args.quick else args.runs
    cases = set(args.cases.split(","))
    if args.metrics:
        print(f"zbroker ZPIPES benchmark, metrics off and on, {os.cpu_count()} cores")
        metrics_cost(64 << 10, size, runs, args.scrape_interval)
        return
    compile_packages()
    broker = f"bench-{uuid.uuid4().hex[:8]}"
    proc = start_broker(broker)
    tmp = Path(tempfile.mkdtemp())
    try:
        print(f"zbroker ZPIPES benchmark, {os.cpu_count()} cores, {halt_polling()}")
        if "raw" in cases:
            for chunk in (64 << 10, 1 << 20):
                raw_wire(proc, chunk, size, runs)
        if "bulk" in cases:
            throughput(f"bulk {size >> 20} MiB", f"head -c {size} /dev/zero", size, proc, tmp,
                       runs)
        if "lines" in cases:
            text = "a line of log text, about sixty bytes long, for the bench"
            nbytes = lines * (len(text) + 1)
            throughput(f"{lines} lines of {len(text) + 1} B", f"yes '{text}' | head -n {lines}",
                       nbytes, proc, tmp, runs)
        if "latency" in cases:
            latency(broker, 200 if args.quick else 2000, tmp)
        if "sporadic" in cases:
            sporadic(proc, tmp, 200 if args.quick else 1900, 20 if args.quick else 100, 0.002,
                     runs)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
