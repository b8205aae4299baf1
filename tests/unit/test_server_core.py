"""The ZPIPES server core without sockets: the state machine table driven by messages and a
fake clock. Each original defect and selftest expectation is a named test here; the same
scenarios run against a real broker process in test_broker_e2e.py."""

import pytest
from zpipes_core import Core

from zbroker.services.zpipes.buffers import NoOutside
from zbroker.services.zpipes.machine import COMMANDS, TABLE, UNEXPECTED, Event, State, rule_for
from zbroker.services.zpipes.server import ServerConfig, ZpipesServer
from zpipes import protocol as p

R, W, R2, W2 = b"reader", b"writer", b"reader2", b"writer2"


class Harness:
    def __init__(self, **config):
        self.server = Core(ServerConfig(**config))
        self.now = 100.0

    def send(self, client, msg):
        frame = msg if isinstance(msg, bytes) else p.encode(msg)
        self.server.receive(client, [frame], self.now)

    def advance(self, seconds):
        self.now += seconds
        self.server.tick(self.now)

    def replies(self, client):
        """Replies to ``client`` since the last call, decoded; READ_OK chunks as bytes."""
        mine = [p.decode(f) for c, f in self.server.outbox if c == client]
        self.server.outbox[:] = [(c, f) for c, f in self.server.outbox if c != client]
        return [p.ReadOk(bytes(m.chunk)) if isinstance(m, p.ReadOk) else m for m in mine]


@pytest.fixture
def h():
    return Harness()


def open_pair(h, name=b"p"):
    h.send(R, p.Input(name))
    h.send(W, p.Output(name))
    assert h.replies(R) == [p.InputOk()]
    assert h.replies(W) == [p.OutputOk()]


# --- the original's selftest ------------------------------------------------------------------


def test_original_selftest_reads_writes_and_end(h):
    open_pair(h, b"test pipe")
    h.send(R, p.Read(6, 100))
    h.advance(0.1)
    assert h.replies(R) == [p.ReadTimeout()]
    for chunk in (b"CHUNK1", b"CHUNK2", b"CHUNK3"):
        h.send(W, p.Write(chunk, 100))
    assert h.replies(W) == [p.WriteOk()] * 3
    h.send(R, p.Read(1, 100))
    h.send(R, p.Read(10, 100))
    assert h.replies(R) == [p.ReadOk(b"C"), p.ReadOk(b"HUNK1CHUNK")]
    h.send(W, p.Close())
    assert h.replies(W) == [p.CloseOk()]
    h.send(R, p.Read(50, 100))
    h.send(R, p.Read(50, 100))
    assert h.replies(R) == [p.ReadOk(b"2CHUNK3"), p.ReadEnd()]
    h.send(R, p.Write(b"CHUNK1", 100))  # a write on a reader connection
    assert h.replies(R) == [p.Invalid()]


def test_original_selftest_pipelined_reads(h):
    open_pair(h, b"test pipe 2")
    for _ in range(3):
        h.send(R, p.Read(6, 300))
    h.advance(0.2)
    h.send(R, p.Ping())  # answered at once, with READs pending
    assert h.replies(R) == [p.PingOk()]
    h.advance(0.11)
    assert h.replies(R) == [p.ReadTimeout()]  # the first READ
    h.advance(0.2)  # the second READ's timeout runs from when it became active
    assert h.replies(R) == []
    h.send(W, p.Write(b"CHUNK1", 300))
    assert h.replies(R) == [p.ReadOk(b"CHUNK1")]
    h.send(W, p.Close())
    assert h.replies(R) == [p.ReadEnd()]


def test_original_selftest_write_without_timeout_waits_for_a_reader(h):
    h.send(W, p.Output(b"p"))
    h.send(W, p.Write(b"data", 0))
    for _ in range(20):  # ten minutes, pinging to stay alive
        h.advance(30)
        h.send(W, p.Ping())
    assert h.replies(W) == [p.OutputOk()] + [p.PingOk()] * 20
    h.send(R, p.Input(b"p"))
    assert h.replies(W) == [p.WriteOk()]


def test_original_selftest_close_during_pending_write(h):
    h.send(W, p.Output(b"p"))
    h.send(W, p.Write(b"data", 0))
    h.send(W, p.Close())
    assert h.replies(W) == [p.OutputOk(), p.WriteFailed("pipe closed by client"), p.CloseOk()]


