"""Unit tests of the client's protocol logic (no sockets), its errors, open() argument checks and
the CLI's argument handling; and a few tests of the client's socket layer against a scripted
stand-in for the broker (no real broker)."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import uuid
from typing import Any

import pytest
import zmq
from helpers import endpoint_accepts, wait_for
from hypothesis import given, settings
from hypothesis import strategies as st

import zpipes
from zpipes import aio, cli
from zpipes import protocol as p
from zpipes.client import (
    EOF,
    WRITE_HEADROOM,
    WRITE_TAILROOM,
    Phase,
    ReaderProtocol,
    WriterProtocol,
    check_pipe_name,
)
from zpipes.errors import (
    BrokenPipe,
    BrokerUnavailable,
    PipeFailed,
    PipeTimeout,
    ProtocolError,
    ZpipesError,
)

# --- helpers ---------------------------------------------------------------------------------


def opened_reader(**kwargs) -> ReaderProtocol:
    proto = ReaderProtocol("pipe", **kwargs)
    proto.open_command()
    proto.receive(p.InputOk())
    assert proto.phase is Phase.OPEN
    return proto


def opened_writer(**kwargs) -> WriterProtocol:
    proto = WriterProtocol("pipe", **kwargs)
    proto.open_command()
    proto.receive(p.OutputOk())
    assert proto.phase is Phase.OPEN
    return proto


def feed(proto: ReaderProtocol, *chunks: bytes) -> None:
    """READ_OK replies, as frames, as the client gets them."""
    for chunk in chunks:
        proto.reads_sent(1)
        proto.receive_frame(p.encode(p.ReadOk(chunk)))


def joined(parts) -> bytes:
    return b"".join(bytes(part) for part in parts)


# --- names -----------------------------------------------------------------------------------


def test_pipe_names():
    assert check_pipe_name("abc") == b"abc"
    assert check_pipe_name(b"abc") == b"abc"
    assert check_pipe_name("é" * 127) == "é".encode() * 127  # 254 bytes
    assert check_pipe_name("x" * 255) == b"x" * 255
    for bad in ("", b"", "x" * 256, "é" * 128, b"\xff\xfe"):
        with pytest.raises(ValueError):
            check_pipe_name(bad)
    with pytest.raises(TypeError):
        check_pipe_name(42)  # type: ignore[arg-type]


def test_open_checks_arguments_before_connecting():
    with pytest.raises(ValueError, match="mode"):
        zpipes.open("p", "a")
    with pytest.raises(TypeError, match="window"):
        zpipes.open("p", "r", window=2)
    with pytest.raises(TypeError, match="encoding"):
        zpipes.open("p", "rb", encoding="utf-8")
    with pytest.raises(ValueError):
        zpipes.open("", "r")
    with pytest.raises(ValueError):
        zpipes.open("p", "w", chunk_size=4 << 20, window=4)  # over the broker's 8 MiB
    with pytest.raises(ValueError):
        zpipes.open("p", "r", read_ahead=0)


def test_no_broker_fails_fast():
    name = f"absent-{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="not running"):
        zpipes.open("p", "r", broker=name)
    assert time.monotonic() - start < 1


# --- errors ----------------------------------------------------------------------------------


def test_error_hierarchy():
    broken = BrokenPipe("write failed: no readers", "no readers")
    assert isinstance(broken, PipeFailed) and isinstance(broken, ZpipesError)
    assert isinstance(broken, BrokenPipeError)
    assert broken.reason == "no readers" and broken.errno == 32
    assert str(broken) == "write failed: no readers"
    timeout = PipeTimeout("timed out", written=5)
    assert isinstance(timeout, TimeoutError) and isinstance(timeout, ZpipesError)
    assert timeout.written == 5 and str(timeout) == "timed out"
    for cls in (PipeFailed, BrokerUnavailable, ProtocolError):
        assert issubclass(cls, ZpipesError)
        assert not issubclass(cls, TimeoutError)


# --- reader: open and close ------------------------------------------------------------------


def test_reader_open_frame_and_refusal():
    proto = ReaderProtocol("hello")
    assert proto.open_command() == bytes.fromhex("aaa0010568656c6c6f")
    assert proto.phase is Phase.OPENING and proto.needs_close
    proto.receive(p.PingOk())
    assert proto.phase is Phase.OPENING
    proto.receive(p.InputFailed("pipe is busy"))
    assert proto.phase is Phase.FAILED and not proto.needs_close
    assert isinstance(proto.error, PipeFailed) and proto.error.reason == "pipe is busy"
    assert "hello" in str(proto.error)


def test_reader_unexpected_open_reply_is_protocol_error():
    proto = ReaderProtocol("x")
    proto.open_command()
    proto.receive(p.OutputOk())
    assert proto.phase is Phase.BROKEN and isinstance(proto.error, ProtocolError)
    assert not proto.needs_close


def test_reader_close_discards_outstanding_replies():
    proto = opened_reader()
    proto.reads_sent(proto.reads_wanted())
    assert proto.close_command() == bytes.fromhex("aaa010")
    proto.receive(p.ReadOk(b"late data"))
    proto.receive(p.ReadFailed("closed"))
    proto.receive(p.ReadFailed("closed"))
    assert proto.phase is Phase.CLOSING and proto.ready == 0
    assert proto.reads_wanted(blocking=True) == 0
    proto.receive(p.CloseOk())
    assert proto.phase is Phase.CLOSED and proto.close_error is None


def test_close_failed_and_invalid_while_closing():
    proto = opened_reader()
    proto.close_command()
    proto.receive(p.CloseFailed("oops"))
    assert proto.phase is Phase.CLOSED and proto.close_error.reason == "oops"
    proto = opened_reader()
    proto.close_command()
    proto.receive(p.Invalid())  # the broker had forgotten us: closed anyway
    assert proto.phase is Phase.CLOSED and proto.close_error is None


# --- reader: requests ------------------------------------------------------------------------


def test_reader_keeps_reads_outstanding_within_limits():
    proto = opened_reader(read_size=100, read_ahead=3)
    assert proto.read_frame == p.encode(p.Read(100, 0))
    assert proto.reads_wanted() == 3
    proto.reads_sent(3)
    assert proto.reads_wanted() == 0
    proto.receive(p.ReadOk(b"x" * 100))
    assert proto.outstanding == 2 and proto.reads_wanted() == 1
    proto.reads_sent(1)
    for _ in range(3):
        proto.receive(p.ReadOk(b"x" * 100))
    assert proto.ready == 400 >= proto.buffer_limit == 300
    assert proto.reads_wanted() == 0  # the program is not reading: stop asking
    assert proto.reads_wanted(blocking=True) == 3  # it waits for more: ask anyway


def test_reader_read_timeout_reply_only_frees_the_request():
    proto = opened_reader()
    proto.reads_sent(1)
    proto.receive(p.ReadTimeout())
    assert proto.outstanding == 0 and proto.ready == 0 and not proto.final


# --- reader: the stream ----------------------------------------------------------------------


def test_take_across_chunks_keeps_the_rest():
    proto = opened_reader()
    feed(proto, b"abcdef", b"ghi", b"jklmnop")
    assert proto.ready == 16
    assert joined(proto.take(1)) == b"a"
    assert joined(proto.take(7)) == b"bcdefgh"
    assert proto.ready == 8
    assert bytes(proto.take_view(2)) == b"i"  # one chunk at most
    assert bytes(proto.take_view(3)) == b"jkl"
    assert bytes(proto.peek_view()) == b"mnop"
    assert joined(proto.take(100)) == b"mnop"
    assert proto.ready == 0 and proto.take(5) == [] and len(proto.take_view()) == 0


def test_unread_puts_data_back_in_front():
    proto = opened_reader()
    feed(proto, b"abc", b"def")
    parts = proto.take(4)
    proto.unread(parts)
    assert proto.ready == 6 and joined(proto.take(6)) == b"abcdef"


def test_received_chunks_are_not_copied():
    proto = opened_reader()
    frame = bytearray(p.encode(p.ReadOk(b"0123456789")))
    proto.reads_sent(1)
    proto.receive_frame(frame)
    frame[-1:] = b"X"  # the buffer is shared: the view sees the change
    assert bytes(proto.take_view()) == b"012345678X"


def test_find_newline_across_chunks():
    proto = opened_reader()
    feed(proto, b"ab", b"c\nd", b"ef\n")
    assert proto.find_newline() == 3
    assert proto.find_newline(4) == 7
    assert proto.find_newline(4, 7) == -1
    assert proto.find_newline(0, 3) == -1
    assert proto.find_newline(8) == -1


def test_end_of_stream_marker():
    proto = opened_reader()
    proto.reads_sent(4)
    proto.receive(p.ReadOk(b"tail"))
    proto.receive(p.ReadEnd())
    proto.receive(p.ReadEnd())  # several ENDs in a row are one end
    proto.receive(p.ReadEnd())
    assert proto.final and proto.marker is EOF and proto.ready == 4
    assert proto.reads_wanted(blocking=True) == 0  # nothing more to ask before the end is seen
    with pytest.raises(RuntimeError):
        proto.consume_eof()  # data first
    assert joined(proto.take(10)) == b"tail"
    proto.consume_eof()
    assert not proto.final and proto.ready == 0
    assert proto.reads_wanted() == 4 - proto.outstanding


def test_data_after_end_of_stream_is_kept_for_the_next_stream():
    proto = opened_reader()
    proto.reads_sent(3)
    proto.receive(p.ReadEnd())
    proto.receive(p.ReadOk(b"new writer"))
    proto.receive(p.ReadEnd())
    assert proto.ready == 0 and proto.marker is EOF
    proto.consume_eof()
    assert proto.ready == 10 and proto.marker is EOF
    assert joined(proto.take(10)) == b"new writer"


def test_late_read_ends_of_a_consumed_end_collapse_into_it():
    """Regression: READs still outstanding when an end of stream is consumed get READ_END for
    that same end (the broker repeats it while no writer is attached); they once became a
    second end, a b"" for a read started after a new writer attached."""
    proto = opened_reader(read_ahead=4)
    proto.reads_sent(4)
    proto.receive(p.ReadOk(b"one"))
    proto.reads_sent(1)  # topped up
    proto.receive(p.ReadEnd())  # the end: consumed before the other three READ_ENDs arrive
    assert joined(proto.take(10)) == b"one"
    proto.consume_eof()
    assert proto.outstanding == 3
    for _ in range(3):
        proto.receive(p.ReadEnd())
    assert not proto.final and proto.marker is None and proto.outstanding == 0
    # a new writer's stream; READs sent from now on see its data, then its own end
    proto.reads_sent(proto.reads_wanted(blocking=True))
    proto.receive(p.ReadOk(b"two"))
    assert proto.ready == 3 and not proto.final
    proto.receive(p.ReadEnd())
    assert proto.final and proto.marker is EOF
    assert joined(proto.take(10)) == b"two"
    proto.consume_eof()
    assert not proto.final


def test_a_read_end_to_a_read_sent_after_the_end_was_consumed_is_a_new_end():
    proto = opened_reader(read_ahead=2)
    proto.reads_sent(2)
    proto.receive(p.ReadEnd())
    proto.consume_eof()  # one READ of before is still outstanding
    proto.reads_sent(1)  # and one of after
    proto.receive(p.ReadEnd())  # answers the READ of before: the same end
    assert not proto.final
    proto.receive(p.ReadEnd())  # answers the READ of after: an end of its own (sticky)
    assert proto.final and proto.marker is EOF


def test_a_read_end_after_new_data_is_a_new_end_even_for_a_read_of_before():
    """A new writer may write and close while READs of before are still outstanding: once
    its data came, its end is a real end."""
    proto = opened_reader(read_ahead=4)
    proto.reads_sent(4)
    proto.receive(p.ReadEnd())
    proto.consume_eof()
    proto.receive(p.ReadOk(b"short"))  # READs of before, answered with the new stream
    proto.receive(p.ReadEnd())
    assert proto.final and proto.marker is EOF and proto.ready == 5
    assert joined(proto.take(5)) == b"short"
    proto.consume_eof()
    proto.receive(p.ReadEnd())  # the last READ of before: that same end again
    assert not proto.final and proto.outstanding == 0


def test_late_replies_of_another_kind_keep_the_count_of_reads_of_before():
    proto = opened_reader(read_ahead=3)
    proto.reads_sent(3)
    proto.receive(p.ReadEnd())
    proto.consume_eof()
    proto.receive(p.ReadTimeout())  # a READ of before, answered otherwise
    proto.reads_sent(1)
    proto.receive(p.ReadEnd())  # the other READ of before: the same end
    assert not proto.final
    proto.receive(p.ReadEnd())  # the READ of after: a new end
    assert proto.final


def test_an_end_consumed_with_the_next_stream_already_there_counts_later_ends():
    proto = opened_reader(read_ahead=4)
    proto.reads_sent(4)
    proto.receive(p.ReadEnd())
    proto.receive(p.ReadOk(b"next"))  # the next stream came before the end was consumed
    proto.consume_eof()
    assert proto.ready == 4
    proto.receive(p.ReadEnd())  # its end
    assert proto.final and proto.marker is EOF


@pytest.mark.parametrize("reason", ["broker stopping", "client expired: silent for too long"])
def test_a_broker_that_dropped_the_end_is_not_sent_a_close(reason):
    reader = opened_reader()
    reader.reads_sent(2)
    reader.receive(p.ReadFailed(reason))
    assert reader.phase is Phase.OPEN and not reader.needs_close
    writer = opened_writer()
    writer.write_sent(5)
    writer.receive(p.WriteFailed(reason))
    assert not writer.needs_close
    with pytest.raises(PipeFailed, match=reason):
        writer.check()


def test_other_failures_still_need_a_close():
    reader = opened_reader()
    reader.reads_sent(1)
    reader.receive(p.ReadFailed("pipe destroyed"))
    assert reader.needs_close
    writer = opened_writer()
    writer.write_sent(5)
    writer.receive(p.WriteFailed("no readers"))
    assert writer.needs_close


def test_connection_lost_follows_the_data_and_the_broker_reason_wins():
    lost = BrokerUnavailable("lost the connection to broker 'b'")
    proto = opened_reader()
    proto.reads_sent(4)
    proto.receive(p.ReadOk(b"data"))
    proto.connection_lost(lost)
    assert not proto.needs_close and proto.outstanding == 0
    assert proto.ready == 4 and proto.marker is lost
    assert proto.reads_wanted(blocking=True) == 0
    proto = opened_reader()
    proto.reads_sent(4)
    proto.receive(p.ReadFailed("broker stopping"))  # arrived before the connection dropped
    proto.connection_lost(lost)
    assert proto.marker.reason == "broker stopping" and len(proto._later) == 1
    writer = opened_writer()
    writer.write_sent(5)
    writer.connection_lost(lost)
    assert writer.outstanding == 0 and not writer.needs_close
    with pytest.raises(BrokerUnavailable):
        writer.check()
    writer = opened_writer()
    writer.write_sent(5)
    writer.write_sent(5)
    writer.receive(p.WriteFailed("broker stopping"))
    writer.connection_lost(lost)
    with pytest.raises(PipeFailed, match="broker stopping"):
        writer.check()


def test_connection_lost_while_opening_or_closing():
    lost = BrokerUnavailable("lost")
    proto = ReaderProtocol("x")
    proto.open_command()
    proto.connection_lost(lost)
    assert proto.phase is Phase.FAILED and proto.error is lost and not proto.needs_close
    proto = opened_writer()
    proto.close_command()
    proto.connection_lost(lost)
    assert proto.phase is Phase.CLOSED


def test_read_failed_is_a_sticky_marker_after_the_data():
    proto = opened_reader()
    proto.reads_sent(3)
    proto.receive(p.ReadOk(b"data"))
    proto.receive(p.ReadFailed("broker stopping"))
    proto.receive(p.ReadFailed("broker stopping"))
    assert proto.ready == 4 and proto.final
    assert isinstance(proto.marker, PipeFailed) and proto.marker.reason == "broker stopping"
    assert len(proto._later) == 1  # one error is enough
    assert proto.reads_wanted(blocking=True) == 0
    proto.take(4)
    assert isinstance(proto.marker, PipeFailed)
    with pytest.raises(RuntimeError):
        proto.consume_eof()


@pytest.mark.parametrize(
    "reply", [p.Invalid(), p.WriteOk(), p.InputOk(), p.CloseOk()], ids=lambda r: r.id.name
)
def test_reader_unexpected_replies_break_the_end(reply):
    proto = opened_reader()
    proto.reads_sent(4)
    feed(proto, b"abc")
    proto.receive(reply)
    assert proto.phase is Phase.BROKEN and not proto.needs_close
    assert isinstance(proto.marker, ProtocolError) and proto.ready == 3
    assert proto.outstanding == 0 and proto.reads_wanted(blocking=True) == 0


@pytest.mark.parametrize(
    "frame", [b"", b"\xaa", b"\xaa\xa1\x08", b"\xaa\xa0\x63", b"\xaa\xa0\x07" + bytes(8),
              b"\xaa\xa0\x08\x00\x00\x00\x09abc"],
)
def test_reader_garbage_is_a_protocol_error(frame):
    proto = opened_reader()
    proto.receive_frame(frame)
    assert proto.phase is Phase.BROKEN and isinstance(proto.marker, ProtocolError)


def test_ping_ok_changes_nothing():
    proto = opened_reader()
    proto.reads_sent(2)
    proto.receive_frame(p.encode(p.PingOk()))
    assert proto.phase is Phase.OPEN and proto.outstanding == 2 and not proto.final


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=2000),
    cuts=st.lists(st.integers(1, 300), max_size=40),
    takes=st.lists(st.integers(1, 400), min_size=1, max_size=40),
)
def test_stream_survives_any_chunking(data, cuts, takes):
    """However the data is cut into READ_OKs and however it is taken, it comes out whole."""
    proto = opened_reader()
    pos = 0
    for cut in cuts:
        if pos < len(data):
            feed(proto, data[pos : pos + cut])
            pos += cut
    if pos < len(data):
        feed(proto, data[pos:])
    proto.reads_sent(1)
    proto.receive(p.ReadEnd())
    out = bytearray()
    i = 0
    while proto.ready:
        size = takes[i % len(takes)]
        if i % 3 == 2:
            out += proto.take_view(size)
        else:
            out += joined(proto.take(size))
        i += 1
    assert bytes(out) == data and proto.marker is EOF


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=1, max_size=20).map(lambda b: b.replace(b"\0", b"\n")),
                    max_size=12),
    start=st.integers(0, 250),
    stop=st.integers(0, 250),
)
def test_find_newline_matches_bytes_find(chunks, start, stop):
    proto = opened_reader()
    feed(proto, *chunks)
    whole = b"".join(chunks)
    expected = whole.find(b"\n", start, min(stop, len(whole)))
    assert proto.find_newline(start, stop) == expected


# --- writer ----------------------------------------------------------------------------------


def test_writer_frames_match_the_codec():
    proto = opened_writer()
    assert proto.write_frame(b"abc") == p.encode(p.Write(b"abc", 0))
    assert proto.write_frame(memoryview(b"xyzw")[1:3]) == p.encode(p.Write(b"yz", 0))
    assert WriterProtocol("hello").open_command() == bytes.fromhex("aaa0040568656c6c6f")


def test_writer_builds_frames_in_place():
    proto = opened_writer()
    buf = bytearray(WRITE_HEADROOM + 10 + WRITE_TAILROOM)
    view = memoryview(buf)
    view[WRITE_HEADROOM : WRITE_HEADROOM + 5] = b"hello"
    frame = proto.fill_write_frame(view, 5)
    assert bytes(frame) == p.encode(p.Write(b"hello", 0))
    assert frame.obj is buf  # no copy


def test_writer_window_and_acknowledgements():
    proto = opened_writer(chunk_size=10, window=2)
    assert not proto.window_full
    proto.write_sent(10)
    proto.write_sent(3)
    assert proto.window_full and proto.outstanding == 2 and proto.outstanding_bytes == 13
    proto.receive(p.PingOk())
    proto.receive(p.WriteOk())
    assert not proto.window_full and proto.outstanding_bytes == 3
    assert proto.bytes_sent == 13 and proto.bytes_acked == 10
    proto.receive(p.WriteOk())
    assert proto.outstanding == 0 and proto.bytes_acked == 13
    proto.check()


def test_writer_no_readers_is_a_broken_pipe_and_sticks():
    proto = opened_writer()
    proto.write_sent(5)
    proto.write_sent(5)
    proto.receive(p.WriteFailed("no readers"))
    proto.receive(p.WriteFailed("some later reason"))
    assert proto.outstanding == 0
    for _ in range(2):
        with pytest.raises(BrokenPipe) as info:
            proto.check()
        assert isinstance(info.value, BrokenPipeError) and info.value.reason == "no readers"


def test_writer_other_failures():
    proto = opened_writer()
    proto.write_sent(5)
    proto.receive(p.WriteFailed("pipe destroyed"))
    with pytest.raises(PipeFailed) as info:
        proto.check()
    assert not isinstance(info.value, BrokenPipe)
    proto = opened_writer()
    proto.write_sent(5)
    proto.receive(p.WriteTimeout())  # never asked for: a chunk went missing
    with pytest.raises(PipeFailed):
        proto.check()
    assert proto.bytes_acked == 0


def test_writer_open_refused_and_invalid():
    proto = WriterProtocol("x")
    proto.open_command()
    proto.receive(p.OutputFailed("too many writers"))
    assert proto.phase is Phase.FAILED and proto.error.reason == "too many writers"
    proto = opened_writer()
    proto.write_sent(5)
    proto.receive(p.Invalid())
    assert proto.phase is Phase.BROKEN and proto.outstanding == 0 and not proto.needs_close
    with pytest.raises(ProtocolError):
        proto.check()
    proto = opened_writer()
    proto.receive(p.ReadOk(b"?"))
    with pytest.raises(ProtocolError):
        proto.check()


def test_writer_close_discards_write_replies():
    proto = opened_writer()
    proto.write_sent(5)
    proto.write_sent(5)
    proto.close_command()
    proto.receive(p.WriteOk())
    proto.receive(p.WriteFailed("closed"))
    proto.check()  # a failure caused by our own CLOSE is no error
    proto.receive(p.CloseOk())
    assert proto.phase is Phase.CLOSED and proto.outstanding == 0 and proto.bytes_acked == 5


def test_writer_option_limits():
    for kwargs in ({"chunk_size": 0}, {"window": 0}, {"window": 33},
                   {"chunk_size": 3 << 20, "window": 3}):
        with pytest.raises(ValueError):
            WriterProtocol("x", **kwargs)


# --- CLI arguments ---------------------------------------------------------------------------


def test_cli_parser():
    parser = cli.build_parser()
    args = parser.parse_args(["write", "p"])
    assert args.command == "write" and args.name == "p"
    assert not hasattr(args, "broker") and not hasattr(args, "timeout")
    args = parser.parse_args(["--broker", "b1", "read", "p", "--timeout", "2.5"])
    assert (args.command, args.name, args.broker, args.timeout) == ("read", "p", "b1", 2.5)


@pytest.mark.parametrize(
    "argv",
    [[], ["copy", "p"], ["read"], ["read", "p", "--timeout", "0"],
     ["read", "p", "--timeout", "soon"], ["write", "x" * 256], ["write", ""]],
)
def test_cli_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_cli_without_broker_exits_1_with_one_line(capsys):
    name = f"absent-{uuid.uuid4().hex[:8]}"
    assert cli.main(["read", "p", "--broker", name]) == 1
    err = capsys.readouterr().err
    assert err.startswith("zpipes: ") and err.count("\n") == 1 and "not running" in err


# --- the socket layer, against a scripted stand-in for the broker ----------------------------


class ScriptedBroker:
    """A ROUTER on a broker endpoint that answers INPUT/OUTPUT, PING (if ``pings``) and CLOSE,
    records everything and answers other commands only via ``reply``."""

    def __init__(self, pings: bool = True, write_ok: bool = False):
        self.name = f"unit-{uuid.uuid4().hex[:8]}"
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(zpipes.endpoint(self.name))
        self.pings = pings
        self.write_ok = write_ok
        self.seen: list = []
        self.peer: bytes | None = None
        self.peer_of: dict[type, bytes] = {}  # the last sender of each kind of message
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            with self.lock:
                if not self.sock.poll(10):
                    continue
                peer, frame = self.sock.recv_multipart()
                msg = p.decode(frame)
                if isinstance(msg, p.DecodeError):  # e.g. a timeout's HINT (zpipes/hint.py):
                    self.sock.send_multipart([peer, p.encode(p.Invalid())])  # as a broker of
                    continue  # before answers it, on a connection of its own
                self.peer = peer
                self.peer_of[type(msg)] = peer
                self.seen.append(msg)
                answer = {
                    p.Input: p.InputOk(), p.Output: p.OutputOk(), p.Close: p.CloseOk(),
                    p.Ping: p.PingOk() if self.pings else None,
                    p.Write: p.WriteOk() if self.write_ok else None,
                }.get(type(msg))
                if answer is not None:
                    self.sock.send_multipart([peer, p.encode(answer)])

    def reply(self, msg, to: type | None = None):
        """Answer the last sender (``to``: the last sender of that kind of message)."""
        with self.lock:
            peer = self.peer if to is None else self.peer_of[to]
            self.sock.send_multipart([peer, p.encode(msg)])

    def count(self, cls) -> int:
        return sum(isinstance(m, cls) for m in list(self.seen))

    def wait_for(self, cls, count: int) -> list:
        wait_for(lambda: self.count(cls) >= count, 5, f"the broker to get {count} "
                 f"{cls.__name__}", interval=0.01)
        return [m for m in list(self.seen) if isinstance(m, cls)]

    def watch(self):
        """Start watching for client connections that close (see ``wait_disconnect``)."""
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def wait_disconnect(self, timeout: float = 5.0) -> float:
        """Wait until a client connection closed and every message that came before was
        taken; the time the close was seen (monotonic)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.monitor.poll(50):
                event = self.monitor.recv_multipart()
                if int.from_bytes(event[0][:2], "little") & zmq.EVENT_DISCONNECTED:
                    seen = time.monotonic()
                    self.settle()
                    return seen
        raise AssertionError(f"no client connection closed within {timeout}s")

    def settle(self) -> None:
        """Wait until the stand-in took every message that has arrived."""

        def taken() -> bool:
            with self.lock:
                return not self.sock.poll(0)

        wait_for(taken, 5, "the stand-in to take what arrived", interval=0.01)

    def close(self):
        self.stop.set()
        self.thread.join()
        if hasattr(self, "monitor"):
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
        self.sock.close()


