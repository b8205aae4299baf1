"""Bounded memory (defect 9): a fast writer into a slow reader must not grow the broker."""

from __future__ import annotations

import hashlib
import threading
import time

import zmq
from helpers import rss_bytes
from wire import (
    OUTPUT_OK,
    READ_END,
    READ_OK,
    WRITE_OK,
    RawClient,
    close,
    input_,
    output,
    read,
    write,
)

TOTAL = 512 << 20
CHUNK = 1 << 20
WINDOW = 8  # WRITEs the writer keeps in flight


def test_slow_reader_keeps_broker_rss_flat(broker):
    ctx = zmq.Context()
    reader = RawClient(ctx, broker.endpoint, timeout_ms=30000)
    writer = RawClient(ctx, broker.endpoint, timeout_ms=30000)
    try:
        assert reader.call(input_(b"flood"))[0] != 0
        assert writer.call(output(b"flood")) == (OUTPUT_OK, None)
        base = rss_bytes(broker.pid)
        peak = base
        block = bytes(range(256)) * (CHUNK // 256)
        sent_digest = hashlib.sha256()
        errors = []

        def write_all():
            try:
                in_flight = 0
                for i in range(TOTAL // CHUNK):
                    data = block[i % 256:] + block[: i % 256]
                    sent_digest.update(data)
                    writer.send(write(data, 0))
                    in_flight += 1
                    if in_flight == WINDOW:
                        assert writer.recv() == (WRITE_OK, None)
                        in_flight -= 1
                for _ in range(in_flight):
                    assert writer.recv() == (WRITE_OK, None)
                assert writer.call(close())[0] != 0
            except Exception as exc:  # reported by the main thread
                errors.append(exc)

        t = threading.Thread(target=write_all)
        t.start()
        got = hashlib.sha256()
        received = 0
        while True:
            mid, data = reader.call(read(256 << 10, 0))
            if mid == READ_END:
                break
            assert mid == READ_OK
            got.update(data)
            received += len(data)
            if received % (16 << 20) < len(data):
                peak = max(peak, rss_bytes(broker.pid))
            time.sleep(0.001)  # the slow reader
        t.join(60)
        assert not errors, errors
        assert received == TOTAL and got.digest() == sent_digest.digest()
        growth = peak - base
        assert growth < 64 << 20, f"broker RSS grew by {growth >> 20} MiB"
    finally:
        reader.close()
        writer.close()
        ctx.destroy(linger=0)