# --- defects of the original --------------------------------------------------------------------


def test_defect1_read_with_too_little_data_answers_at_once(h):
    open_pair(h)
    h.send(W, p.Write(b"abc", 0))
    h.send(R, p.Read(100, 1000))
    assert h.replies(R) == [p.ReadOk(b"abc")]  # as soon as data is there: no hang, no wait


def test_defect1_read_timeout_is_never_late(h):
    open_pair(h)
    h.send(R, p.Read(100, 250))
    h.advance(0.249)
    assert h.replies(R) == []
    h.advance(0.001)
    assert h.replies(R) == [p.ReadTimeout()]


def test_defect2_ping_does_not_cancel_a_pending_timeout(h):
    open_pair(h)
    h.send(R, p.Read(10, 500))
    h.send(W, p.Write(b"", 0))  # not data
    for _ in range(4):
        h.advance(0.1)
        h.send(R, p.Ping())
    h.advance(0.11)
    assert h.replies(R) == [p.PingOk()] * 4 + [p.ReadTimeout()]
    h.send(W, p.Output(b"x"))  # INVALID on a writer: its pending nothing, end detached
    h.send(W2, p.Output(b"q"))
    h.send(W2, p.Write(b"x", 300))
    h.send(W2, p.Ping())
    h.advance(0.3)
    assert h.replies(W2) == [p.OutputOk(), p.PingOk(), p.WriteTimeout()]


def test_defect3_ping_does_not_replace_a_pending_read(h):
    open_pair(h)
    h.send(R, p.Read(10, 0))
    h.send(R, p.Ping())
    h.send(W, p.Write(b"payload", 0))
    assert h.replies(R) == [p.PingOk(), p.ReadOk(b"payload")]


def test_defect4_writer_opening_while_reader_has_a_read_pending(h):
    h.send(R, p.Input(b"p"))
    h.send(R, p.Read(10, 0))
    h.send(W, p.Output(b"p"))
    h.send(W, p.Write(b"hi", 0))
    assert h.replies(R) == [p.InputOk(), p.ReadOk(b"hi")]
    assert h.replies(W) == [p.OutputOk(), p.WriteOk()]


def test_defect5_malformed_frames_get_invalid_and_others_go_on(h):
    open_pair(h)
    h.send(R, p.Read(10, 0))
    for junk in (b"", b"\x00", b"\xaa\xa0", b"\xaa\xa0\xff", b"\xaa\xa0\x01\x09ab",
                 p.encode(p.ReadOk(b"x"))):
        h.send(b"hostile", junk)
    assert h.replies(b"hostile") == [p.Invalid()] * 6
    h.send(W, p.Write(b"intact", 0))
    assert h.replies(R) == [p.ReadOk(b"intact")]


def test_defect6_invalid_command_leaves_no_dangling_end(h):
    open_pair(h)
    h.send(W, p.Read(1, 0))  # READ on a writer
    assert h.replies(W) == [p.Invalid()]
    assert len(h.server.pipes.pipes[b"p"].writers) == 0
    h.send(R, b"\xaa\xa0\xee")  # garbage on a reader
    assert h.replies(R) == [p.Invalid()]
    assert h.server.pipes.pipes == {}
    h.send(R, p.Input(b"p"))  # the connection can open again
    assert h.replies(R) == [p.InputOk()]


def test_malformed_frame_behind_a_pending_read_keeps_reply_order(h):
    open_pair(h)
    h.send(R, p.Read(10, 0))
    h.send(R, b"junk")
    h.send(R, p.Read(10, 0))
    h.send(W, p.Write(b"one", 0))
    # the pending READ is answered first; then the junk: INVALID, end detached; then the
    # queued READ on a connection that has no pipe open any more: INVALID
    assert h.replies(R) == [p.ReadOk(b"one"), p.Invalid(), p.Invalid()]


# --- end-of-stream, failures, closing -------------------------------------------------------------


def test_end_timeout_and_failure_are_distinct(h):
    open_pair(h)
    h.send(R, p.Read(10, 50))
    h.advance(0.05)
    h.send(R, p.Read(10, 0))
    h.send(R, p.Close())
    h.send(R2, p.Input(b"p"))
    h.send(W, p.Close())
    h.send(R2, p.Read(10, 0))
    assert h.replies(R) == [p.ReadTimeout(), p.ReadFailed("pipe closed by client"), p.CloseOk()]
    assert h.replies(R2) == [p.InputOk(), p.ReadEnd()]