@pytest.fixture
def broker():
    b = ScriptedBroker()
    yield b
    b.close()


def test_client_timeout_keeps_outstanding_reads(broker):
    with zpipes.open("p", "r", broker=broker.name, timeout=0.2, read_ahead=2) as reader:
        start = time.monotonic()
        with pytest.raises(PipeTimeout) as info:
            reader.read(3)
        assert 0.15 < time.monotonic() - start < 1.5
        # its HINT answered INVALID, as by a broker of before: no hint
        assert str(info.value) == "read from pipe 'p' timed out after 0.2 s"
        assert broker.count(p.Read) == 2
        assert all(m.timeout == 0 for m in broker.seen if isinstance(m, p.Read))
        broker.reply(p.ReadOk(b"ab"))
        with pytest.raises(PipeTimeout):
            reader.read(3)  # two bytes are not three; nothing is consumed
        broker.reply(p.ReadOk(b"cd"))
        assert reader.read(3) == b"abc"
        assert reader.read1(10) == b"d"
        broker.reply(p.ReadEnd())
        assert reader.read() == b""
    assert isinstance(broker.seen[-1], p.Close)


def test_client_pings_while_waiting_and_while_idle(broker):
    reader = zpipes.open("p", "r", broker=broker.name, ping_interval=0.1)
    # the program is busy elsewhere (here: waiting): the heartbeat thread pings
    wait_for(lambda: broker.count(p.Ping) >= 3, 5, "three PINGs of the heartbeat thread")
    reader.timeout = 0.5
    before = broker.count(p.Ping)
    with pytest.raises(PipeTimeout):
        reader.read(1)
    assert broker.count(p.Ping) >= before + 3
    reader.close()


