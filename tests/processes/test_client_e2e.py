"""The client library (``zpipes.open``) against a real broker process over real ipc sockets.

Stream semantics whatever the buffer sizes, lines, the distinct outcomes (end ``b""``, timeout
``TimeoutError``, failure a ``zpipes`` error with the broker's reason), a broker that stops or
dies, N-to-N pipes and heartbeats. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import (
    assert_writer_lost,
    broker_env,
    cut,
    read_within,
    wait_for,
    zpipes_connections,
)
from wire import (
    INPUT_OK,
    INVALID,
    READ_OK,
    RawClient,
    input_,
    read,
)

import zpipes
from zpipes import BrokenPipe, BrokerUnavailable, PipeTimeout, ZpipesError

MiB = 1 << 20
JOIN = 30.0  # seconds: the longest any background call of these tests may take


class Background:
    """A call in a thread, with its outcome (a result or an exception) collected."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.ended_at: float | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self.result = fn(*args)
        except BaseException as exc:  # reported by outcome()
            self.error = exc
        finally:
            self.ended_at = time.monotonic()

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float = JOIN) -> Background:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"background call still running after {timeout}s"
        return self

    def outcome(self, timeout: float = JOIN) -> Any:
        """The result; re-raises the call's exception."""
        self.join(timeout)
        if self.error is not None:
            raise self.error
        return self.result


def write_all(broker: str, name: str, chunks: list[bytes], **opts: Any) -> int:
    """Open a writer, write each chunk with one ``write`` call, close; the bytes written."""
    with zpipes.open(name, "w", broker=broker, timeout=JOIN, **opts) as writer:
        for chunk in chunks:
            writer.write(chunk)
    return sum(map(len, chunks))


# --- stream semantics ------------------------------------------------------------------------


def test_read_n_returns_exactly_n_bytes_however_the_writer_cut_the_data(broker):
    data = os.urandom(100_000)
    with zpipes.open("exact", "r", broker=broker.name, timeout=10) as reader:
        writer = Background(write_all, broker.name, "exact", cut(data, [1, 7, 4096, 3, 65536]))
        got = []
        for size in [1, 10, 4095, 33333] * 100:
            piece = reader.read(size)
            got.append(piece)
            if len(piece) < size:
                break  # short only at the end of the stream
            assert len(piece) == size
        assert writer.outcome() == len(data)
        assert b"".join(got) == data
        assert reader.read(10) == b""


def test_read_without_size_reads_to_end_of_stream_then_returns_empty(broker):
    data = os.urandom(3 * MiB + 5)
    with zpipes.open("all", "r", broker=broker.name, timeout=10) as reader:
        writer = Background(write_all, broker.name, "all", cut(data, [MiB]))
        assert reader.read() == data
        assert writer.outcome() == len(data)
        assert reader.read() == b""
        assert reader.read(1) == b""  # end of stream is sticky while no writer is attached


def test_read1_returns_what_has_arrived_and_never_drops_the_rest(broker):
    data = os.urandom(200_000)
    with zpipes.open("r1", "r", broker=broker.name, timeout=10) as reader:
        writer = Background(write_all, broker.name, "r1", cut(data, [50_000, 3, 70_001]))
        got = bytearray()
        while piece := reader.read1(1000):
            assert 1 <= len(piece) <= 1000
            got += piece
        assert writer.outcome() == len(data)
        assert bytes(got) == data


def test_seed_client_potentially_loses_data_readinto_with_a_7_byte_buffer(broker):
    """Seed bug "client potentially loses data": a buffer smaller than the pending chunk lost
    the rest of the chunk. 1 MiB chunks read through a 7-byte buffer arrive complete."""
    data = os.urandom(3 * MiB)
    with zpipes.open("seven", "r", broker=broker.name, timeout=10) as reader:
        writer = Background(write_all, broker.name, "seven", cut(data, [MiB]))
        buf = bytearray(7)
        view = memoryview(buf)
        got = bytearray()
        while n := reader.readinto(buf):
            got += view[:n]
            if n < 7:
                assert len(got) == len(data)  # short only at the end of the stream
        assert writer.outcome() == len(data)
        assert len(got) == len(data)
        assert bytes(got) == data