def test_close_fails_every_queued_request_then_closes(h):
    open_pair(h)
    h.send(R, p.Read(10, 0))
    h.send(R, p.Read(10, 0))
    h.send(R, p.Read(10, 0))
    h.send(R, p.Close())
    failed = p.ReadFailed("pipe closed by client")
    assert h.replies(R) == [failed, failed, failed, p.CloseOk()]


def test_writer_gets_no_readers_when_its_readers_leave(h):
    open_pair(h)
    h.send(W, p.Write(b"x", 0))
    h.send(R, p.Close())
    h.send(W, p.Write(b"y", 0))
    assert h.replies(W) == [p.WriteOk(), p.WriteFailed("no readers")]


def test_backpressure_makes_write_wait_not_grow():
    h = Harness(capacity=8)
    open_pair(h)
    for _ in range(5):
        h.send(W, p.Write(b"12345", 0))
    assert h.replies(W) == [p.WriteOk(), p.WriteOk()]  # 10 bytes buffered, the rest queue
    assert h.server.pipes.buffered_bytes() == 10
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"1234512345")]
    assert h.replies(W) == [p.WriteOk(), p.WriteOk()]


def test_answers_to_requests_that_waited_are_marked_to_go_first():
    """A WRITE that wakes a waiting READ: the READ_OK it woke is marked ``wakes`` (the I/O
    writes its connection first), the WRITE_OK that answers at once is not; a WRITE that
    waited for room and a READ that made the room: the other way round."""
    from zbroker.services.zpipes.actions import Reply

    server = ZpipesServer(ServerConfig(capacity=4))
    now = 100.0
    for client, msg in ((R, p.Input(b"p")), (W, p.Output(b"p")), (R, p.Read(10, 1000))):
        server.receive(client, [p.encode(msg)], now)
    server.take_output()
    server.receive(W, [p.encode(p.Write(b"line", 1000))], now)
    answers = [(a.routing_id, type(p.decode(a.frame)), a.wakes) for a in server.take_output()
               if type(a) is Reply]
    assert answers == [(W, p.WriteOk, False), (R, p.ReadOk, True)]
    server.receive(W, [p.encode(p.Write(b"more", 1000))], now)
    server.receive(W, [p.encode(p.Write(b"full", 1000))], now)  # no room: it waits
    server.take_output()
    server.receive(R, [p.encode(p.Read(4, 1000))], now)
    answers = [(a.routing_id, type(p.decode(a.frame)), a.wakes) for a in server.take_output()
               if type(a) is Reply]
    assert answers == [(R, p.ReadOk, False), (W, p.WriteOk, True)]


def test_read_of_zero_bytes_answers_empty_at_once(h):
    open_pair(h)
    h.send(R, p.Read(0, 0))
    assert h.replies(R) == [p.ReadOk(b"")]


@pytest.mark.parametrize(
    ("name", "reason"),
    [(b"", "pipe name is empty"), (b"\xff\xfe", "pipe name is not valid UTF-8")],
)
def test_bad_pipe_names_are_refused(h, name, reason):
    h.send(R, p.Input(name))
    h.send(W, p.Output(name))
    assert h.replies(R) == [p.InputFailed(reason)]
    assert h.replies(W) == [p.OutputFailed(reason)]
    h.send(R, p.Input("ünïcode ✓".encode()))
    assert h.replies(R) == [p.InputOk()]


def test_second_open_on_one_connection_is_invalid_and_detaches(h):
    h.send(R, p.Input(b"p"))
    h.send(R, p.Input(b"q"))
    assert h.replies(R) == [p.InputOk(), p.Invalid()]
    assert h.server.pipes.pipes == {}


def test_close_without_an_open_pipe_is_invalid_like_the_original(h):
    h.send(R, p.Close())
    assert h.replies(R) == [p.Invalid()]


# --- heartbeats, expiry, limits, shutdown ---------------------------------------------------------


