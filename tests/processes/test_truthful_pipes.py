"""A reader tells a complete stream from a cut one, and original clients are never cut off: real
broker processes, clients that speak the original wire (tests/wire.py: one request at a time,
never a PING, like the original C client) and client processes killed with SIGKILL."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO_ROOT, broker_env, free_port, run_zbroker, wait_for
from wire import (
    INPUT_OK,
    OUTPUT_OK,
    READ_END,
    READ_FAILED,
    READ_OK,
    READ_TIMEOUT,
    WRITE_FAILED,
    WRITE_OK,
    RawClient,
    close,
    input_,
    output,
    read,
    write,
)

NOTICED_WITHIN = 1.0  # seconds: a dead client's ends are detached within this
KiB, MiB = 1 << 10, 1 << 20

# A client process to kill: it opens a pipe end over the original wire, does its part, says
# "ready" and waits to be killed. argv: endpoint, role ("writer" or "reader"), pipe, bytes.
ENDPOINT_CLIENT = textwrap.dedent("""
    import sys, time, zmq
    sys.path.insert(0, {tests!r})
    from wire import RawClient, input_, output, write
    endpoint, role, pipe, size = sys.argv[1], sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
    c = RawClient(zmq.Context(), endpoint)
    if role == "writer":
        assert c.call(output(pipe))[0] == 5
        if size:
            assert c.call(write(b"k" * size, 0))[0] == 13
    else:
        assert c.call(input_(pipe))[0] == 2
    print("ready", flush=True)
    time.sleep(600)
""").format(tests=str(REPO_ROOT / "tests"))


def endpoint_client(endpoint: str, role: str, pipe: bytes, size: int = 0) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", ENDPOINT_CLIENT, endpoint, role,
                             pipe.decode(), str(size)], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    return proc


def sigkill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(10)


def zpipes_read(b, pipe: str, tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zpipes", "read", "--endpoint", b.endpoint,
                             "--broker", b.name, pipe],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=broker_env(tmp_path))


def status(b) -> dict:
    r = run_zbroker(["status", b.name, "--json"], cwd=b.dir)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["services"]["zpipes"]


def fail_reason_within(reader: RawClient, seconds: float) -> str:
    """Send READs until one fails; the data before must have been drained by the caller."""
    t = time.monotonic()
    reader.send(read(MiB, 0))
    kind, reason = reader.recv()
    assert kind == READ_FAILED, (kind, reason)
    assert time.monotonic() - t < seconds, f"noticed after {time.monotonic() - t:.2f} s"
    return reason


def transport_config(transport: str, client_timeout: float) -> dict:
    """A broker's config with its ZPIPES endpoint on ipc or on loopback tcp."""
    config: dict = {"clients": {"timeout": client_timeout}}
    if transport == "tcp":
        config["services"] = {"zpipes": {"endpoint": f"tcp://127.0.0.1:{free_port()}"}}
    return config


@pytest.fixture(params=["ipc", "tcp"])
def transport_broker(request, start_broker):
    """A broker with a 1 s client timeout, its ZPIPES endpoint on ipc or on loopback tcp."""
    return start_broker(config=transport_config(request.param, 1))


# --- a writer that ends without CLOSE cuts its readers' stream -----------------------------------


def test_sigkilled_writer_fails_its_reader_after_its_data(transport_broker, ctx):
    b = transport_broker
    reader = RawClient(ctx, b.endpoint)
    assert reader.call(input_(b"killed")) == (INPUT_OK, None)
    writer = endpoint_client(b.endpoint, "writer", b"killed", 3000)
    reader.send(read(MiB, 0))
    assert reader.recv() == (READ_OK, b"k" * 3000)
    reader.send(read(MiB, 0))  # pending when the writer dies
    t = time.monotonic()
    sigkill(writer)
    assert reader.recv() == (READ_FAILED, "writer lost: disconnected")
    assert time.monotonic() - t < NOTICED_WITHIN
    assert reader.call(read(MiB, 0)) == (READ_FAILED, "writer lost: disconnected")  # sticky
    reader.close()


def test_zpipes_read_exits_1_with_the_reason_when_its_writer_is_killed(broker, ctx, tmp_path):
    r = zpipes_read(broker, "cut", tmp_path)
    wait_for(lambda: "cut" in status(broker)["pipes"], 10, "the reader to attach")
    writer = endpoint_client(broker.endpoint, "writer", b"cut", 5000)
    wait_for(lambda: status(broker)["pipes"]["cut"]["bytes_read"] == 5000, 10,
             "the reader to take the data")
    sigkill(writer)
    out, err = r.communicate(timeout=30)
    assert r.returncode == 1, err
    assert out == b"k" * 5000  # everything delivered before the cut, then the failure
    assert err.decode().strip() == "zpipes: read from pipe 'cut' failed: writer lost: disconnected"