def test_seed_client_api_uses_chunks_not_a_stream_small_reads_of_big_chunks(broker):
    """Seed bug "client API uses chunks, not a stream": read(7), read1(7) and readinto1 with
    a 7-byte buffer, mixed, over 1 MiB chunks, give back the stream byte for byte."""
    data = os.urandom(2 * MiB)
    with zpipes.open("mixed", "r", broker=broker.name, timeout=10) as reader:
        writer = Background(write_all, broker.name, "mixed", cut(data, [MiB]))
        got = bytearray()
        buf = bytearray(7)
        step = 0
        while True:
            step += 1
            if step % 3 == 0:
                n = reader.readinto1(buf)
                piece = bytes(buf[:n])
            elif step % 3 == 1:
                piece = reader.read(7)
            else:
                piece = reader.read1(7)
            if not piece:
                break
            got += piece
            if len(got) >= 64 * 1024:  # the rest in bigger bites, to keep the test quick
                rest = reader.read()
                got += rest
                break
        assert writer.outcome() == len(data)
        assert bytes(got) == data


def test_readline_and_iteration_over_lines_cut_anywhere(broker):
    lines = [f"line {i}: {'x' * (i % 97)}\n".encode() for i in range(2000)] + [b"last, no newline"]
    data = b"".join(lines)
    with zpipes.open("lines", "r", broker=broker.name, timeout=10) as reader:
        writer = Background(write_all, broker.name, "lines", cut(data, [1, 13, 4096, 100]))
        assert reader.readline() == lines[0]
        assert reader.readline(3) == lines[1][:3]
        assert reader.readline() == lines[1][3:]
        assert list(reader) == lines[2:]
        assert writer.outcome() == len(data)
        assert reader.readline() == b""


def test_text_mode_iterates_over_decoded_lines(broker):
    text = ["héllo wörld\n", "ünïcode split across chunks ✓\n", "€" * 1000 + "\n", "end"]
    raw = "".join(text).encode("utf-8")
    with zpipes.open("text", "rt", broker=broker.name, timeout=10) as reader:
        # cut inside multi-byte characters on purpose
        writer = Background(write_all, broker.name, "text", cut(raw, [1, 2, 5, 3]))
        assert list(reader) == text
        assert writer.outcome() == len(raw)


def test_text_mode_writer_and_reader(broker):
    with zpipes.open("t2", "rt", broker=broker.name, timeout=10) as reader:
        with zpipes.open("t2", "wt", broker=broker.name, timeout=10) as writer:
            writer.write("first ✓\n")
            writer.write("second\n")
        assert reader.readline() == "first ✓\n"
        assert reader.read() == "second\n"


# --- end, timeout and failure ----------------------------------------------------------------


def test_seed_zpipes_client_read_returns_ambiguous_results_end_timeout_failure(start_broker):
    """Seed bug "zpipes_client_read returns ambiguous results": end of stream, a timeout and a
    failure must never look alike: b"" vs TimeoutError vs a zpipes error with the reason."""
    b = start_broker()
    reader = zpipes.open("amb", "r", broker=b.name, timeout=0.3)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError) as timeout:
            reader.read(1)
        assert 0.25 <= time.monotonic() - start < 2.0
        assert isinstance(timeout.value, PipeTimeout) and isinstance(timeout.value, ZpipesError)

        write_all(b.name, "amb", [b"data"])
        assert reader.read(100) == b"data"  # short: the stream ended
        assert reader.read(100) == b""  # end: not an exception

        # a failure: a reader that waits (for a writer, on another pipe) when the broker stops
        waiter = zpipes.open("amb2", "r", broker=b.name)
        failing = Background(waiter.read, 1)
        time.sleep(0.3)  # a window: the read waits
        assert failing.running()
        assert b.stop() == 0
        failing.join(10)
        assert isinstance(failing.error, ZpipesError), failing.error  # not b"", not a result
        assert not isinstance(failing.error, TimeoutError)
        assert failing.error.reason == "broker stopping", repr(failing.error)
    finally:
        reader.abort()
        if "waiter" in locals():
            waiter.abort()