def test_silent_idle_reader_expires_and_its_writer_learns_no_readers():
    h = Harness(client_timeout=2.0)
    open_pair(h)
    h.send(W, p.Write(b"started", 0))
    h.send(R, p.Read(10, 0))
    assert h.replies(R) == [p.ReadOk(b"started")]
    for _ in range(6):  # the writer keeps talking; the reader, holding nothing, is silent
        h.advance(0.5)
        h.send(W, p.Ping())
    assert R not in h.server.clients
    assert h.replies(R) == []  # an expired client gets nothing: it is not listening
    h.send(W, p.Write(b"x", 0))
    assert h.replies(W)[-1] == p.WriteFailed("no readers")


def test_client_with_a_held_request_is_never_expired():
    """An original client never PINGs: it sends one request and waits. While the broker holds
    that request (a READ waiting for data, a WRITE held by flow control) the client is waiting
    for us, not silent: it is not expired however long it waits, and its silence counts from
    our answer."""
    h = Harness(client_timeout=1.0, capacity=4)
    R1, W1 = b"waiting reader", b"late writer"
    h.send(R1, p.Input(b"a"))
    h.send(R1, p.Read(100, 0))  # no writer yet: the READ waits
    open_pair(h, b"b")
    h.send(W, p.Write(b"abcd", 0))
    h.send(W, p.Write(b"efgh", 0))  # held: the reader holds its capacity
    assert h.replies(W) == [p.WriteOk()]
    for _ in range(10):  # 5 s: only the slow reader of "b" says anything
        h.advance(0.5)
        h.send(R, p.Ping())
    assert R1 in h.server.clients and W in h.server.clients
    h.send(R, p.Read(100, 0))
    assert h.replies(W) == [p.WriteOk()]  # the held WRITE completes: nothing lost
    h.send(R, p.Read(100, 0))
    assert h.replies(R)[-2:] == [p.ReadOk(b"abcd"), p.ReadOk(b"efgh")]
    h.send(W1, p.Output(b"a"))
    h.send(W1, p.Write(b"at last", 0))
    assert h.replies(R1) == [p.InputOk(), p.ReadOk(b"at last")]
    # from our answer on, its silence counts again
    h.advance(0.6)
    assert R1 in h.server.clients
    h.advance(0.6)
    assert R1 not in h.server.clients


def test_silent_writer_expires_and_its_readers_fail_after_its_data():
    h = Harness(client_timeout=1.0)
    open_pair(h)
    h.send(W, p.Write(b"partial", 0))
    assert h.replies(W) == [p.WriteOk()]
    for _ in range(4):
        h.advance(0.5)
        h.send(R, p.Ping())
    assert W not in h.server.clients
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.PingOk()] * 4 + [
        p.ReadOk(b"partial"), p.ReadFailed("writer lost: expired"),
        p.ReadFailed("writer lost: expired")]


@pytest.mark.parametrize("how", ["disconnected", "unreachable"])
def test_a_writer_gone_without_close_fails_its_readers_after_its_data(h, how):
    open_pair(h)
    h.send(R, p.Read(3, 0))
    h.send(W, p.Write(b"abcdef", 0))
    assert h.replies(R) == [p.ReadOk(b"abc")] and h.replies(W) == [p.WriteOk()]
    getattr(h.server, how)(W, h.now)
    assert W not in h.server.clients and h.replies(W) == []
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"def"), p.ReadFailed("writer lost: disconnected")]


def test_a_pending_read_fails_when_the_writer_is_lost(h):
    open_pair(h)
    h.send(W, p.Write(b"x", 0))
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))  # waiting
    assert h.replies(R) == [p.ReadOk(b"x")]
    h.server.disconnected(W, h.now)
    assert h.replies(R) == [p.ReadFailed("writer lost: disconnected")]


def test_a_writer_lost_before_writing_breaks_nothing(h):
    open_pair(h)
    h.server.disconnected(W, h.now)
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == []  # still waiting for a writer: no stream was cut
    h.send(W2, p.Output(b"p"))
    h.send(W2, p.Write(b"whole", 0))
    h.send(W2, p.Close())
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"whole"), p.ReadEnd()]


def test_end_of_stream_only_when_every_writer_of_the_stream_closed(h):
    open_pair(h)
    h.send(W2, p.Output(b"p"))
    h.send(W, p.Write(b"one", 0))
    h.send(W2, p.Write(b"two", 0))
    h.send(W, p.Close())  # one writer closes...
    h.server.disconnected(W2, h.now)  # ...the other is lost
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"onetwo"), p.ReadFailed("writer lost: disconnected")]