def test_silent_broker_is_noticed():
    silent = ScriptedBroker(pings=False)
    try:
        reader = zpipes.open("p", "r", broker=silent.name, ping_interval=0.1, broker_timeout=0.6)
        start = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="not responding"):
            reader.read(1)
        assert time.monotonic() - start < 2
        reader.close()  # does not wait for a broker that is gone
    finally:
        silent.close()


def test_writer_window_and_errors_on_later_calls(broker):
    writer = zpipes.open("p", "w", broker=broker.name, chunk_size=4, window=2, timeout=0.3)
    assert writer.write(b"abcdefgh") == 8  # two WRITEs fill the window: no wait yet
    with pytest.raises(PipeTimeout) as info:
        writer.write(b"ijklmn")
    assert info.value.written == 0
    broker.reply(p.WriteOk())
    assert writer.write(b"ij") == 2
    writes = broker.wait_for(p.Write, 3)
    assert [bytes(m.chunk) for m in writes] == [b"abcd", b"efgh", b"ij"]
    broker.reply(p.WriteFailed("no readers"))
    broker.reply(p.WriteOk())
    arrived(writer, 2)
    with pytest.raises(BrokenPipe):
        writer.write(b"more")
    with pytest.raises(BrokenPipeError):
        writer.close()
    # the flush in close failed: the end is aborted, not closed (no CLOSE)
    assert writer.closed and broker.count(p.Close) == 0