@pytest.mark.parametrize("attempt", range(6))
def test_an_end_of_stream_once_consumed_is_not_seen_again_by_a_new_writers_reader(
        broker, attempt):
    """READs that were still outstanding when the reader consumed an end of stream get more
    READ_ENDs for that same end (the broker keeps answering READ_END while no writer is
    attached); they once made a second b"" for a read started after a new writer attached.
    The race went wrong about every other time: six attempts."""
    with zpipes.open("eos", "r", broker=broker.name, timeout=10) as reader:
        first = Background(write_all, broker.name, "eos", [b"one"])
        assert reader.read() == b"one"  # blocked while the data and the end arrive
        assert reader.read() == b""
        first.outcome()
        # the late READ_ENDs of the READs still outstanding arrive (the heartbeat thread
        # takes them in)
        wait_for(lambda: len(reader._channel._inbox) >= reader._proto.outstanding, 5,
                 "the late READ_ENDs")
        with zpipes.open("eos", "w", broker=broker.name, timeout=10) as writer:
            reader.timeout = 0.5
            with pytest.raises(TimeoutError):
                reader.read(1)  # the new writer has written nothing yet: no second end
            writer.write(b"two")
        reader.timeout = 10
        assert reader.read() == b"two"  # the new writer's stream, and its own end
        assert reader.read() == b""


def test_a_timeout_loses_nothing_and_a_later_read_picks_up(broker):
    with zpipes.open("keep", "r", broker=broker.name, timeout=0.3) as reader:
        writer = zpipes.open("keep", "w", broker=broker.name, timeout=10)
        writer.write(b"12345")
        writer.flush()
        with pytest.raises(TimeoutError):
            reader.read(10)  # five bytes are not ten
        with pytest.raises(TimeoutError):
            reader.readline()  # no newline yet
        writer.write(b"67890\n")
        writer.close()
        assert reader.read(10) == b"1234567890"
        assert reader.readline() == b"\n"
        assert reader.read() == b""


def test_reader_that_opened_first_waits_for_a_writer(broker):
    with zpipes.open("first", "r", broker=broker.name) as reader:
        waiting = Background(reader.read, 5)
        time.sleep(0.5)
        assert waiting.running(), "the reader saw end of stream before any writer came"
        write_all(broker.name, "first", [b"hello world"])
        assert waiting.outcome(10) == b"hello"
        assert reader.read() == b" world"


def test_seed_zpipe_reads_block_on_closed_writer(broker):
    """Seed bug "zpipe reads block on closed writer": a big read blocked on a pipe whose
    writer closes returns the data it has, then b"" (end), at once."""
    with zpipes.open("blk", "r", broker=broker.name) as reader:
        writer = zpipes.open("blk", "w", broker=broker.name, timeout=10)
        writer.write(b"small")
        writer.flush()
        blocked = Background(reader.read, MiB)
        time.sleep(0.3)
        assert blocked.running()  # read(n) waits for n bytes or the end
        closed_at = time.monotonic()
        writer.close()
        assert blocked.outcome(10) == b"small"
        assert blocked.ended_at - closed_at < 2.0
        assert reader.read(MiB) == b""


def test_writer_gets_broken_pipe_when_its_reader_closes(broker):
    reader = zpipes.open("bp", "r", broker=broker.name, timeout=10)
    writer = zpipes.open("bp", "w", broker=broker.name, timeout=10)
    try:
        writer.write(b"seen")
        assert reader.read(4) == b"seen"
        reader.close()
        deadline = time.monotonic() + 10
        with pytest.raises(BrokenPipe) as info:
            while time.monotonic() < deadline:
                writer.write(b"x" * 1000)
                writer.flush()
        assert isinstance(info.value, BrokenPipeError)
        assert info.value.reason == "no readers"
        with pytest.raises(BrokenPipeError):
            writer.write(b"again")  # the error sticks
    finally:
        writer.abort()


