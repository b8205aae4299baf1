"""Half-sent messages: another local user opens 3 000 connections that each send 60 KiB of a
64 KiB WRITE and stop (176 MiB held of a 128 MiB budget). What is still arriving counts against
that user's share (clients.max_buffered_per_source, half) first: a 16 MiB stream of this
user's written beside them goes through (before, the half-sent messages took the whole budget
and its WRITEs were refused). When the connections close, the broker gives the memory back:
its resident size comes back near where it was (before, it stayed 190 MB up)."""

from __future__ import annotations

import os
import struct
import subprocess
import threading

from helpers import (
    AS_NOBODY,
    FLOOD,
    dealer_hello,
    logged_broker,
    needs_nobody,
    rss_bytes,
    unique_name,
    wait_for,
    write_config,
)
from test_zpipes_guard import limit_files

import zpipes

COUNT = 3000


@needs_nobody
def test_half_sent_messages_count_against_their_users_share_and_their_memory_comes_back(
        tmp_path):
    name = unique_name("half")
    cfg = write_config(tmp_path / "zbroker.cfg", {
        "clients": {"max_buffered": "128MiB"},
        "services": {"zpipes": {"allow": {"users": ["*"]}}}})
    broker, log_path = logged_broker(tmp_path, name, cfg)
    half = None
    try:
        wait_for(lambda: "zpipes bound" in log_path.read_text(), 30, "the broker to start")
        endpoint = f"ipc://@/zpipes/{name}"
        before = rss_bytes(broker.pid)
        # each: a DEALER's greeting, then the first 60 KiB of a 64 KiB WRITE
        size = 64 << 10
        part = (b"\x02" + struct.pack(">Q", size) + b"\xaa\xa0\x0c"
                + struct.pack(">I", size - 11) + b"x" * (size - 8 - 4096))
        half = subprocess.Popen([*AS_NOBODY, "-c", FLOOD, str(COUNT),
                                 (dealer_hello() + part).hex(), "-", f"@/zpipes/{name}"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                cwd=tmp_path, preexec_fn=limit_files(COUNT + 256))
        assert int(half.stdout.readline()) == COUNT

        data = os.urandom(1 << 20) * 16
        got = bytearray()

        def read() -> None:
            with zpipes.open("stream", "r", endpoint=endpoint, timeout=30) as r:
                while chunk := r.read(1 << 20):
                    got.extend(chunk)

        reader = threading.Thread(target=read)
        reader.start()
        with zpipes.open("stream", "w", endpoint=endpoint, timeout=30) as w:
            for i in range(0, len(data), 1 << 20):
                w.write(data[i:i + (1 << 20)])
        reader.join(60)
        assert bytes(got) == data

        held = rss_bytes(broker.pid) - before
        assert held > 40 << 20  # they hold their share (64 MiB), no more
        assert held < 100 << 20, f"the broker grew by {held >> 20} MiB"
        half.stdin.close()  # the half-sent messages' connections go
        half.wait(30)
        half = None
        # the memory they held is given back (at most 10 s later)
        wait_for(lambda: rss_bytes(broker.pid) < before + (24 << 20), 30,
                 "the broker's memory to come back")
        assert broker.poll() is None
    finally:
        if half is not None:
            half.kill()
        broker.kill()
        broker.wait()
