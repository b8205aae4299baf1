"""Clients that ask and never read their answers cannot grow the broker: 20 ZPIPES clients
that send PINGs as fast as they can and never read, and 10 stream readers that ask for the
largest RANGE there is, again and again, and never read, on one broker beside a live pipe and
a live stream reader. The broker's resident memory stays within 150 MB of where it started
(before: about 10 MB per PINGer in 15 s, and 57 MB per RANGE reader), and the live clients
go on. What bounds it: a connection whose answers are not taken is not read until they are
(ZPIPES, a stream's or a monitor's endpoint), small answers are written as one buffer (a
transport keeps a descriptor per piece it holds), and a RANGE answer is at most 8 MiB."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import (
    free_port,
    logged_broker,
    rss_bytes,
    unique_name,
    wait_for,
    wait_steady,
    write_config,
)
from pipe_stream import (
    INPUT_OK,
    OUTPUT_OK,
    READ_OK,
    WRITE_OK,
    RawClient,
    input_,
    output,
    read,
    write,
)

from pzq.client import Producer, StreamConsumer

#: ``python -c UNREAD SECONDS TARGET FRAMES COUNT``: COUNT raw ZMTP 3.0 DEALER connections to
#: TARGET (``@NAME``: an abstract ipc socket, else ``HOST:PORT``) that send one message
#: (FRAMES: its frames in hex, comma-separated) over and over for SECONDS, never reading;
#: prints the bytes sent
UNREAD = textwrap.dedent("""
    import socket, sys, time
    seconds, target, frames, count = float(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    parts = [bytes.fromhex(f) for f in frames.split(",")]
    message = b"".join(bytes([1 if i < len(parts) - 1 else 0, len(p)]) + p
                       for i, p in enumerate(parts))
    name = b"READY"
    prop = bytes([11]) + b"Socket-Type" + (6).to_bytes(4, "big") + b"DEALER"
    body = bytes([len(name)]) + name + prop
    hello = (b"\\xff" + bytes(8) + b"\\x7f" + b"\\x03\\x00" + b"NULL" + bytes(16) + bytes(32)
             + bytes([4, len(body)]) + body)
    socks = []
    for _ in range(count):
        if target.startswith("@"):
            s = socket.socket(socket.AF_UNIX)
            s.connect("\\0" + target[1:])
        else:
            host, port = target.rsplit(":", 1)
            s = socket.create_connection((host, int(port)))
        s.sendall(hello)
        s.setblocking(False)
        socks.append(s)
    burst = message * max(1, 65536 // len(message))
    at = [0] * count
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i, s in enumerate(socks):
            try:
                n = s.send(burst[at[i]:] or burst)
            except (BlockingIOError, InterruptedError):
                continue
            at[i] = (at[i] + n) % len(burst)
            sent += n
        time.sleep(0.002)
    print(sent, flush=True)
""")

PINGERS, RANGERS = 20, 10
SECONDS = 12
PING = "aaa013"  # ZPIPES PING: signature 0xAA 0xA0, command 19


def unread(seconds: float, target: str, frames: list[bytes], count: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", UNREAD, str(seconds), target, ",".join(f.hex() for f in frames),
         str(count)], stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_clients_that_never_read_their_answers_cannot_grow_the_broker(tmp_path, ctx):
    name = unique_name("unread")
    receive, stream = free_port(), free_port()
    cfg = write_config(tmp_path / "zbroker.cfg", {
        "clients": {"max_buffered": "64MiB"},
        "services": {"pzq": {"enabled": True, "queues": {"events": {
            "mode": "stream",
            "receive_endpoint": f"tcp://127.0.0.1:{receive}",
            "stream_endpoint": f"tcp://127.0.0.1:{stream}",
            "data_dir": str(tmp_path / "events")}}}}})
    broker, log_path = logged_broker(tmp_path, name, cfg)
    endpoint = f"ipc://@/zpipes/{name}"
    floods: list[subprocess.Popen] = []
    try:
        wait_for(lambda: "pzq queue started" in log_path.read_text(), 30, "the broker to start")
        # 32 MiB in the stream: a RANGE may be answered with its most
        body = os.urandom(64 << 10)
        with Producer(f"tcp://127.0.0.1:{receive}", window=64, context=ctx) as p:
            for _ in range(512):
                p.send(body)
            p.flush(timeout=30)
        reader = StreamConsumer(f"tcp://127.0.0.1:{stream}", context=ctx, timeout=15)
        head = reader.head()
        assert head >= 512
        w, r = RawClient(ctx, endpoint, 15_000), RawClient(ctx, endpoint, 15_000)
        assert w.call(output(b"live")) == (OUTPUT_OK, None)
        assert r.call(input_(b"live")) == (INPUT_OK, None)
        # the broker settles after the producer: its memory holds still
        before = wait_steady(lambda: rss_bytes(broker.pid), 10, "the broker's memory",
                             tolerance=1 << 20)

        floods.append(unread(SECONDS, f"@/zpipes/{name}", [bytes.fromhex(PING)], PINGERS))
        asked = [b"reader", b"", b"RANGE", b"0", b"%d" % (1 << 40), b"%d" % (1 << 30),
                 b"100000"]
        floods.append(unread(SECONDS, f"127.0.0.1:{stream}", asked, RANGERS))

        peak, rounds = before, 0
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            data = b"%06d" % rounds * 100
            assert w.call(write(data, 15_000)) == (WRITE_OK, None)
            assert r.call(read(len(data), 15_000)) == (READ_OK, data)
            got = reader.range(0, head, max_bytes=1 << 20)
            assert got.messages and got.messages[0].frames[-1] == body
            rounds += 1
            peak = max(peak, rss_bytes(broker.pid))
            time.sleep(0.05)
        sent = [int(f.communicate(timeout=30)[0]) for f in floods]
        assert broker.poll() is None, log_path.read_text()[-3000:]
        # the live clients went on all along (each step within its timeout: the flood takes
        # the broker's CPU, so a step can take a second, but no one waits behind a flood)
        assert rounds >= 3
        assert sent[0] > 5 << 20, "the PINGers did not get their requests in"
        grown = peak - before
        assert grown < 150 << 20, (
            f"the broker grew by {grown >> 20} MiB under clients that never read "
            f"({sent[0] >> 20} MiB of PINGs, {sent[1] >> 10} KiB of RANGEs sent)")
        # and once they are gone, the live clients are served as before
        data = b"after" * 1000
        assert w.call(write(data, 15_000)) == (WRITE_OK, None)
        assert r.call(read(len(data), 15_000)) == (READ_OK, data)
        reader.close()
        w.close()
        r.close()
    finally:
        for f in floods:
            if f.poll() is None:
                f.kill()
        broker.kill()
        broker.wait()