def test_writer_gets_broken_pipe_when_a_reader_process_is_killed(broker, tmp_path):
    env = broker_env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "zpipes", "read", "--broker", broker.name,
                             "dead"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    writer = zpipes.open("dead", "w", broker=broker.name, timeout=10)
    try:
        writer.write(b"ping\n")
        assert read_within(proc.stdout.fileno(), 5, 10) == b"ping\n"
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 15
        with pytest.raises(BrokenPipeError) as info:
            while time.monotonic() < deadline:
                writer.write(b"x" * 1000)
                writer.flush()
                time.sleep(0.01)
        assert info.value.reason == "no readers"
    finally:
        writer.abort()
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()


# --- ending a stream: close ends it, abort cuts it -------------------------------------------

CUT_WAIT = 15.0  # seconds a reader waits for the failure (the broker tells within about one)


def read_until_failure(reader: Any) -> tuple[bytes, ZpipesError]:
    """Everything the reader gets, up to the failure that must follow it (never an end)."""
    got = bytearray()
    while True:
        try:
            piece = reader.read1(MiB)
        except ZpipesError as exc:
            return bytes(got), exc
        assert piece, f"end of stream after {len(got)} bytes: a cut stream looked whole"
        got += piece


def test_abort_cuts_the_stream_the_reader_fails_after_the_flushed_data(broker):
    data = os.urandom(300_000)
    with zpipes.open("cut", "r", broker=broker.name, timeout=CUT_WAIT) as reader:
        writer = zpipes.open("cut", "w", broker=broker.name, timeout=CUT_WAIT)
        for piece in cut(data, [100_000, 1, 65_536]):
            writer.write(piece)
        writer.flush()  # the broker took all of it
        writer.abort()
        got, error = read_until_failure(reader)
    assert got == data
    assert_writer_lost(error)


def test_close_ends_the_stream_the_reader_gets_everything_then_the_end(broker):
    data = os.urandom(300_000)
    with zpipes.open("whole", "r", broker=broker.name, timeout=CUT_WAIT) as reader:
        with zpipes.open("whole", "w", broker=broker.name, timeout=CUT_WAIT) as writer:
            for piece in cut(data, [100_000, 1, 65_536]):
                writer.write(piece)
        assert reader.read() == data
        assert reader.read() == b""


@pytest.mark.parametrize("mode", ["w", "wt"])
def test_with_block_left_by_an_exception_cuts_the_stream(broker, mode):
    text = "first lines ✓\n" * 1000
    with zpipes.open("exc", "r", broker=broker.name, timeout=CUT_WAIT) as reader:
        with pytest.raises(RuntimeError, match="producer failed"):
            with zpipes.open("exc", mode, broker=broker.name, timeout=CUT_WAIT) as writer:
                writer.write(text if mode == "wt" else text.encode())
                writer.flush()
                writer.write("never flushed" if mode == "wt" else b"")
                raise RuntimeError("producer failed")
        assert writer.closed
        got, error = read_until_failure(reader)
    assert got == text.encode()
    assert_writer_lost(error)


WRITER_SCRIPT = """
import sys
import zpipes
name, mode, broker, how = sys.argv[1:]
writer = zpipes.open(name, mode, broker=broker)  # never closed by the program
writer.write("text, not flushed\\n" if mode == "wt" else b"bytes, not flushed\\n")
if how == "raise":
    writer.flush()
    raise RuntimeError("producer failed")
if how == "exit":
    sys.exit(3)
"""


@pytest.mark.parametrize("mode", ["w", "wt"])
@pytest.mark.parametrize("how, status", [("return", 0), ("exit", 3), ("raise", 1)])
def test_ends_left_open_at_exit_are_closed_unless_an_uncaught_exception_ends_the_program(
        broker, tmp_path, mode, how, status):
    expected = b"text, not flushed\n" if mode == "wt" else b"bytes, not flushed\n"
    with zpipes.open("exit", "r", broker=broker.name, timeout=CUT_WAIT) as reader:
        done = subprocess.run([sys.executable, "-c", WRITER_SCRIPT, "exit", mode, broker.name,
                               how], env=broker_env(tmp_path), capture_output=True,
                              timeout=JOIN)
        assert done.returncode == status, done.stderr
        if how == "raise":
            got, error = read_until_failure(reader)
            assert got == expected
            assert_writer_lost(error)
        else:
            assert reader.read() == expected  # the text layer's text too
            assert reader.read() == b""


