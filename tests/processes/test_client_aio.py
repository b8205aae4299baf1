"""The asyncio client (``zpipes.aio``) against real broker processes over real ipc sockets.

Stream semantics (exact reads whatever the writer's cuts, lines), the distinct outcomes (end
``b""``, timeout ``TimeoutError``, failure a ``zpipes`` error with the broker's reason), a
broker that stops or dies, many pipes in one event loop, bounded buffers, cancellation, and
heartbeats from a task. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import random
import signal
import threading
import time
from typing import Any

import pytest
from helpers import assert_writer_lost, cut, wait_for_async, zpipes_connections

import zpipes
from zpipes import BrokenPipe, BrokerUnavailable, PipeFailed, PipeTimeout, ZpipesError, aio

MiB = 1 << 20
LIMIT = 30.0  # seconds: the longest any single step of these tests may take


async def write_all(broker: str, name: str, chunks: list[bytes], **opts: Any) -> int:
    """Open a writer, write each chunk with one ``write`` call, close; the bytes written."""
    async with await aio.open(name, "w", broker=broker, timeout=LIMIT, **opts) as writer:
        for chunk in chunks:
            await writer.write(chunk)
    return sum(map(len, chunks))


# --- stream semantics ------------------------------------------------------------------------


async def test_16mib_round_trip_sha256_agrees_with_exact_reads(broker):
    data = random.Random(16).randbytes(16 * MiB)
    pieces = cut(data, [1, 100_003, 3 * MiB + 5, 777, MiB])
    async with await aio.open("big", "r", broker=broker.name, timeout=LIMIT) as reader:
        writing = asyncio.create_task(write_all(broker.name, "big", pieces))
        digest, got, sizes = hashlib.sha256(), 0, [7, 65536, MiB - 1, 2 * MiB + 3, 1]
        i = 0
        while got < len(data):
            want = min(sizes[i % len(sizes)], len(data) - got)
            chunk = await reader.read(want)
            assert len(chunk) == want  # exactly n bytes, however the writer cut the data
            digest.update(chunk)
            got += want
            i += 1
        assert await reader.read(10) == b""  # then the end
        assert await reader.read() == b""
        assert await writing == len(data)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()


async def test_read_all_read1_and_a_short_read_at_the_end(broker):
    async with await aio.open("r1", "r", broker=broker.name, timeout=LIMIT) as reader:
        await write_all(broker.name, "r1", [b"abc", b"defgh"])
        first = await reader.read1(4)  # what has arrived: at least one byte, at most four
        assert 1 <= len(first) <= 4
        rest = await reader.read(100)  # short: the stream ends after it
        assert first + rest == b"abcdefgh"
        assert await reader.read1() == b""
        await write_all(broker.name, "r1", [b"second ", b"stream"])  # a new writer's stream
        assert await reader.read() == b"second stream"
        assert await reader.read() == b""


async def test_lines_cut_anywhere_readline_and_async_iteration(broker):
    lines = [f"line {i} {'x' * (i * 37 % 200)}\n".encode() for i in range(300)] + [b"last"]
    data = b"".join(lines)
    async with await aio.open("lines", "r", broker=broker.name, timeout=LIMIT) as reader:
        writing = asyncio.create_task(write_all(broker.name, "lines", cut(data, [1, 5, 999, 3])))
        assert await reader.readline() == lines[0]
        assert await reader.readline(4) == lines[1][:4]  # at most size bytes
        assert await reader.readline() == lines[1][4:]
        got = [line async for line in reader]
        assert got == lines[2:]  # the last line has no newline
        assert await reader.readline() == b""
        await writing


async def test_async_writer_and_sync_reader_share_a_pipe(broker):
    """Same wire, same pipes: the sync client reads what the async client wrote."""
    ready = threading.Event()

    def read_sync() -> bytes:
        with zpipes.open("mix", "r", broker=broker.name, timeout=LIMIT) as reader:
            ready.set()
            return reader.read()

    reading = asyncio.create_task(asyncio.to_thread(read_sync))
    # the reader must be attached before the stream starts (a late reader gets none of it)
    assert await asyncio.to_thread(ready.wait, 10)
    await write_all(broker.name, "mix", [b"from ", b"asyncio"])
    assert await asyncio.wait_for(reading, LIMIT) == b"from asyncio"


# --- end, timeout and failure ----------------------------------------------------------------


async def test_end_timeout_and_failure_are_distinct(start_broker):
    b = start_broker()
    reader = await aio.open("amb", "r", broker=b.name, timeout=0.3)
    waiter = await aio.open("amb2", "r", broker=b.name)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError) as timeout:
            await reader.read(1)
        assert 0.25 <= time.monotonic() - start < 2.0
        assert isinstance(timeout.value, PipeTimeout) and isinstance(timeout.value, ZpipesError)

        await write_all(b.name, "amb", [b"data"])
        assert await reader.read(100) == b"data"  # short: the stream ended
        assert await reader.read(100) == b""  # end: not an exception

        # a failure: a reader that waits (for a writer) when the broker stops
        failing = asyncio.create_task(waiter.read(1))
        await asyncio.sleep(0.3)  # a window: the read waits
        assert not failing.done()
        assert await asyncio.to_thread(b.stop) == 0
        with pytest.raises(ZpipesError) as failure:
            await asyncio.wait_for(failing, 10)
        assert not isinstance(failure.value, TimeoutError)
        assert isinstance(failure.value, PipeFailed)
        assert failure.value.reason == "broker stopping", repr(failure.value)
    finally:
        reader.abort()
        waiter.abort()


async def test_a_timeout_or_a_cancel_loses_nothing_and_a_later_read_picks_up(broker):
    async with await aio.open("keep", "r", broker=broker.name, timeout=0.3) as reader:
        writer = await aio.open("keep", "w", broker=broker.name, timeout=10)
        await writer.write(b"12345")
        await writer.flush()
        with pytest.raises(PipeTimeout):
            await reader.read(10)  # five bytes are not ten
        with pytest.raises(PipeTimeout):
            await reader.readline()  # no newline yet
        reader.timeout = None
        pending = asyncio.create_task(reader.read(10))
        await wait_for_async(  # the read has begun and waits
            lambda: inspect.getcoroutinestate(pending.get_coro()) == inspect.CORO_SUSPENDED,
            5, "the read to wait")
        pending.cancel()  # the program's own cancellation
        with pytest.raises(asyncio.CancelledError):
            await pending
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):  # the program's own timeout
                await reader.readline()
        await writer.write(b"67890\nmore")
        await writer.close()
        reader.timeout = 10
        assert await reader.readline() == b"1234567890\n"
        assert await reader.read() == b"more"


async def test_writer_gets_broken_pipe_when_its_reader_closes(broker):
    reader = await aio.open("bp", "r", broker=broker.name, timeout=10)
    writer = await aio.open("bp", "w", broker=broker.name, timeout=10)
    try:
        await writer.write(b"seen")
        assert await reader.read(4) == b"seen"
        await reader.close()
        with pytest.raises(BrokenPipe) as info:
            async with asyncio.timeout(10):
                while True:
                    await writer.write(b"x" * 1000)
                    await writer.flush()
        assert isinstance(info.value, BrokenPipeError)
        assert info.value.reason == "no readers"
        with pytest.raises(BrokenPipeError):
            await writer.write(b"again")  # the error sticks
    finally:
        writer.abort()


# --- ending a stream: close ends it, abort cuts it -------------------------------------------

CUT_WAIT = 15.0  # seconds a reader waits for the failure (the broker tells within about one)


async def read_until_failure(reader: Any) -> tuple[bytes, ZpipesError]:
    """Everything the reader gets, up to the failure that must follow it (never an end)."""
    got = bytearray()
    while True:
        try:
            piece = await reader.read1(MiB)
        except ZpipesError as exc:
            return bytes(got), exc
        assert piece, f"end of stream after {len(got)} bytes: a cut stream looked whole"
        got += piece


async def test_abort_cuts_the_stream_the_reader_fails_after_the_flushed_data(broker):
    data = random.Random(5).randbytes(300_000)
    async with await aio.open("cut", "r", broker=broker.name, timeout=CUT_WAIT) as reader:
        writer = await aio.open("cut", "w", broker=broker.name, timeout=CUT_WAIT)
        for piece in cut(data, [100_000, 1, 65_536]):
            await writer.write(piece)
        await writer.flush()  # the broker took all of it
        writer.abort()
        assert writer.closed
        got, error = await read_until_failure(reader)
    assert got == data
    assert_writer_lost(error)


async def test_async_with_left_by_an_exception_cuts_the_stream(broker):
    async with await aio.open("exc", "r", broker=broker.name, timeout=CUT_WAIT) as reader:
        with pytest.raises(RuntimeError, match="producer failed"):
            async with await aio.open("exc", "w", broker=broker.name,
                                      timeout=CUT_WAIT) as writer:
                await writer.write(b"first part\n")
                await writer.flush()
                raise RuntimeError("producer failed")
        assert writer.closed
        got, error = await read_until_failure(reader)
    assert got == b"first part\n"
    assert_writer_lost(error)


async def test_a_cancelled_async_with_block_cuts_the_stream(broker):
    flushed = asyncio.Event()

    async def produce() -> None:
        async with await aio.open("cancel", "w", broker=broker.name,
                                  timeout=CUT_WAIT) as writer:
            await writer.write(b"first part\n")
            await writer.flush()
            flushed.set()
            await asyncio.sleep(3600)  # cancelled here

    async with await aio.open("cancel", "r", broker=broker.name, timeout=CUT_WAIT) as reader:
        producing = asyncio.create_task(produce())
        async with asyncio.timeout(LIMIT):
            await flushed.wait()
        producing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await producing
        got, error = await read_until_failure(reader)
    assert got == b"first part\n"
    assert_writer_lost(error)


async def test_close_ends_the_stream_the_reader_gets_everything_then_the_end(broker):
    data = random.Random(6).randbytes(300_000)
    async with await aio.open("whole", "r", broker=broker.name, timeout=CUT_WAIT) as reader:
        await write_all(broker.name, "whole", cut(data, [100_000, 1, 65_536]))
        assert await reader.read() == data
        assert await reader.read() == b""


# --- the broker stops or dies ----------------------------------------------------------------


async def test_broker_stopped_fails_blocked_and_idle_ends_with_broker_stopping(start_broker):
    b = start_broker()
    ends = [await aio.open(f"s{i}", mode, broker=b.name, broker_timeout=1.5)
            for i, mode in enumerate("rwrw")]
    blocked_reader, blocked_writer, idle_reader, idle_writer = ends
    try:
        for writer in (blocked_writer, idle_writer):
            await writer.write(b"nobody reads this")  # no reader: the WRITE waits
        blocked = [asyncio.create_task(blocked_reader.read(1)),
                   asyncio.create_task(blocked_writer.flush())]
        await asyncio.sleep(0.3)  # a window: both wait
        assert not any(call.done() for call in blocked)
        stopped_at = time.monotonic()
        assert await asyncio.to_thread(b.stop) == 0
        await wait_for_async(  # the idle ends have seen their connection drop
            lambda: all(end._channel.dead for end in (idle_reader, idle_writer)), 5,
            "the idle ends to see the connection drop")
        idle = [asyncio.create_task(idle_reader.read(1)),
                asyncio.create_task(idle_writer.flush())]
        outcomes = await asyncio.wait_for(
            asyncio.gather(*blocked, *idle, return_exceptions=True), 10)
        assert time.monotonic() - stopped_at < 3.0
        for outcome in outcomes:
            # a failure with the broker's reason: never an end of stream or a timeout
            assert isinstance(outcome, PipeFailed), outcome
            assert not isinstance(outcome, TimeoutError)
            assert outcome.reason == "broker stopping", repr(outcome)
        start = time.monotonic()
        await idle_reader.close()  # the broker dropped the end: nothing to wait for
        with pytest.raises(PipeFailed):
            await idle_writer.close()  # the flush failed: close says so
        assert time.monotonic() - start < 1.0
    finally:
        for end in ends:
            end.abort()


async def test_broker_killed_gives_broker_unavailable_in_bounded_time(start_broker):
    b = start_broker()
    reader = await aio.open("kill", "r", broker=b.name)
    writer = await aio.open("kill2", "w", broker=b.name)
    try:
        await writer.write(b"nobody reads this")
        calls = [asyncio.create_task(reader.read(1)), asyncio.create_task(writer.flush())]
        await asyncio.sleep(0.3)  # a window: both wait
        assert not any(call.done() for call in calls)
        killed_at = time.monotonic()
        b.kill()
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        assert time.monotonic() - killed_at < 2.0  # the connection drops with the process
        for outcome in outcomes:
            assert isinstance(outcome, BrokerUnavailable), outcome
            assert "lost the connection" in str(outcome), outcome
        start = time.monotonic()
        await reader.close()
        writer.abort()
        assert time.monotonic() - start < 1.0
    finally:
        reader.abort()
        writer.abort()


async def test_broker_restarted_under_the_same_name_is_not_taken_for_the_old_one(start_broker):
    """The socket reconnects (so that no reply is lost when a connection drops), but an end
    never uses a second connection: a restarted broker does not know the end."""
    b = start_broker()
    reader = await aio.open("again", "r", broker=b.name, timeout=10)
    writer = await aio.open("again2", "w", broker=b.name, timeout=10)
    try:
        b.kill()
        b2 = start_broker(name=b.name)  # listening again before the ends do anything
        await asyncio.sleep(0.5)  # a window in which a reconnecting socket would reconnect:
        assert await asyncio.to_thread(zpipes_connections, b2) == 0  # the ends make no other
        for call in (reader.read(1), writer.write(b"x" * 10)):
            start = time.monotonic()
            with pytest.raises(BrokerUnavailable, match="lost the connection"):
                await call
            assert time.monotonic() - start < 1.0
        await reader.close()
        writer.abort()
        async with await aio.open("again", "r", broker=b2.name, timeout=10) as fresh:
            await write_all(b2.name, "again", [b"new broker"])
            assert await fresh.read() == b"new broker"
    finally:
        reader.abort()
        writer.abort()


async def test_hung_broker_is_reported_not_responding_after_broker_timeout(start_broker):
    """A broker that hangs (SIGSTOP) keeps the connection open: broker_timeout tells."""
    b = start_broker()
    reader = await aio.open("hung", "r", broker=b.name, broker_timeout=1)
    try:
        b.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="not responding"):
            await reader.read(1)
        assert 0.9 < time.monotonic() - start < 3.0
        start = time.monotonic()
        await reader.close()
        assert time.monotonic() - start < 1.0
    finally:
        b.send_signal(signal.SIGCONT)
        reader.abort()


async def test_no_broker_running_and_bad_arguments(tmp_path, broker):
    absent = f"absent-{os.getpid()}-{time.monotonic_ns()}"
    for mode in ("r", "w"):
        start = time.monotonic()
        with pytest.raises(BrokerUnavailable):
            await aio.open("x", mode, broker=absent, timeout=10)
        assert time.monotonic() - start < 2.0
    for name in ("", "x" * 256, b"\xc3\x28"):
        with pytest.raises(ValueError):
            await aio.open(name, "r", broker=broker.name)
    with pytest.raises(ValueError):
        await aio.open("x", "rt", broker=broker.name)
    with pytest.raises(TypeError):
        await aio.open("x", "r", broker=broker.name, window=4)


# --- many pipes, bounded buffers -------------------------------------------------------------


async def test_twenty_pipes_at_once_in_one_event_loop(broker):
    pairs = 20

    async def pair(i: int) -> tuple[str, str]:
        data = random.Random(i).randbytes(256 * 1024 + i * 1013)
        name = f"many-{i}"
        async with await aio.open(name, "r", broker=broker.name, timeout=LIMIT,
                                  read_size=64 * 1024) as reader:
            writing = asyncio.create_task(
                write_all(broker.name, name, cut(data, [4096, 65536 + i, 100]), chunk_size=32768))
            got = await reader.read()
            assert await reader.read() == b""
            await writing
        return hashlib.sha256(got).hexdigest(), hashlib.sha256(data).hexdigest()

    async with asyncio.timeout(LIMIT):
        results = await asyncio.gather(*(pair(i) for i in range(pairs)))
    assert len(results) == pairs
    for got, want in results:
        assert got == want


async def test_a_reader_that_does_not_read_buffers_a_bounded_amount(broker):
    read_size, read_ahead = 64 * 1024, 2
    async with await aio.open("bound", "r", broker=broker.name, timeout=LIMIT,
                              read_size=read_size, read_ahead=read_ahead) as reader:
        data = random.Random(3).randbytes(8 * MiB)
        writing = asyncio.create_task(write_all(broker.name, "bound", [data]))
        assert await reader.read(1) == data[:1]
        await asyncio.sleep(0.5)  # the program is busy; the pump takes what comes
        proto = reader._proto
        assert proto.ready <= proto.buffer_limit + read_ahead * read_size
        assert not writing.done()  # backpressure: the writer waits
        rest = await reader.read()
        assert data[:1] + rest == data
        await writing


# --- heartbeats ------------------------------------------------------------------------------


async def test_idle_ends_survive_a_short_client_timeout_by_heartbeats(start_broker):
    b = start_broker(config={"clients": {"timeout": 2}})
    blocked = await aio.open("hb", "r", broker=b.name, timeout=5)
    writer = await aio.open("hb", "w", broker=b.name, timeout=10)  # open, unused for 5 s
    idle = await aio.open("hb2", "r", broker=b.name, timeout=10)  # open, no call for 5 s
    try:
        start = time.monotonic()
        with pytest.raises(PipeTimeout):
            await blocked.read(1)  # no data for 5 s: the pump pings meanwhile
        assert time.monotonic() - start >= 4.9
        await writer.write(b"still alive")
        await writer.close()
        assert await blocked.read() == b"still alive"
        await write_all(b.name, "hb2", [b"me too"])
        assert await idle.read() == b"me too"
    finally:
        for end in (blocked, writer, idle):
            end.abort()