def test_write_from_reads_what_is_there():
    broker = ScriptedBroker(write_ok=True)
    rfd, wfd = os.pipe()
    try:
        writer = zpipes.open("p", "w", broker=broker.name)
        os.write(wfd, b"line one\n")
        assert writer.write_from(rfd) == 9
        assert bytes(broker.wait_for(p.Write, 1)[0].chunk) == b"line one\n"

        def produce():
            os.write(wfd, b"x" * 300_000)
            os.close(wfd)

        producer = threading.Thread(target=produce)
        producer.start()
        got = 0
        while n := writer.write_from(rfd):
            got += n
        assert got == 300_000
        assert writer.write_from(rfd) == 0  # still at end, without reading again
        producer.join()
        writer.close()
        writes = [m for m in broker.seen if isinstance(m, p.Write)]
        assert b"".join(bytes(m.chunk) for m in writes[1:]) == b"x" * 300_000
        assert isinstance(broker.seen[-1], p.Close)
    finally:
        os.close(rfd)
        broker.close()


def test_reader_stream_calls(broker):
    reader = zpipes.open("p", "r", broker=broker.name, timeout=2)
    broker.wait_for(p.Read, 4)
    for chunk in (b"first li", b"ne\nsecond line\nthird", b" line\n", b"0123456789"):
        broker.reply(p.ReadOk(chunk))
    assert reader.readline() == b"first line\n"
    assert reader.readline(3) == b"sec"
    assert next(reader) == b"ond line\n"
    assert reader.peek()[:5] == b"third"
    buf = bytearray(12)
    assert reader.readinto(buf) == 12 and buf == b"third line\n0"
    assert reader.readinto1(memoryview(buf)[:4]) == 4 and buf[:4] == b"1234"
    assert bytes(reader.readview(2)) == b"56"
    broker.reply(p.ReadEnd())
    assert reader.read(100) == b"789"  # short: the stream ends after it
    assert reader.read(100) == b""
    broker.reply(p.ReadOk(b"a new writer's stream\nno newline"))
    broker.reply(p.ReadFailed("broker stopping"))
    lines = iter(reader)
    assert next(lines) == b"a new writer's stream\n"
    with pytest.raises(PipeFailed):
        next(lines)  # a last line without newline would look like the end of the stream
    reader.close()