# --- the broker stops or dies ----------------------------------------------------------------


def test_broker_stopped_while_ends_wait_fails_them_with_a_zpipes_error(start_broker):
    b = start_broker()
    reader = zpipes.open("stop", "r", broker=b.name, broker_timeout=1)
    writer = zpipes.open("stop2", "w", broker=b.name, broker_timeout=1)
    try:
        waiting = Background(reader.read, 1)
        writer.write(b"nobody reads this")  # no reader: the WRITE waits
        flushing = Background(writer.flush)
        time.sleep(0.3)  # a window: both wait
        assert waiting.running() and flushing.running()
        stopped_at = time.monotonic()
        assert b.stop() == 0
        for call in (waiting, flushing):
            call.join(10)
            # a failure with the broker's reason, never an end of stream or a timeout
            assert isinstance(call.error, ZpipesError), call.error
            assert not isinstance(call.error, TimeoutError)
            assert call.error.reason == "broker stopping", repr(call.error)
            assert call.ended_at - stopped_at < 2.0
    finally:
        reader.abort()
        writer.abort()


def test_broker_stopped_fails_every_end_with_broker_stopping(start_broker):
    """The broker's last replies (*_FAILED "broker stopping") reach every end, blocked in a
    call or idle: they arrived before the connection dropped, and win over the lost
    connection. (The client once disabled reconnecting, and ZeroMQ then dropped unread
    replies when the connection closed: the calls said "not responding" after 5 s.)"""
    b = start_broker()
    ends = [zpipes.open(f"s{i}", mode, broker=b.name, broker_timeout=1.5)
            for i, mode in enumerate("rwrw")]
    blocked_reader, blocked_writer, idle_reader, idle_writer = ends
    try:
        for writer in (blocked_writer, idle_writer):
            writer.write(b"nobody reads this")  # no reader: the WRITE waits in the broker
        blocked = [Background(blocked_reader.read, 1), Background(blocked_writer.flush)]
        time.sleep(0.3)  # a window: both wait
        assert all(call.running() for call in blocked)
        assert b.stop() == 0
        wait_for(lambda: all(end._channel.dead for end in (idle_reader, idle_writer)), 5,
                 "the idle ends to see the connection drop")
        idle = [Background(idle_reader.read, 1), Background(idle_writer.flush)]
        reasons = []
        for call in blocked + idle:
            call.join(10)
            reasons.append(getattr(call.error, "reason", repr(call.error)))
        assert reasons == ["broker stopping"] * 4
    finally:
        for end in ends:
            end.abort()


def test_closing_an_end_after_broker_stopping_does_not_wait_for_the_gone_broker(start_broker):
    """After "broker stopping" the broker has dropped the end: close() sends no CLOSE (it once
    waited broker_timeout for the gone broker to take it)."""
    b = start_broker()
    reader = zpipes.open("gone", "r", broker=b.name)
    try:
        waiting = Background(reader.read, 1)
        time.sleep(0.3)  # a window: the read waits
        assert waiting.running()
        assert b.stop() == 0
        waiting.join(10)
        assert getattr(waiting.error, "reason", None) == "broker stopping", waiting.error
        start = time.monotonic()
        reader.close()
        assert time.monotonic() - start < 1.0
    finally:
        reader.abort()


