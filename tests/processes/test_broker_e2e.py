"""A real broker process, real ZeroMQ over ipc, and clients that speak the original wire."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
import zmq
from helpers import wait_for
from wire import (
    CLOSE_OK,
    INPUT_FAILED,
    INPUT_OK,
    INVALID,
    OUTPUT_OK,
    PING_OK,
    READ_END,
    READ_FAILED,
    READ_OK,
    READ_TIMEOUT,
    WRITE_FAILED,
    WRITE_OK,
    WRITE_TIMEOUT,
    RawClient,
    close,
    input_,
    output,
    ping,
    read,
    write,
)


@pytest.fixture
def clients(ctx, broker):
    made = []

    def make(timeout_ms=5000):
        c = RawClient(ctx, broker.endpoint, timeout_ms)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_original_selftest_replayed_on_the_wire(clients, broker):
    reader, writer = clients(), clients()
    assert reader.call(input_(b"test pipe")) == (INPUT_OK, None)
    assert writer.call(output(b"test pipe")) == (OUTPUT_OK, None)
    assert reader.call(read(6, 100)) == (READ_TIMEOUT, None)
    for chunk in (b"CHUNK1", b"CHUNK2", b"CHUNK3"):
        assert writer.call(write(chunk, 100)) == (WRITE_OK, None)
    assert reader.call(read(1, 100)) == (READ_OK, b"C")
    assert reader.call(read(10, 100)) == (READ_OK, b"HUNK1CHUNK")
    assert writer.call(close()) == (CLOSE_OK, None)
    assert reader.call(read(50, 100)) == (READ_OK, b"2CHUNK3")
    assert reader.call(read(50, 100)) == (READ_END, None)
    assert reader.call(write(b"CHUNK1", 100)) == (INVALID, None)
    assert broker.alive()


def test_original_selftest_pipelining_on_the_wire(clients):
    reader, writer = clients(), clients()
    assert reader.call(input_(b"test pipe 2")) == (INPUT_OK, None)
    assert writer.call(output(b"test pipe 2")) == (OUTPUT_OK, None)
    for _ in range(3):
        reader.send(read(6, 300))
    reader.send(ping())
    assert reader.recv() == (PING_OK, None)  # at once, ahead of the pending READs
    assert reader.recv() == (READ_TIMEOUT, None)
    assert writer.call(write(b"CHUNK1", 300)) == (WRITE_OK, None)
    assert reader.recv() == (READ_OK, b"CHUNK1")
    assert writer.call(close()) == (CLOSE_OK, None)
    assert reader.recv() == (READ_END, None)


def test_write_with_no_timeout_waits_for_a_reader_then_close(clients):
    writer = clients()
    assert writer.call(output(b"lonely")) == (OUTPUT_OK, None)
    writer.send(write(b"hello", 0))
    assert writer.nothing_within(300)
    reader = clients()
    assert reader.call(input_(b"lonely")) == (INPUT_OK, None)
    assert writer.recv() == (WRITE_OK, None)
    writer2 = clients()
    assert writer2.call(output(b"other")) == (OUTPUT_OK, None)
    writer2.send(write(b"x", 0))
    writer2.send(close())
    assert writer2.recv() == (WRITE_FAILED, "pipe closed by client")
    assert writer2.recv() == (CLOSE_OK, None)


def test_defect1_short_data_read_answers_within_its_timeout(clients):
    reader, writer = clients(), clients()
    reader.call(input_(b"p1"))
    writer.call(output(b"p1"))
    writer.call(write(b"abc", 0))
    t = time.monotonic()
    assert reader.call(read(1000, 5000)) == (READ_OK, b"abc")
    assert time.monotonic() - t < 2.0  # answered at once, not after 5 s nor never
    t = time.monotonic()
    assert reader.call(read(1000, 200)) == (READ_TIMEOUT, None)
    assert time.monotonic() - t >= 0.19


def test_defect2_and_3_ping_during_pending_read(clients):
    reader, writer = clients(), clients()
    reader.call(input_(b"p23"))
    writer.call(output(b"p23"))
    reader.send(read(10, 400))
    for _ in range(3):
        time.sleep(0.05)  # PINGs spread over the READ's wait
        assert reader.call(ping()) == (PING_OK, None)
    assert reader.recv() == (READ_TIMEOUT, None)  # the timeout still fired
    reader.send(read(10, 0))
    assert reader.call(ping()) == (PING_OK, None)
    writer.call(write(b"data", 0))
    assert reader.recv() == (READ_OK, b"data")  # not an empty READ_OK


def test_defect4_writer_opens_while_local_reader_has_read_pending(clients, broker):
    reader, writer = clients(), clients()
    reader.call(input_(b"p4"))
    reader.send(read(10, 0))
    assert writer.call(output(b"p4")) == (OUTPUT_OK, None)
    assert writer.call(write(b"ok", 0)) == (WRITE_OK, None)
    assert reader.recv() == (READ_OK, b"ok")
    assert broker.alive()


def test_defect5_malformed_frames_do_not_stop_the_service(ctx, clients, broker):
    reader, writer = clients(), clients()
    reader.call(input_(b"p5"))
    writer.call(output(b"p5"))
    hostile = clients()
    for junk in (b"", b"\x00", b"\xaa", b"\xaa\xa0", b"\xaa\xa0\x00", b"\xaa\xa0\xff",
                 b"\xaa\xa0\x07\x00", b"\xaa\xa0\x0c\xff\xff\xff\xff", b"\xaa\xa0\x14"):
        assert hostile.call(junk) == (INVALID, None)
    hostile.sock.send_multipart([ping(), ping()])  # two frames
    assert hostile.recv() == (INVALID, None)
    assert writer.call(write(b"still here", 0)) == (WRITE_OK, None)
    assert reader.call(read(100, 1000)) == (READ_OK, b"still here")


def test_defect6_invalid_command_after_open_leaves_nothing_dangling(clients):
    writer = clients()
    writer.call(output(b"p6"))
    assert writer.call(read(1, 0)) == (INVALID, None)
    reader = clients()
    reader.call(input_(b"p6"))
    # the writer end was detached: the reader, having never seen a writer, times out
    assert reader.call(read(1, 200)) == (READ_TIMEOUT, None)


def test_defect10_name_length_limits(clients):
    c = clients()
    assert c.call(input_(b"n" * 255)) == (INPUT_OK, None)
    c.call(close())
    assert c.call(input_(b"")) == (INPUT_FAILED, "pipe name is empty")
    assert c.call(input_(b"\xc3\x28")) == (INPUT_FAILED, "pipe name is not valid UTF-8")


def test_stale_data_does_not_survive_both_ends_closing(clients):
    """Seed bug: "zpipes retains data for disconnected pipes"."""
    reader, writer = clients(), clients()
    reader.call(input_(b"stale"))
    writer.call(output(b"stale"))
    writer.call(write(b"old data", 0))
    writer.call(close())
    reader.call(close())
    reader.call(input_(b"stale"))
    writer.call(output(b"stale"))
    writer.call(close())
    assert reader.call(read(100, 1000)) == (READ_END, None)


def test_reader_sees_writer_close_as_end_not_block(clients):
    """Seed bugs "zpipe reads block on closed writer" and "reader/writer issue"."""
    reader, writer = clients(), clients()
    reader.call(input_(b"rw"))
    writer.call(output(b"rw"))
    writer.call(write(b"small", 0))
    assert reader.call(read(1 << 20, 0)) == (READ_OK, b"small")
    reader.send(read(1 << 20, 0))  # a big read blocks...
    assert reader.nothing_within(100)
    writer.call(close())  # ...until the writer closes
    assert reader.recv() == (READ_END, None)


def test_fuzzing_client_next_to_a_live_pipe(ctx, clients, broker):
    """A hostile client firing random frames while a pipe streams: the data arrives intact
    and the broker keeps serving everyone."""
    reader, writer = clients(), clients()
    reader.call(input_(b"live"))
    writer.call(output(b"live"))
    rng = random.Random(5)
    payload = os.urandom(1 << 20)
    stop = threading.Event()
    answered = []

    def fuzz():
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(broker.endpoint)
        while not stop.is_set():
            n = rng.randrange(0, 40)
            frame = bytes(rng.randrange(256) for _ in range(n))
            if rng.random() < 0.5:
                frame = b"\xaa\xa0" + bytes([rng.randrange(0, 30)]) + frame
            sock.send(frame)
            while sock.poll(0):
                answered.append(sock.recv())
        sock.close()

    t = threading.Thread(target=fuzz)
    t.start()
    try:
        got = bytearray()
        for i in range(0, len(payload), 4096):
            assert writer.call(write(payload[i : i + 4096], 0)) == (WRITE_OK, None)
            while True:
                reader.send(read(1 << 16, 0))
                mid, data = reader.recv()
                assert mid == READ_OK
                got += data
                if len(got) >= i + 4096 or len(got) == len(payload):
                    break
        assert bytes(got) == payload
    finally:
        stop.set()
        t.join(10)
    assert answered and broker.alive()


def test_closing_a_reader_with_pending_reads(clients):
    reader = clients()
    reader.call(input_(b"pc"))
    reader.send(read(10, 0))
    reader.send(read(10, 0))
    reader.send(close())
    assert [reader.recv() for _ in range(3)] == [
        (READ_FAILED, "pipe closed by client"), (READ_FAILED, "pipe closed by client"),
        (CLOSE_OK, None)]


def test_write_timeout_with_no_reader(clients):
    writer = clients()
    writer.call(output(b"nobody"))
    t = time.monotonic()
    assert writer.call(write(b"x", 200)) == (WRITE_TIMEOUT, None)
    assert 0.19 <= time.monotonic() - t < 3


def test_silent_client_is_expired_and_the_other_end_learns(start_broker, ctx):
    b = start_broker(config={"clients": {"timeout": 2}})
    reader, writer = RawClient(ctx, b.endpoint), RawClient(ctx, b.endpoint)
    try:
        reader.call(input_(b"exp"))
        writer.call(output(b"exp"))
        assert writer.call(write(b"first", 0)) == (WRITE_OK, None)
        reader.send(read(1, 0))
        assert reader.recv() == (READ_OK, b"f")
        reader.send(read(100, 0))
        assert reader.recv() == (READ_OK, b"irst")
        # the reader waits with a READ held (never expired); the writer, holding nothing, is
        # silent: it is expired, and the stream it cut fails
        reader.send(read(100, 0))
        assert reader.recv() == (READ_FAILED, "writer lost: expired")
        # a silent reader holding nothing is expired too: a writer that keeps pinging learns
        # that its reader has gone
        writer2 = RawClient(ctx, b.endpoint)
        reader2 = RawClient(ctx, b.endpoint)
        reader2.call(input_(b"exp2"))
        writer2.call(output(b"exp2"))
        assert writer2.call(write(b"x", 0)) == (WRITE_OK, None)
        deadline = time.monotonic() + 10
        outcome = None
        while time.monotonic() < deadline:
            outcome = writer2.call(write(b"y", 0))
            if outcome[0] != WRITE_OK:
                break
            time.sleep(0.2)
        assert outcome == (WRITE_FAILED, "no readers")
        writer2.close()
        reader2.close()
    finally:
        reader.close()
        writer.close()


def test_sigterm_fails_pending_requests_and_exits_zero(start_broker, ctx):
    b = start_broker()
    reader = RawClient(ctx, b.endpoint)
    try:
        reader.call(input_(b"shut"))
        reader.send(read(10, 0))
        assert reader.nothing_within(100)
        assert b.stop() == 0
        assert reader.recv() == (READ_FAILED, "broker stopping")
    finally:
        reader.close()


def test_request_logs_carry_pipe_client_size_and_timeout(start_broker, ctx):
    """Seed requests "detailed logging" and "no log details of read/write requests"."""
    import json

    b = start_broker(config={"log": {"level": "debug", "format": "json"}})
    c = RawClient(ctx, b.endpoint)
    try:
        c.call(output(b"logged"))
        c.send(write(b"12345", 700))
        # the broker has taken the WRITE (it waits: nobody reads) and logged its request
        wait_for(lambda: '"request"' in b.stderr(), 5, "the WRITE's request line")
        c.call(close())
    finally:
        c.close()
    b.stop()
    events = [json.loads(line) for line in b.stderr().splitlines() if line.startswith("{")]
    request = [e for e in events if e.get("event") == "request"]
    assert request and request[0]["pipe"] == "logged" and request[0]["size"] == 5
    assert request[0]["timeout_ms"] == 700 and isinstance(request[0]["client"], int)
    opened = [e for e in events if e.get("event") == "pipe opened"]
    assert opened[0]["pipe"] == "logged" and opened[0]["role"] == "writer"


def test_oversized_frame_drops_only_that_connection(start_broker, ctx):
    b = start_broker(config={"services": {"zpipes": {"max_chunk": "64KiB"}}})
    big, other = RawClient(ctx, b.endpoint, timeout_ms=1000), RawClient(ctx, b.endpoint)
    try:
        big.call(output(b"huge"))
        big.send(write(b"x" * (256 << 10), 0))  # over twice max_chunk: refused by the transport
        assert big.nothing_within(500)
        assert other.call(ping()) == (PING_OK, None)  # everyone else goes on
        assert other.call(input_(b"huge")) == (INPUT_OK, None)
    finally:
        big.close()
        other.close()


def test_sighup_with_a_new_endpoint_binds_it_and_keeps_the_old_clients(start_broker, ctx):
    import signal

    from helpers import write_config

    b = start_broker()
    old = RawClient(ctx, b.endpoint)
    new_endpoint = f"ipc://@/zpipes/{b.name}-moved"
    try:
        assert old.call(input_(b"moving")) == (INPUT_OK, None)
        write_config(b.config_path, {"services": {"zpipes": {"endpoint": new_endpoint,
                                                            "max_chunk": "1MiB"}}})
        b.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "bound to a new endpoint" not in b.stderr() and time.monotonic() < deadline:
            time.sleep(0.05)
        new = RawClient(ctx, new_endpoint)
        assert new.call(output(b"moving")) == (OUTPUT_OK, None)
        assert new.call(write(b"across", 0)) == (WRITE_OK, None)
        assert old.call(read(10, 1000)) == (READ_OK, b"across")  # not dropped
        new.close()
    finally:
        old.close()