def test_failure_never_looks_like_end(broker):
    reader = zpipes.open("p", "r", broker=broker.name, timeout=2)
    broker.wait_for(p.Read, 4)
    broker.reply(p.ReadOk(b"partial"))
    broker.reply(p.ReadFailed("broker stopping"))
    arrived(reader, 2)
    with pytest.raises(PipeFailed, match="broker stopping"):
        reader.read(100)  # a short read would look like the end of the stream
    with pytest.raises(PipeFailed):
        reader.readline()
    with pytest.raises(PipeFailed):
        reader.read()
    assert reader.read1(100) == b"partial"  # what did arrive is still there
    with pytest.raises(PipeFailed):
        reader.read1(100)
    reader.close()


def arrived(end: Any, count: int) -> None:
    """Wait until ``count`` replies the end has not taken yet have arrived (its heartbeat
    thread takes them in while the program does not call)."""
    wait_for(lambda: len(end._channel._inbox) >= count, 5, f"{count} replies to arrive")


def _scripted_broker_goes_away(broker: ScriptedBroker, end: Any, replies: int) -> None:
    """The stand-in closes its socket (like a broker process that exits), once what it sent
    has been delivered: the ``replies`` sent to ``end``."""
    arrived(end, replies)
    broker.close()


def test_replies_sent_before_the_broker_went_away_win_and_close_does_not_wait():
    broker = ScriptedBroker()
    try:
        reader = zpipes.open("p", "r", broker=broker.name, timeout=5, broker_timeout=30)
        writer = zpipes.open("q", "w", broker=broker.name, timeout=5, broker_timeout=30)
        writer.write(b"nobody reads this")
        broker.wait_for(p.Read, 4)
        broker.wait_for(p.Write, 1)
        broker.reply(p.ReadOk(b"last"), to=p.Input)
        for _ in range(3):
            broker.reply(p.ReadFailed("broker stopping"), to=p.Input)
        _scripted_broker_goes_away(broker, reader, 4)
        # both ends are idle when the connection drops, and see it
        wait_for(lambda: reader._channel.dead and writer._channel.dead, 5,
                 "the ends to see the connection drop")
        assert reader.read1(100) == b"last"
        start = time.monotonic()
        with pytest.raises(PipeFailed, match="broker stopping"):
            reader.read(1)
        with pytest.raises(BrokerUnavailable, match="lost the connection"):
            writer.flush()  # the writer got no reply: the connection is gone all the same
        reader.close()
        writer.abort()
        assert time.monotonic() - start < 1.0  # neither broker_timeout nor a CLOSE to nobody
        assert not any(isinstance(m, p.Close) for m in broker.seen)
    finally:
        if not broker.stop.is_set():
            broker.close()