def test_broker_killed_while_ends_wait_gives_broker_unavailable_in_bounded_time(start_broker):
    b = start_broker()
    reader = zpipes.open("kill", "r", broker=b.name)
    writer = zpipes.open("kill2", "w", broker=b.name)
    try:
        waiting = Background(reader.read, 1)
        writer.write(b"nobody reads this")
        flushing = Background(writer.flush)
        time.sleep(0.3)  # a window: both wait
        assert waiting.running() and flushing.running()
        killed_at = time.monotonic()
        b.kill()
        waiting.join(10)
        flushing.join(10)
        for call in (waiting, flushing):
            # the connection drops with the process: no need to wait for broker_timeout
            assert isinstance(call.error, BrokerUnavailable), call.error
            assert "lost the connection" in str(call.error), call.error
            assert call.ended_at - killed_at < 2.0
        start = time.monotonic()
        reader.close()
        writer.abort()
        assert time.monotonic() - start < 2.0  # nothing waits for a dead broker again
    finally:
        reader.abort()
        writer.abort()


def test_broker_restarted_under_the_same_name_is_not_taken_for_the_old_one(start_broker):
    """The client reconnects its socket (so that no reply is lost when a connection drops),
    but an end never uses a second connection: a restarted broker does not know the end, and
    would leave its requests unanswered (while answering PINGs). Idle ends learn that the
    connection was lost at their next call, at once."""
    b = start_broker()
    reader = zpipes.open("again", "r", broker=b.name, timeout=10)
    writer = zpipes.open("again2", "w", broker=b.name, timeout=10)
    try:
        b.kill()
        b2 = start_broker(name=b.name)  # listening again before the ends do anything
        time.sleep(0.5)  # a window in which a reconnecting socket would reconnect:
        assert zpipes_connections(b2) == 0  # the ends make no second connection
        for call in (lambda: reader.read(1), lambda: writer.write(b"x" * 10)):
            start = time.monotonic()
            with pytest.raises(BrokerUnavailable, match="lost the connection"):
                call()
            assert time.monotonic() - start < 1.0
        start = time.monotonic()
        reader.close()
        writer.abort()
        assert time.monotonic() - start < 1.0
        # the new broker works, and saw nothing of the old ends
        with zpipes.open("again", "r", broker=b2.name, timeout=10) as fresh:
            write_all(b2.name, "again", [b"new broker"])
            assert fresh.read() == b"new broker"
        assert "pipe=again2 " not in b2.stderr()
    finally:
        reader.abort()
        writer.abort()


def test_hung_broker_is_reported_not_responding_after_broker_timeout(start_broker):
    """A broker that hangs (SIGSTOP) keeps the connection open: broker_timeout tells."""
    b = start_broker()
    reader = zpipes.open("hung", "r", broker=b.name, broker_timeout=1)
    try:
        b.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="not responding"):
            reader.read(1)
        assert 0.9 < time.monotonic() - start < 3.0
        start = time.monotonic()
        reader.close()
        assert time.monotonic() - start < 1.0
    finally:
        b.send_signal(signal.SIGCONT)
        reader.abort()


def test_no_broker_running_gives_broker_unavailable_at_once(tmp_path):
    absent = f"absent-{os.getpid()}-{time.monotonic_ns()}"
    for mode in ("r", "w"):
        start = time.monotonic()
        with pytest.raises(BrokerUnavailable):
            zpipes.open("p", mode, broker=absent)
        assert time.monotonic() - start < 1.0


# --- N-to-N ----------------------------------------------------------------------------------


def test_fan_out_two_readers_each_get_every_byte(broker):
    data = os.urandom(4 * MiB + 123)
    readers = [zpipes.open("fan", "r", broker=broker.name, timeout=20) for _ in range(2)]
    try:
        reads = [Background(r.read) for r in readers]
        writer = Background(write_all, broker.name, "fan", cut(data, [MiB, 1000, 77777]))
        assert writer.outcome() == len(data)
        for r in reads:
            assert r.outcome() == data
    finally:
        for r in readers:
            r.close()