def test_a_reader_cut_by_one_writer_takes_nothing_more_from_the_others(h):
    """Once a reader's stream is broken it is out of every writer's audience: a writer whose
    only reader it was learns "no readers" rather than a WRITE_OK for data nobody will read."""
    open_pair(h)
    h.send(W2, p.Output(b"p"))
    h.send(W, p.Write(b"a", 0))
    h.send(W2, p.Write(b"b", 0))
    h.replies(W2)
    h.server.disconnected(W, h.now)
    h.send(W2, p.Write(b"c", 0))
    assert h.replies(W2) == [p.WriteFailed("no readers")]
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"ab"), p.ReadFailed("writer lost: disconnected")]


def test_an_invalid_command_from_a_writer_cuts_its_stream(h):
    open_pair(h)
    h.send(W, p.Write(b"x", 0))
    h.send(W, p.Read(1, 0))  # not a writer's command
    assert h.replies(W) == [p.WriteOk(), p.Invalid()]
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"x"), p.ReadFailed("writer lost: invalid command")]


def test_a_disconnected_last_reader_fails_a_held_write_with_no_readers():
    h = Harness(capacity=2)
    open_pair(h)
    h.send(W, p.Write(b"ab", 0))
    h.send(W, p.Write(b"cd", 0))  # held: the reader holds its capacity
    assert h.replies(W) == [p.WriteOk()]
    h.server.disconnected(R, h.now)
    assert h.replies(W) == [p.WriteFailed("no readers")]


def test_an_over_size_write_is_refused_with_the_limit_and_cuts_the_stream():
    h = Harness(max_chunk=8)
    open_pair(h)
    h.send(W, p.Write(b"12345678", 0))
    h.send(W, p.Write(b"123456789", 0))
    h.send(W, p.Write(b"1", 0))
    reason = "chunk of 9 bytes is over the broker's limit of 8 bytes (max_chunk)"
    assert h.replies(W) == [p.WriteOk(), p.WriteFailed(reason), p.WriteFailed(reason)]
    h.send(W, p.Close())  # a close after a broken stream does not make it whole
    assert h.replies(W) == [p.CloseOk()]
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"12345678"), p.ReadFailed("writer lost: " + reason)]


def test_the_only_writer_refused_before_its_first_byte_fails_its_readers():
    """A reader whose pipe's only writer was refused before its first byte waited for ever
    (its stream had not begun, so nobody was its audience)."""
    h = Harness(max_chunk=8)
    open_pair(h)
    h.send(R, p.Read(100, 0))
    h.send(W, p.Write(b"123456789", 0))
    reason = "chunk of 9 bytes is over the broker's limit of 8 bytes (max_chunk)"
    assert h.replies(W) == [p.WriteFailed(reason)]
    assert h.replies(R) == [p.ReadFailed("writer lost: " + reason)]


def test_a_withheld_write_is_refused_in_its_turn_and_holds_nothing_meanwhile():
    """A WRITE that the transport let go as it arrived (over max_chunk) is refused like one that
    arrived whole, after the requests before it, and counts for nothing while it waits."""
    h = Harness(max_chunk=8, capacity=8)
    open_pair(h)
    h.send(W, p.Write(b"12345678", 0))
    h.send(W, p.Write(b"abcdefgh", 0))  # waits for room: the reader holds its capacity
    h.server.receive_withheld_write(W, 1 << 30, h.now)  # queued behind it
    assert h.replies(W) == [p.WriteOk()]
    assert h.server.held == 8 and h.server.clients[W].queued_bytes == 0
    h.send(R, p.Read(100, 0))
    reason = f"chunk of {1 << 30} bytes is over the broker's limit of 8 bytes (max_chunk)"
    assert h.replies(W) == [p.WriteOk(), p.WriteFailed(reason)]
    assert h.server.held == 0
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"12345678"), p.ReadOk(b"abcdefgh"),
                            p.ReadFailed("writer lost: " + reason)]


def test_any_traffic_counts_as_liveness():
    h = Harness(client_timeout=1.0)
    open_pair(h)
    for _ in range(10):
        h.advance(0.5)
        h.send(R, p.Ping())
        h.send(W, p.Write(b"x", 0))
    assert R in h.server.clients and W in h.server.clients