def test_a_lost_connection_keeps_the_data_that_came_before():
    broker = ScriptedBroker()
    try:
        reader = zpipes.open("p", "r", broker=broker.name, timeout=5, broker_timeout=30)
        broker.wait_for(p.Read, 4)
        broker.reply(p.ReadOk(b"0123456789"))
        _scripted_broker_goes_away(broker, reader, 1)
        start = time.monotonic()
        assert reader.read(4) == b"0123"  # the top-up READ finds the connection lost
        assert reader.read1(100) == b"456789"
        with pytest.raises(BrokerUnavailable, match="lost the connection"):
            reader.read(1)
        reader.close()
        assert time.monotonic() - start < 1.0
    finally:
        if not broker.stop.is_set():
            broker.close()


def test_endpoint_option_over_tcp():
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        def serve():
            peer, frame = router.recv_multipart()
            assert p.decode(frame) == p.Output(b"p")
            router.send_multipart([peer, p.encode(p.OutputOk())])
            peer, frame = router.recv_multipart()
            while isinstance(p.decode(frame), p.Ping):
                peer, frame = router.recv_multipart()
            assert isinstance(p.decode(frame), p.Close)
            router.send_multipart([peer, p.encode(p.CloseOk())])

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        writer = zpipes.open("p", "w", broker="elsewhere", endpoint=f"tcp://127.0.0.1:{port}")
        writer.close()
        server.join(5)
        assert not server.is_alive()
    finally:
        router.close()