def test_two_writers_chunks_are_never_interleaved_and_each_keeps_its_order(broker):
    size, count = 1000, 300

    def record(tag: bytes, seq: int) -> bytes:
        head = tag + b"%06d" % seq
        return head + tag * (size - len(head))

    with zpipes.open("nn", "r", broker=broker.name, timeout=20) as reader:
        writers = [zpipes.open("nn", "w", broker=broker.name, timeout=20) for _ in range(2)]
        everything = Background(reader.read)

        def produce(writer: Any, tag: bytes) -> None:
            with writer:
                for seq in range(count):
                    writer.write(record(tag, seq))  # one write of < chunk_size: one chunk

        tags = (b"A", b"B")
        producers = [Background(produce, w, t) for w, t in zip(writers, tags, strict=True)]
        for producer in producers:
            producer.outcome()
        data = everything.outcome()
    assert len(data) == 2 * size * count
    seqs: dict[bytes, list[int]] = {b"A": [], b"B": []}
    for pos in range(0, len(data), size):
        rec = data[pos : pos + size]
        tag = rec[:1]
        assert rec == record(tag, int(rec[1:7])), f"record at {pos} is mixed: {rec[:40]!r}"
        seqs[tag].append(int(rec[1:7]))
    assert seqs == {b"A": list(range(count)), b"B": list(range(count))}


# --- heartbeats ------------------------------------------------------------------------------


def test_idle_library_ends_are_not_expired_but_a_silent_raw_client_is(start_broker, ctx):
    b = start_broker(config={"clients": {"timeout": 2}})
    silent = RawClient(ctx, b.endpoint, timeout_ms=1000)
    held = RawClient(ctx, b.endpoint, timeout_ms=5000)
    reader = zpipes.open("hb", "r", broker=b.name, timeout=6)
    writer = zpipes.open("hb", "w", broker=b.name, timeout=10)  # open, unused for 6 s
    idle = zpipes.open("hb2", "r", broker=b.name, timeout=10)  # open, no call for 6 s
    try:
        assert silent.call(input_(b"quiet")) == (INPUT_OK, None)  # then silence, nothing held
        assert held.call(input_(b"held")) == (INPUT_OK, None)
        held.send(read(10, 0))  # then silence, with a READ held by the broker
        start = time.monotonic()
        with pytest.raises(PipeTimeout):
            reader.read(1)  # blocking with no data for 6 s: the library pings meanwhile
        assert time.monotonic() - start >= 5.9
        # the raw client that said nothing and held nothing was expired long ago: the broker
        # has forgotten its end, so a READ now does not fit its (new) state
        assert silent.call(read(10, 0)) == (INVALID, None)
        # the one that waits for its READ was not: it waits for us
        write_all(b.name, "held", [b"patience"])
        assert held.recv() == (READ_OK, b"patience")
        # both library ends still work
        writer.write(b"still alive")
        writer.close()
        assert reader.read() == b"still alive"
        write_all(b.name, "hb2", [b"me too"])
        assert idle.read() == b"me too"
    finally:
        silent.close()
        held.close()
        for end in (reader, writer, idle):
            end.abort()


# --- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "x" * 256, "é" * 128, b"\xc3\x28", b""])
def test_bad_pipe_names_raise_value_error(broker, name):
    for mode in ("r", "w"):
        with pytest.raises(ValueError):
            zpipes.open(name, mode, broker=broker.name)


def test_longest_and_non_ascii_names_work(broker):
    for name in ("n" * 255, "é" * 127, "pipe with spaces/and/slashes ✓"):
        with zpipes.open(name, "r", broker=broker.name, timeout=10) as reader:
            write_all(broker.name, name, [name.encode()])
            assert reader.read() == name.encode()


def test_a_send_to_a_closed_connection_fails_even_with_sigpipe_at_its_default():
    """A program may set SIGPIPE back to its default (many command-line tools do); a write to a
    broker connection that just closed must then fail, not kill the program."""
    code = textwrap.dedent("""
        import signal, socket
        from zpipes import zmtp
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        ours, theirs = socket.socketpair()
        theirs.close()
        link = zmtp.DealerLink(ours)
        try:
            link.send(b"x" * 100, None)
        except BrokenPipeError:
            print("failed")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and done.stdout == "failed\n", (done.returncode, done.stderr)