def test_unreachable_client_is_cleaned_up(h):
    open_pair(h)
    h.server.unreachable(R, h.now)
    assert h.replies(R) == []
    assert R not in h.server.clients
    h.send(W, p.Write(b"x", 0))
    h.advance(0.01)
    assert h.replies(W) == [p.WriteOk()] or h.server.pipes.pipes[b"p"].readers == {}


def test_pipelining_is_bounded():
    h = Harness(max_pipelined=3)
    open_pair(h)
    for _ in range(6):
        h.send(R, p.Read(1, 0))
    assert h.replies(R) == [p.ReadFailed("too many pipelined requests")] * 2


def test_pipelined_write_bytes_are_bounded():
    h = Harness(max_pipelined_bytes=10, capacity=1)
    h.send(W, p.Output(b"p"))
    for _ in range(4):
        h.send(W, p.Write(b"123456", 0))
    # the third WRITE is refused; its stream has lost that chunk, so it is cut: the waiting
    # and the queued WRITE fail too, and so does every later one
    assert h.replies(W) == [p.OutputOk()] + [p.WriteFailed("too many pipelined requests")] * 4


def test_the_broker_wide_buffer_budget_refuses_writes_past_it_and_cuts_their_stream():
    """Writers with no reader hold their WRITEs; past services.zpipes.max_buffered a WRITE is
    refused with the reason, and the budget is given back when the holders go."""
    h = Harness(max_buffered=12)
    hogs = [b"hog%d" % i for i in range(3)]
    for hog in hogs:
        h.send(hog, p.Output(b"nobody reads"))
        h.send(hog, p.Write(b"123456", 0))  # waits for a reader, holding 6 bytes
    reason = ("the broker's buffers for all clients are full (services.zpipes.max_buffered, "
              "12 bytes)")
    assert h.replies(hogs[0]) == [p.OutputOk()]
    assert h.replies(hogs[1]) == [p.OutputOk()]  # 12 held: at the budget, not past it
    assert h.replies(hogs[2]) == [p.OutputOk(), p.WriteFailed(reason)]
    assert h.server.held == 12
    for hog in hogs:
        h.server.disconnected(hog, h.now)
    assert h.server.held == 0
    open_pair(h)
    h.send(W, p.Write(b"0123456789", 0))
    assert h.replies(W) == [p.WriteOk()]  # the budget came back
    assert h.server.pipes.buffered == 10
    h.send(W, p.Write(b"xyz", 0))
    assert h.replies(W) == [p.WriteFailed(reason)]  # what readers have not read counts too
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"0123456789"), p.ReadFailed("writer lost: " + reason)]
    assert h.server.pipes.buffered == 0


def test_answers_not_yet_taken_by_their_readers_count_in_the_budget():
    """What the I/O layer holds for readers that do not take their answers (it says how
    much, when asked) counts as pipe data does: a WRITE past the budget is refused."""
    h = Harness(max_buffered=12)
    unsent = [8]

    class Unsent(NoOutside):
        def unsent_bytes(self) -> int:
            return unsent[0]

    h.server.outside = Unsent()
    open_pair(h)
    h.send(W, p.Write(b"1234", 0))
    assert h.replies(W) == [p.WriteOk()]  # 8 + 4: at the budget
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"1234")]
    unsent[0] = 12  # that answer waits in the reader's connection too
    h.send(W, p.Write(b"x", 0))
    reason = ("the broker's buffers for all clients are full (services.zpipes.max_buffered, "
              "12 bytes)")
    assert h.replies(W) == [p.WriteFailed(reason)]
    # counted by its kind, given where the failure was made; the reader it broke, by its own
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadFailed("writer lost: " + reason)]
    assert h.server.engine.ends_failed == {("writer", "buffers_full"): 1,
                                           ("reader", "writer_lost"): 1}


def test_client_limit():
    h = Harness(max_clients=1)
    h.send(R, p.Input(b"p"))
    h.send(W, p.Output(b"p"))
    h.send(W2, p.Ping())
    assert h.replies(W) == [p.OutputFailed("too many clients")]
    assert h.replies(W2) == [p.PingOk()]


def test_shutdown_answers_pending_requests(h):
    open_pair(h)
    h.send(R, p.Read(10, 0))
    h.send(W2, p.Output(b"q"))
    h.send(W2, p.Write(b"x", 0))
    h.server.shutdown(h.now)
    assert h.replies(R) == [p.ReadFailed("broker stopping")]
    assert h.replies(W2)[-1] == p.WriteFailed("broker stopping")
    assert h.server.clients == {} and h.server.pipes.pipes == {}