def test_expired_writer_fails_the_reader_with_the_reason(start_broker, tmp_path):
    b = start_broker(config={"clients": {"timeout": 1}})
    r = zpipes_read(b, "silent", tmp_path)  # the library PINGs: it is never expired itself
    wait_for(lambda: "silent" in status(b)["pipes"], 10, "the reader to attach")
    # it writes, then is silent with nothing held
    writer = endpoint_client(b.endpoint, "writer", b"silent", 100)
    try:
        out, err = r.communicate(timeout=30)
    finally:
        sigkill(writer)
    assert r.returncode == 1 and out == b"k" * 100
    assert err.decode().strip() == "zpipes: read from pipe 'silent' failed: writer lost: expired"


def test_a_closed_stream_is_complete(broker, ctx, tmp_path):
    """The other side of the coin: CLOSE, and only CLOSE, ends the stream for its readers."""
    r = zpipes_read(broker, "whole", tmp_path)
    wait_for(lambda: "whole" in status(broker)["pipes"], 10, "the reader to attach")
    w = RawClient(ctx, broker.endpoint)
    data = random.randbytes(300 * KiB)
    assert w.call(output(b"whole")) == (OUTPUT_OK, None)
    assert w.call(write(data, 0)) == (WRITE_OK, None)
    w.call(close())
    out, err = r.communicate(timeout=30)
    assert r.returncode == 0 and out == data, err
    w.close()


# --- dead clients are noticed at once ------------------------------------------------------------


def test_sigkilled_last_reader_fails_the_held_writer_within_a_second(transport_broker, ctx):
    b = transport_broker
    reader = endpoint_client(b.endpoint, "reader", b"orphan")
    writer = RawClient(ctx, b.endpoint)
    assert writer.call(output(b"orphan")) == (OUTPUT_OK, None)
    assert writer.call(write(b"x" * MiB, 0)) == (WRITE_OK, None)  # fills the reader's capacity
    writer.send(write(b"y", 0))
    assert writer.nothing_within(200)  # held by flow control
    t = time.monotonic()
    sigkill(reader)
    assert writer.recv() == (WRITE_FAILED, "no readers")
    assert time.monotonic() - t < NOTICED_WITHIN
    writer.close()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_status_counts_only_live_clients_after_kills(start_broker, ctx, transport):
    # A long client timeout: the killed clients go because their connections end, not by
    # expiry (with 1 s, the first of five clients started one after the other on a loaded
    # machine could expire before they were counted).
    b = start_broker(config=transport_config(transport, 60))
    live = RawClient(ctx, b.endpoint)
    assert live.call(input_(b"alive")) == (INPUT_OK, None)
    live.send(read(10, 0))  # held: a live client that is never expired
    killed = [endpoint_client(b.endpoint, role, b"dead%d" % i)
              for i, role in enumerate(["reader", "writer", "reader", "writer", "writer"])]
    assert status(b)["clients"] == 6
    for proc in killed:
        sigkill(proc)
    t = time.monotonic()
    wait_for(lambda: status(b)["clients"] == 1, 10, "the dead clients to go")
    assert time.monotonic() - t < NOTICED_WITHIN + 1.0  # each status call starts a process
    assert set(status(b)["pipes"]) == {"alive"}
    live.close()


# --- an original client is never expired while we hold its request -------------------------------


def test_never_pinging_writer_held_past_the_client_timeout_completes(start_broker, ctx):
    """The original C client never PINGs. Client timeout 1 s; the writer is held by a slow reader
    for about 5 s, the reader waits with a READ pending on an empty pipe: both complete, every
    byte arrives."""
    b = start_broker(config={"clients": {"timeout": 1},
                             "services": {"zpipes": {"capacity": "64KiB"}}})
    writer, reader = RawClient(ctx, b.endpoint, 10_000), RawClient(ctx, b.endpoint, 10_000)
    assert reader.call(input_(b"held")) == (INPUT_OK, None)
    reader.send(read(64 * KiB, 0))
    time.sleep(2.5)  # a READ held on an empty pipe, twice the client timeout
    assert writer.call(output(b"held")) == (OUTPUT_OK, None)
    data = random.randbytes(384 * KiB)  # the writer held for about 4.5 s in all
    got = bytearray()
    t = time.monotonic()
    for i in range(0, len(data), 64 * KiB):
        writer.send(write(data[i:i + 64 * KiB], 0))
        if i == 0:
            kind, chunk = reader.recv()  # the READ held since before the writer came
            assert kind == READ_OK
            got += chunk
        while True:  # the reader takes a little every 0.45 s: the writer waits on it
            # (a little time for a WRITE_OK the last READ made to arrive: a writer that missed
            # it would be silent, holding nothing, past the client timeout, as a client that
            # does not send its next WRITE is, and be expired)
            if writer.sock.poll(100):
                break
            time.sleep(0.45)
            kind, chunk = reader.call(read(16 * KiB, 0))
            assert kind == READ_OK, (kind, chunk)
            got += chunk
        assert writer.recv() == (WRITE_OK, None)
    assert time.monotonic() - t > 2.5  # the writer really was held past the client timeout
    assert writer.call(close())[0] == 17
    while True:
        kind, chunk = reader.call(read(64 * KiB, 0))
        if kind == READ_END:
            break
        assert kind == READ_OK
        got += chunk
    assert bytes(got) == data
    writer.close()
    reader.close()