def test_endpoint_probe_fails_fast_on_a_closed_tcp_port():
    probe = zmq.Context.instance().socket(zmq.ROUTER)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(linger=0)
    wait_for(lambda: not endpoint_accepts(f"tcp://127.0.0.1:{port}"), 5, "the port to close")
    with pytest.raises(BrokerUnavailable):
        zpipes.open("p", "r", endpoint=f"tcp://127.0.0.1:{port}")


# --- ending a stream: close ends it, abort cuts it (no CLOSE: the connection goes) ----------


def test_writer_abort_sends_no_close_and_drops_the_connection_at_once(broker):
    broker.watch()
    writer = zpipes.open("p", "w", broker=broker.name, timeout=5)
    writer.write(b"unacknowledged")  # the stand-in never answers WRITEs
    broker.wait_for(p.Write, 1)
    start = time.monotonic()
    writer.abort()
    assert writer.closed
    assert broker.wait_disconnect() - start < 1.0
    assert broker.count(p.Close) == 0
    writer.abort()  # again: nothing
    writer.close()


def test_reader_abort_sends_close_without_waiting(broker):
    reader = zpipes.open("p", "r", broker=broker.name, timeout=5)
    reader.abort()
    assert reader.closed
    broker.wait_for(p.Close, 1)


@pytest.mark.parametrize("mode", ["w", "wt"])
def test_with_block_left_by_an_exception_aborts_the_writer(mode):
    broker = ScriptedBroker(write_ok=True)
    try:
        broker.watch()
        with pytest.raises(RuntimeError, match="producer failed"):
            with zpipes.open("p", mode, broker=broker.name, timeout=5) as writer:
                writer.write(b"half" if mode == "w" else "half")
                writer.flush()
                raise RuntimeError("producer failed")
        assert writer.closed
        broker.wait_disconnect()
        assert broker.count(p.Close) == 0
        assert [bytes(m.chunk) for m in broker.seen if isinstance(m, p.Write)] == [b"half"]
        # left normally, the block closes: CLOSE once the broker took everything
        with zpipes.open("p", mode, broker=broker.name, timeout=5) as writer:
            writer.write(b"whole" if mode == "w" else "whole")
        broker.wait_for(p.Close, 1)
        assert bytes(broker.wait_for(p.Write, 2)[1].chunk) == b"whole"
    finally:
        broker.close()


