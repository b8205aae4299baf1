"""The broker's ZPIPES endpoint as libzmq clients and raw sockets see it: ROUTER routing ids,
tcp connections (keepalive), ZMTP heartbeats, peers that do not speak ZMTP, endpoints it
cannot serve, a slow reader of replies, and over-size WRITEs answered as their head arrives."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import zmq
from helpers import free_port, rss_bytes, run_zbroker, socket_address, wait_for, write_config
from pipe_stream import lockstep
from wire import (
    CLOSE_OK,
    INPUT_OK,
    OUTPUT_OK,
    PING_OK,
    READ_FAILED,
    READ_OK,
    WRITE_FAILED,
    WRITE_OK,
    RawClient,
    close,
    input_,
    output,
    parse,
    ping,
    read,
    write,
)

from zbroker import zmtp
from zpipes import zmtp as plain_zmtp

KiB, MiB = 1 << 10, 1 << 20


def _client(ctx: zmq.Context, endpoint: str, routing_id: bytes | None = None,
            **options: int) -> RawClient:
    c = RawClient.__new__(RawClient)
    c.sock = ctx.socket(zmq.DEALER)
    c.sock.setsockopt(zmq.LINGER, 1000)
    c.sock.setsockopt(zmq.RCVTIMEO, 5000)
    if routing_id is not None:
        c.sock.setsockopt(zmq.ROUTING_ID, routing_id)
    for name, value in options.items():
        c.sock.setsockopt(getattr(zmq, name), value)
    c.sock.connect(endpoint)
    return c


def test_clients_that_ask_for_the_same_routing_id_are_all_served(broker, ctx):
    """A ROUTER gives a peer the routing id it asks for while that is free, and one of its own
    otherwise: the second client that asks for a taken id is served all the same."""
    reader = _client(ctx, broker.endpoint, b"same")
    writer = _client(ctx, broker.endpoint, b"same")
    try:
        assert reader.call(input_(b"ids")) == (INPUT_OK, None)
        assert writer.call(output(b"ids")) == (OUTPUT_OK, None)
        assert writer.call(write(b"hello", 0)) == (WRITE_OK, None)
        assert reader.call(read(100, 0)) == (READ_OK, b"hello")
        assert writer.call(close()) == (CLOSE_OK, None)
        assert reader.call(close()) == (CLOSE_OK, None)
    finally:
        reader.close()
        writer.close()


def _keepalive_on_accepted(port: int) -> bool:
    """Whether the broker's end of a connection to ``port`` has its keepalive timer running
    (/proc/net/tcp: the local port, state ESTABLISHED, timer 2 once nothing is unacked)."""
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, state, timer = fields[1], fields[3], fields[5].split(":")[0]
            if int(local.split(":")[1], 16) == port and state == "01":
                return timer == "02"
    return False


def test_a_tcp_endpoint_serves_the_original_client_with_keepalive(start_broker, ctx):
    port = free_port()
    b = start_broker(config={"services": {"zpipes": {"endpoint": f"tcp://127.0.0.1:{port}"}}})
    lockstep(ctx, b.endpoint, b"over-tcp", 8, 64 * KiB)
    c = RawClient(ctx, b.endpoint)
    try:
        assert c.call(input_(b"keep")) == (INPUT_OK, None)
        wait_for(lambda: _keepalive_on_accepted(port), 5, "the keepalive timer to run")
    finally:
        c.close()


def test_a_heartbeating_client_is_answered_and_kept(broker, ctx):
    """A client that sends ZMTP PINGs (libzmq's ZMQ_HEARTBEAT_*) gets PONGs: it stays
    connected, and its end with it, across a silence longer than its heartbeat timeout."""
    reader = _client(ctx, broker.endpoint, HEARTBEAT_IVL=50, HEARTBEAT_TIMEOUT=200)
    writer = RawClient(ctx, broker.endpoint)
    try:
        assert reader.call(input_(b"beat")) == (INPUT_OK, None)
        assert writer.call(output(b"beat")) == (OUTPUT_OK, None)
        time.sleep(1.0)  # silent for five times its heartbeat timeout (200 ms)
        assert writer.call(write(b"still here", 0)) == (WRITE_OK, None)
        assert reader.call(read(100, 0)) == (READ_OK, b"still here")
    finally:
        reader.close()
        writer.close()


def test_a_peer_that_does_not_speak_zmtp_is_dropped_and_others_go_on(broker, ctx):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect("\0" + broker.endpoint.removeprefix("ipc://@"))
    try:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        got = b""
        while True:  # what the broker says (its greeting), then the end of the connection
            data = s.recv(4096)
            if not data:
                break
            got += data
    finally:
        s.close()
    lockstep(ctx, broker.endpoint, b"after-garbage", 4)


def test_an_inproc_endpoint_is_refused_when_the_config_is_read(tmp_path):
    cfg = write_config(tmp_path / "zbroker.cfg",
                       {"services": {"zpipes": {"endpoint": "inproc://zpipes-{name}"}}})
    r = run_zbroker(["inproc-test", "--config", str(cfg)], cwd=tmp_path)
    assert r.returncode != 0
    assert "services.zpipes.endpoint: got 'inproc://zpipes-{name}'" in r.stderr
    assert "(transport tcp, ipc)" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_reader_that_does_not_take_its_replies_cannot_grow_the_broker(broker, ctx):
    """A reader that keeps asking for data but stops taking it: once a few MiB of replies wait
    on its connection, the broker stops reading its requests until it takes them, so it holds
    that much for it, not the writer's stream; the reader gets all of it when it reads again."""
    reader = _client(ctx, broker.endpoint, RCVHWM=1, SNDTIMEO=100)
    writer = RawClient(ctx, broker.endpoint)
    chunk = b"r" * MiB
    try:
        assert reader.call(input_(b"slow")) == (INPUT_OK, None)
        assert writer.call(output(b"slow")) == (OUTPUT_OK, None)
        before = rss_bytes(broker.pid)
        written = 0
        for _ in range(64):  # 64 MiB asked for and offered, while nothing is taken
            try:
                reader.send(read(MiB, 0))
            except zmq.Again:
                pass
            if writer.call(write(chunk, 100)) == (WRITE_OK, None):
                written += MiB
        grown = rss_bytes(broker.pid) - before
        assert grown < 32 * MiB, f"the broker grew by {grown >> 20} MiB"
        got = 0
        while got < written:
            kind, data = reader.recv()
            assert kind == READ_OK
            got += len(data)
            try:
                reader.send(read(MiB, 0))
            except zmq.Again:
                pass
        assert got == written
    finally:
        reader.close()
        writer.close()


class HandDealer:
    """A DEALER written by hand (ZMTP 3.0, NULL) on a Unix socket: it sends what libzmq would,
    but it can send a frame in parts, and wait in between."""

    def __init__(self, endpoint: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(5)
        self.sock.connect("\0" + endpoint.removeprefix("ipc://@"))
        self.sock.sendall(zmtp.SIGNATURE + bytes((3, 0)) + b"NULL".ljust(20, b"\0")
                          + bytes(32))
        self._exactly(64)  # the broker's greeting
        self.sock.sendall(zmtp.ready_command(b"DEALER"))
        flags, _ = self._frame()  # its READY
        assert flags & zmtp.COMMAND

    def message(self, frame: bytes) -> bytes:
        return zmtp.encode_message([frame])

    def call(self, frame: bytes) -> tuple[int, bytes | str | None]:
        self.sock.sendall(self.message(frame))
        return self.recv()

    def recv(self) -> tuple[int, bytes | str | None]:
        flags, body = self._frame()
        assert not flags & (zmtp.MORE | zmtp.COMMAND)
        return parse(body)

    def _frame(self) -> tuple[int, bytes]:
        flags = self._exactly(1)[0]
        size = (int.from_bytes(self._exactly(8), "big") if flags & zmtp.LONG
                else self._exactly(1)[0])
        return flags, self._exactly(size)

    def _exactly(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            data = self.sock.recv(n - len(got))
            assert data, "the broker closed the connection"
            got += data
        return got


def test_an_over_size_write_is_refused_as_its_head_arrives(start_broker, ctx):
    """A WRITE over max_chunk is answered WRITE_FAILED (naming the limit) once its head has
    come, before the rest of its chunk is even sent; the rest is let go as it comes, and the
    connection goes on in step. The reader gets what came before it, then the reason."""
    b = start_broker(config={"services": {"zpipes": {"max_chunk": "1MiB"}}})
    reader, writer = RawClient(ctx, b.endpoint), HandDealer(b.endpoint)
    try:
        assert reader.call(input_(b"head")) == (INPUT_OK, None)
        assert writer.call(output(b"head")) == (OUTPUT_OK, None)
        assert writer.call(write(b"a" * 1000, 0)) == (WRITE_OK, None)
        size = MiB + MiB // 2
        big = writer.message(write(b"b" * size, 0))
        writer.sock.sendall(big[:64 * KiB])
        reason = f"chunk of {size} bytes is over the broker's limit of {MiB} bytes (max_chunk)"
        assert writer.recv() == (WRITE_FAILED, reason)
        writer.sock.sendall(big[64 * KiB:])
        assert writer.call(close()) == (CLOSE_OK, None)
        assert reader.call(read(MiB, 0)) == (READ_OK, b"a" * 1000)
        assert reader.call(read(MiB, 0)) == (READ_FAILED, "writer lost: " + reason)
    finally:
        reader.close()
        writer.sock.close()


def test_a_raised_max_chunk_applies_to_connections_already_open(start_broker, ctx):
    b = start_broker(config={"services": {"zpipes": {"max_chunk": "64KiB"}}})
    reader, writer = RawClient(ctx, b.endpoint), RawClient(ctx, b.endpoint)
    try:
        assert reader.call(input_(b"raised")) == (INPUT_OK, None)
        assert writer.call(output(b"raised")) == (OUTPUT_OK, None)
        r = run_zbroker(["set", "services.zpipes.max_chunk", "1MiB", b.name], cwd=b.dir)
        assert r.returncode == 0, r.stderr
        data = b"m" * (200 * KiB)  # over twice the old limit: it dropped the connection
        assert writer.call(write(data, 0)) == (WRITE_OK, None)
        assert reader.call(read(MiB, 0)) == (READ_OK, data)
    finally:
        reader.close()
        writer.close()


def test_a_connection_that_never_says_hello_is_dropped_and_frees_its_place(start_broker, ctx):
    """A connection that does not finish the ZMTP handshake within its timeout is closed, so
    that silent connections cannot keep the places of clients (clients.max_clients)."""
    from zbroker.zmtp.admission import HANDSHAKE_TIMEOUT_S

    b = start_broker(config={"clients": {"max_clients": 2, "max_per_source": 2}})
    silent = [socket.socket(socket.AF_UNIX) for _ in range(2)]
    try:
        for s in silent:
            s.settimeout(HANDSHAKE_TIMEOUT_S + 10)
            s.connect("\0" + b.endpoint.removeprefix("ipc://@"))
        t = time.monotonic()
        for s in silent:
            while s.recv(4096):  # the broker's greeting, then the end of the connection
                pass
        assert time.monotonic() - t >= HANDSHAKE_TIMEOUT_S - 1
        lockstep(ctx, b.endpoint, b"after-silence", 4)
    finally:
        for s in silent:
            s.close()


def test_an_ipc_endpoint_in_the_file_system_is_taken_over_from_a_dead_broker_only(
        start_broker, ctx, tmp_path):
    """A socket file left by a broker that died is replaced; one that a live broker serves is
    not taken, the second broker says why; a broker that stops removes its file."""
    path = tmp_path / "zpipes.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed broker leaves
    config = {"services": {"zpipes": {"endpoint": f"ipc://{path}"}}}
    b = start_broker(config=config)
    lockstep(ctx, b.endpoint, b"file", 4)
    second = start_broker(config=config, wait=False)
    assert second.wait() != 0
    assert "in use" in second.stderr()
    lockstep(ctx, b.endpoint, b"still", 4)
    b.send_signal(15)
    assert b.wait() == 0
    assert not path.exists()


@contextlib.contextmanager
def stalled_writes(endpoint: str, n: int, size: int, sent: int) -> Iterator[list]:
    """``n`` connections each send the first ``sent`` bytes of a WRITE of ``size`` and stall.
    Yields the answers that came (each waited for 0.3 s), all of them checked to be
    WRITE_FAILED naming the budget; the connections close after."""
    hogs = [HandDealer(endpoint) for _ in range(n)]
    refused = []
    try:
        for i, hog in enumerate(hogs):
            assert hog.call(output(b"stalled %d" % i)) == (OUTPUT_OK, None)
            hog.sock.sendall(hog.message(write(b"s" * size, 0))[:sent])
        for hog in hogs:
            hog.sock.settimeout(0.3)
            try:
                refused.append(hog.recv())
            except TimeoutError:
                pass
        assert all(kind == WRITE_FAILED and "services.zpipes.max_buffered" in reason
                   for kind, reason in refused), refused
        yield refused
    finally:
        for hog in hogs:
            hog.sock.close()


def assert_served_beside(ctx: zmq.Context, endpoint: str, size: int) -> None:
    reader, writer = RawClient(ctx, endpoint), RawClient(ctx, endpoint)
    try:
        assert reader.call(input_(b"beside")) == (INPUT_OK, None)
        assert writer.call(output(b"beside")) == (OUTPUT_OK, None)
        assert writer.call(write(b"w" * size, 0)) == (WRITE_OK, None)
        assert reader.call(read(size, 0)) == (READ_OK, b"w" * size)
    finally:
        reader.close()
        writer.close()


def test_writes_begun_and_never_finished_cannot_grow_the_broker_past_its_budget(start_broker,
                                                                               ctx):
    """30 connections each send the head of an 8 MiB WRITE and a little of its chunk, then
    stall (240 MiB announced, 30 KiB sent): what the broker holds for them counts in
    clients.max_buffered (32 MiB), so past it such WRITEs are refused as their head arrives
    (WRITE_FAILED, the budget's reason), the broker's memory stays bounded, and a writer
    with a small chunk beside them is still served once they go."""
    b = start_broker(config={"clients": {"max_buffered": "32MiB"}})
    before = rss_bytes(b.pid)
    with stalled_writes(b.endpoint, 30, 8 * MiB, KiB) as refused:
        assert 30 - len(refused) <= 5  # at most the budget's worth is held (and one)
        grown = rss_bytes(b.pid) - before
        assert grown < 64 * MiB, f"the broker grew by {grown >> 20} MiB"
    assert_served_beside(ctx, b.endpoint, MiB)


def test_writes_in_small_frames_begun_and_never_finished_are_refused_past_the_budget(
        start_broker, ctx):
    """The same with chunks under the size a frame is admitted at (DIRECT_MIN): 40
    connections each send 100 KiB of a 120 KiB WRITE and stall (4 MiB held against a budget
    of 2 MiB). Past the budget such a WRITE is refused at the read that finds it so
    (WRITE_FAILED, the budget's reason), what came of it let go: what the broker holds for
    them stays about the budget, and a writer beside them is served once they go."""
    from zbroker.services.zpipes.endpoint import DIRECT_MIN

    b = start_broker(config={"clients": {"max_buffered": "2MiB"}})
    size, sent = 120 * KiB, 100 * KiB
    assert size + 64 < DIRECT_MIN
    with stalled_writes(b.endpoint, 40, size, sent) as refused:
        held = 40 - len(refused)
        assert held * sent <= 2 * MiB + sent, f"{held} stalled WRITEs held past the budget"
    assert_served_beside(ctx, b.endpoint, 300 * KiB)


def _plain_link(endpoint: str) -> plain_zmtp.DealerLink:
    """A DEALER that speaks ZMTP on a plain socket in this process (no I/O thread): what the
    broker wrote to it is in its socket as the broker's write returns."""
    link = plain_zmtp.DealerLink(plain_zmtp.connect(*socket_address(endpoint), 5.0))
    link.handshake(5.0)
    return link


def _answer(link: plain_zmtp.DealerLink) -> tuple[int, object]:
    while not link.reader.frames:
        assert link.wait(5000), "no answer from the broker"
        link.receive()
        assert not link.eof
    return parse(bytes(link.reader.frames.popleft()))


def test_the_answer_a_waiting_reader_waits_for_is_written_before_the_writers(broker):
    """A WRITE that wakes a waiting READ: the broker writes the READ_OK before that WRITE's
    WRITE_OK (the reader is idle until its data comes), so once the writer has its WRITE_OK
    the reader's data is in the reader's socket already. Many times over: a broker that wrote
    them the other way round would be caught between its two writes some of the time."""
    reader, writer = _plain_link(broker.endpoint), _plain_link(broker.endpoint)
    try:
        reader.send(input_(b"order"))
        assert _answer(reader) == (INPUT_OK, None)
        writer.send(output(b"order"))
        assert _answer(writer) == (OUTPUT_OK, None)
        for i in range(300):
            line = b"line %d\n" % i
            reader.send(read(100, 0))
            reader.send(ping())  # answered at once: the READ before it is waiting
            assert _answer(reader) == (PING_OK, None)
            writer.send(write(line, 0))
            assert _answer(writer) == (WRITE_OK, None)
            reader.receive()  # without waiting: it is there, or the order was wrong
            assert reader.reader.frames, f"line {i}: the WRITE_OK came before the READ_OK"
            assert _answer(reader) == (READ_OK, line)
    finally:
        reader.close()
        writer.close()