def test_original_client_transfer_with_chunks_of_1_byte_to_1_mib(start_broker, ctx):
    """One request at a time, no PING ever, WRITE chunks from 1 B to 1 MiB, READs with
    timeout 0 (wait for ever) and with a timeout, a 1 s client timeout: the sha256 agrees."""
    b = start_broker(config={"clients": {"timeout": 1}})
    writer, reader = RawClient(ctx, b.endpoint, 20_000), RawClient(ctx, b.endpoint, 20_000)
    assert reader.call(input_(b"orig")) == (INPUT_OK, None)
    assert writer.call(output(b"orig")) == (OUTPUT_OK, None)
    rng = random.Random(7)
    sizes = [1, 2, 3, 100, 4096, 65536, MiB] + [rng.choice([1, 17, 1000, 65536, 300_000, MiB])
                                                 for _ in range(40)]
    data = random.randbytes(sum(sizes))
    sent = hashlib.sha256()
    got = hashlib.sha256()
    received = 0
    offset = 0
    timeouts = 0
    for n, size in enumerate(sizes):
        chunk = data[offset:offset + size]
        offset += size
        sent.update(chunk)
        assert writer.call(write(chunk, 0 if n % 2 else 5000)) == (WRITE_OK, None)
        while received < offset:  # the reader drains before the next WRITE (capacity 1 MiB)
            kind, part = reader.call(read(rng.choice([1, 1000, 65536, MiB]),
                                          0 if n % 3 else 200))
            assert kind in (READ_OK, READ_TIMEOUT), (kind, part)
            if kind == READ_OK:
                got.update(part)
                received += len(part)
            else:
                timeouts += 1
    assert writer.call(close())[0] == 17
    assert reader.call(read(10, 100)) == (READ_END, None)
    assert received == len(data) and got.hexdigest() == sent.hexdigest()
    assert reader.call(read(10, 100)) == (READ_END, None)
    writer.close()
    reader.close()


# --- an over-size WRITE gets an answer -----------------------------------------------------------


def test_write_over_max_chunk_is_refused_with_the_limit(start_broker, ctx):
    b = start_broker(config={"services": {"zpipes": {"max_chunk": "1MiB"}}})
    reader, writer = RawClient(ctx, b.endpoint), RawClient(ctx, b.endpoint)
    assert reader.call(input_(b"big")) == (INPUT_OK, None)
    assert writer.call(output(b"big")) == (OUTPUT_OK, None)
    assert writer.call(write(b"a" * 1000, 0)) == (WRITE_OK, None)
    size = MiB + MiB // 2
    reason = f"chunk of {size} bytes is over the broker's limit of {MiB} bytes (max_chunk)"
    assert writer.call(write(b"b" * size, 0)) == (WRITE_FAILED, reason)
    assert writer.call(close())[0] == 17  # a close after the refusal does not mend the stream
    assert reader.call(read(MiB, 0)) == (READ_OK, b"a" * 1000)
    assert reader.call(read(MiB, 0)) == (READ_FAILED, "writer lost: " + reason)
    reader.close()
    writer.close()


def test_write_far_over_max_chunk_drops_the_connection_and_fails_the_readers(start_broker, ctx):
    """A frame the transport refuses to take drops its connection: the writer's readers fail
    (after the data it sent before), the broker logs it, every other client goes on."""
    b = start_broker(config={"services": {"zpipes": {"max_chunk": "64KiB"}}})
    reader, writer = RawClient(ctx, b.endpoint), RawClient(ctx, b.endpoint, 1000)
    other = RawClient(ctx, b.endpoint)
    assert reader.call(input_(b"huge")) == (INPUT_OK, None)
    assert writer.call(output(b"huge")) == (OUTPUT_OK, None)
    assert writer.call(write(b"a" * 1000, 0)) == (WRITE_OK, None)
    writer.send(write(b"x" * (3 * 64 * KiB), 0))
    assert reader.call(read(MiB, 0)) == (READ_OK, b"a" * 1000)
    assert fail_reason_within(reader, 10) == "writer lost: disconnected"
    assert other.call(input_(b"huge")) == (INPUT_OK, None)
    wait_for(lambda: "client disconnected" in b.stderr(), 10, "the disconnect to be logged")
    for c in (reader, writer, other):
        c.close()


def test_sigterm_of_the_broker_still_fails_pending_reads_with_its_reason(start_broker, ctx):
    b = start_broker()
    reader, writer = RawClient(ctx, b.endpoint), RawClient(ctx, b.endpoint)
    assert reader.call(input_(b"stop")) == (INPUT_OK, None)
    assert writer.call(output(b"stop")) == (OUTPUT_OK, None)
    reader.send(read(10, 0))
    assert reader.nothing_within(100)
    b.send_signal(signal.SIGTERM)
    kind, reason = reader.recv()
    assert kind == READ_FAILED and "broker stopping" in reason
    assert b.wait() == 0
    reader.close()
    writer.close()