def test_text_writer_abort_drops_the_text_it_holds_and_the_end_under_it(broker):
    writer = zpipes.open("p", "wt", broker=broker.name, timeout=5)
    writer.write("held by the text layer")
    writer.abort()
    assert writer.closed and writer.buffer.closed
    writer.close()  # nothing left to flush or close
    assert broker.count(p.Write) == 0 and broker.count(p.Close) == 0


def test_close_whose_flush_times_out_aborts_instead_of_ending_the_stream(broker):
    """A CLOSE while WRITEs are unanswered would make the broker drop them and end the stream
    as if it were whole."""
    broker.watch()
    writer = zpipes.open("p", "w", broker=broker.name, timeout=0.3)
    writer.write(b"never acknowledged")
    with pytest.raises(PipeTimeout):
        writer.close()
    assert writer.closed
    broker.wait_disconnect()
    assert broker.count(p.Close) == 0


async def test_async_with_left_by_an_exception_aborts_the_writer():
    broker = ScriptedBroker(write_ok=True)
    try:
        broker.watch()
        with pytest.raises(RuntimeError, match="producer failed"):
            async with await aio.open("p", "w", broker=broker.name, timeout=5) as writer:
                await writer.write(b"half")
                await writer.flush()
                raise RuntimeError("producer failed")
        assert writer.closed
        await asyncio.to_thread(broker.wait_disconnect)
        assert broker.count(p.Close) == 0
        async with await aio.open("p", "w", broker=broker.name, timeout=5) as writer:
            await writer.write(b"whole")
        await asyncio.to_thread(broker.wait_for, p.Close, 1)
    finally:
        broker.close()


@pytest.mark.parametrize("acknowledged", [True, False])
async def test_an_async_writer_dropped_unclosed_closes_only_if_all_was_acknowledged(
        acknowledged):
    """A CLOSE while WRITEs are unanswered would make the broker drop them and end the stream
    as if it were whole: the dropped end is cut then."""
    broker = ScriptedBroker(write_ok=acknowledged)
    try:
        broker.watch()
        writer = await aio.open("p", "w", broker=broker.name, timeout=5)
        await writer.write(b"data")
        if acknowledged:
            await writer.flush()
        del writer
        gc.collect()
        if acknowledged:
            await asyncio.to_thread(broker.wait_for, p.Close, 1)
        await asyncio.to_thread(broker.wait_disconnect)
        assert broker.count(p.Close) == (1 if acknowledged else 0)
    finally:
        broker.close()