def test_animate_traces_every_transition():
    lines = []

    class Log:
        def info(self, event, **kw):
            if event == "animate":
                lines.append(kw)

        debug = warning = error = info

    server = ZpipesServer(ServerConfig(animate=True), Log())
    server.receive(R, [p.encode(p.Input(b"p"))], 0.0)
    assert [(t["state"], t["on"], t["next"]) for t in lines] == [
        ("start", "INPUT", "before reading"), ("before reading", "ok", "reading")]
    assert lines[0]["actions"] == ["open pipe reader"] and lines[0]["pipe"] is None


# --- the table itself ---------------------------------------------------------------------------


def test_every_state_has_an_answer_for_every_command():
    for state in State:
        for event in COMMANDS:
            if state in (State.BEFORE_READING, State.BEFORE_WRITING):
                continue  # transient: commands are never taken there
            rule = rule_for(state, event)
            assert rule.next in State
    assert set(UNEXPECTED) == {State.START, State.READING, State.WRITING}


def test_every_action_in_the_table_is_implemented():
    server = ZpipesServer()
    for rules in [*TABLE.values()]:
        for rule in rules.values():
            for action in rule.actions:
                assert action in server.engine.actions
    for rule in UNEXPECTED.values():
        for action in rule.actions:
            assert action in server.engine.actions


def test_stale_internal_events_change_nothing():
    assert rule_for(State.START, Event.TIMEOUT).actions == ()
    assert rule_for(State.READING, Event.PIPE_CHANGED).next is State.READING


def test_timers_of_answered_requests_do_not_accumulate(h):
    open_pair(h)
    for _ in range(5000):  # each READ waits (arming a 1-hour timer), then data answers it
        h.send(R, p.Read(10, 3_600_000))
        h.send(W, p.Write(b"x", 0))
    h.replies(R)
    assert len(h.server.engine.timers.entries) <= 1024 + 4 * len(h.server.clients) + 1
    h.send(R, p.Read(10, 100))  # timeouts still work after compaction
    h.advance(0.1)
    assert h.replies(R) == [p.ReadTimeout()]


def test_raising_the_capacity_wakes_a_writer_waiting_for_room():
    """Found by 20 SIGHUPs alternating the capacity: a writer that waited under the old,
    smaller capacity must not sleep on once its reader drains under the new one."""
    h = Harness(capacity=4)
    open_pair(h)
    h.send(W, p.Write(b"1234", 0))
    h.send(W, p.Write(b"5678", 0))  # waits: the reader holds 4 of 4
    assert h.replies(W) == [p.WriteOk()]
    h.server.reconfigure(ServerConfig(capacity=100))
    assert h.replies(W) == [p.WriteOk()]  # room now: accepted without any read
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"12345678")]


def test_close_with_a_write_pending_cuts_the_stream():
    """A CLOSE that drops a WRITE the writer sent does not end the stream as complete."""
    h = Harness(capacity=2)
    open_pair(h)
    h.send(W, p.Write(b"ab", 0))
    h.send(W, p.Write(b"cd", 0))  # held: the reader holds its capacity
    h.send(W, p.Close())
    assert h.replies(W) == [p.WriteOk(), p.WriteFailed("pipe closed by client"), p.CloseOk()]
    h.send(R, p.Read(100, 0))
    h.send(R, p.Read(100, 0))
    assert h.replies(R) == [p.ReadOk(b"ab"),
                            p.ReadFailed("writer lost: closed with a WRITE pending")]


def test_close_with_a_write_waiting_for_a_first_reader_cuts_nothing(h):
    """The original's selftest: WRITE with no reader, then CLOSE: no stream had started."""
    h.send(W, p.Output(b"alone"))
    h.send(W, p.Write(b"x", 0))
    h.send(W, p.Close())
    assert h.replies(W) == [p.OutputOk(), p.WriteFailed("pipe closed by client"), p.CloseOk()]
    h.send(R, p.Input(b"alone"))
    h.send(R, p.Read(1, 100))
    h.advance(0.2)
    assert h.replies(R) == [p.InputOk(), p.ReadTimeout()]
