"""The consumers' endpoints of a pzq queue (send: a bound DEALER; credit: a bound ROUTER),
served over the queue's own ZMTP codec: a hostile consumer cannot make the queue hold a huge
message, consumers of libzmq 3.2 (ZMTP 2.0) and libzmq 4 are served as a libzmq DEALER serves
them, and a message its consumer ACKs before it is written is answered to its producer at
once. Real pzq processes, real sockets, a real disk."""

from __future__ import annotations

import socket
import struct
import time
import uuid

import zmq
from helpers import endpoint_accepts, free_port, wait_for
from pzq_helpers import dealer, recv, spawn_pzq, vm_kb, wait_counter

from pzq.client import Consumer, Producer
from zbroker import zmtp

FAST = ("--ack-timeout", "400000", "--reaper-frequency", "50000")
V3_GREETING = zmtp.SIGNATURE + bytes([3, 1]) + b"NULL".ljust(20, b"\0") + b"\0" * 32


def ready(socket_type: bytes, identity: bytes = b"") -> bytes:
    """A ZMTP 3 READY command, as libzmq sends it."""
    props = b""
    for name, value in ((b"Socket-Type", socket_type), (b"Identity", identity)):
        props += bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    return zmtp.command(b"READY", props)


def round_trip(q, credit: str, n: int = 10) -> None:
    """A legitimate producer's messages all reach the consumers of the two endpoints (at
    least once: one that waited past its ACK timeout in a consumer's buffer may come twice)."""
    tag = uuid.uuid4().hex.encode()
    want = {b"%s %d" % (tag, i) for i in range(n)}
    with Producer(q.receive, window=16) as p:
        for body in want:
            p.send(body)
        p.flush(10)
    got: set[bytes] = set()
    with Consumer(q.send) as c, Consumer(credit, credit=4) as cc:
        deadline = time.monotonic() + 10
        while not want <= got and time.monotonic() < deadline:
            for consumer in (c, cc):
                m = consumer.recv(0.05)
                if m is not None:
                    got.add(m.body)
                    consumer.ack(m)
    assert want <= got, (sorted(want - got), sorted(got))


def test_a_huge_message_from_a_consumer_is_let_go_as_it_arrives(start_pzq, ctx):
    """A consumer that sends 384 MiB in one multipart message (16 MiB frames, each under
    the frame limit libzmq was given) to the send and to the credit endpoint: the queue
    counts it as malformed as soon as it passes the limit and lets go of the rest as it
    comes, so it grows by a few MiB, not by the message (libzmq held each whole)."""
    credit = f"tcp://127.0.0.1:{free_port()}"
    q = start_pzq(*FAST, "--credit-dsn", credit)
    round_trip(q, credit)
    malformed = q.counters()["malformed"]
    base = vm_kb(q.pid, "VmHWM")
    big = zmq.Frame(b"B" * (16 << 20))
    for i, endpoint in enumerate((q.send, credit)):
        s = dealer(ctx, endpoint)
        s.setsockopt(zmq.SNDHWM, 0)
        s.send_multipart([b"key", *[big] * 24], copy=False)
        s.send_multipart([b"unknown key", b"1"])  # read once all of the above has come
        wait_counter(q, "unknown_acks", lambda n, i=i: n >= 1 + i, 60)
        s.close(linger=0)
    growth = (vm_kb(q.pid, "VmHWM") - base) << 10
    assert growth < 32 << 20, f"grew {growth >> 20} MiB for messages of 384 MiB"
    assert q.counters()["malformed"] == malformed + 2
    round_trip(q, credit)


def test_a_huge_request_to_the_monitor_or_stream_endpoint_is_let_go_as_it_arrives(
        start_pzq, ctx):
    """The same 384 MiB message as a MONITOR request and as a stream request: let go of as
    it arrives (the stream counts it as an error); both endpoints answer on."""
    q = start_pzq(*FAST, "--mode", "stream")
    with Producer(q.receive) as p:
        p.send(b"one")
        p.flush(5)
    base = vm_kb(q.pid, "VmHWM")
    big = zmq.Frame(b"B" * (16 << 20))
    mon = dealer(ctx, q.monitor)
    mon.setsockopt(zmq.SNDHWM, 0)
    mon.send_multipart([b"", b"MONITOR", *[big] * 24], copy=False)
    mon.send_multipart([b"", b"MONITOR"])  # answered once all of the above has come
    answer = recv(mon, 60)
    assert answer[0] == b"" and b"messages: 1" in answer[1], answer
    s = dealer(ctx, q.stream)
    s.setsockopt(zmq.SNDHWM, 0)
    s.send_multipart([b"", b"HEAD", *[big] * 24], copy=False)
    s.send_multipart([b"", b"HEAD"])  # answered once all of the above has come
    assert recv(s, 60) == [b"", b"OK", b"1", b"0"]
    growth = (vm_kb(q.pid, "VmHWM") - base) << 10
    assert growth < 32 << 20, f"grew {growth >> 20} MiB for messages of 384 MiB"
    c = q.counters()
    assert c["stream_errors"] == 1 and c["stream_requests"] == 2, c


def test_a_consumer_of_libzmq_3_2_speaking_zmtp2_gets_its_messages(start_pzq):
    """ZMTP 2.0: the queue's greeting says DEALER and ends with its (empty) identity, as
    libzmq's does; then messages are pushed and ACKs taken."""
    q = start_pzq(*FAST)
    host, port = q.send[len("tcp://"):].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(zmtp.SIGNATURE + b"\x01\x05" + b"\x00\x03old")  # ZMTP 2.0, DEALER, identity
    data = b""
    while len(data) < 14:
        chunk = sock.recv(65536)
        assert chunk, "the queue hung up"
        data += chunk
    assert data[:14] == zmtp.SIGNATURE + b"\x03\x05" + b"\x00\x00", data
    wait_counter(q, "consumers", lambda n: n == 1)
    with Producer(q.receive) as p:
        p.send([b"from", b"2013"])
        p.flush(5)
    conn = zmtp.Connection(100, 1 << 20)  # reads frames as our side would
    conn.receive_data(zmtp.SIGNATURE + b"\x01\x06" + b"\x00\x00")  # (a ROUTER's greeting)
    conn.next_events()
    conn.receive_data(data[14:])
    messages: list[list[bytes]] = []
    deadline = time.monotonic() + 10
    while not messages and time.monotonic() < deadline:
        messages = [e.frames for e in conn.next_events() if isinstance(e, zmtp.Message)]
        if not messages:
            conn.receive_data(sock.recv(65536))
    key, _sent, _timeout, empty, *body = messages[0]
    assert empty == b"" and body == [b"from", b"2013"], messages
    sock.sendall(zmtp.encode_message([key, b"1"]))
    wait_counter(q, "consumer_acks", lambda n: n == 1)
    assert q.counters()["messages"] == 0
    sock.close()
    wait_counter(q, "consumers", lambda n: n == 0)


def test_consumers_of_libzmq_4_dealer_and_router_take_turns(start_pzq, ctx):
    """Two consumers, a DEALER and a ROUTER (which sees the queue's routing id first):
    messages go to both; the count follows their connections."""
    q = start_pzq("--ack-timeout", "30000000")  # none comes twice
    a = dealer(ctx, q.send)
    b = dealer(ctx, q.send, zmq.ROUTER)
    wait_counter(q, "consumers", lambda n: n == 2)
    with Producer(q.receive, window=64) as p:
        for i in range(40):
            p.send(b"m%d" % i)
        p.flush(10)
    got: dict[str, list[bytes]] = {"dealer": [], "router": []}

    def take() -> bool:
        for name, s, skip in (("dealer", a, 0), ("router", b, 1)):
            while s.poll(0):
                frames = s.recv_multipart()
                s.send_multipart([*frames[:skip], frames[skip], b"1"])
                got[name].append(frames[skip + 4])
        return len(got["dealer"]) + len(got["router"]) == 40

    wait_for(take, 10, "40 messages")
    assert got["dealer"] and got["router"], got
    assert sorted(got["dealer"] + got["router"]) == sorted(b"m%d" % i for i in range(40))
    wait_counter(q, "messages", lambda n: n == 0)
    b.close(linger=0)
    wait_counter(q, "consumers", lambda n: n == 1)


def test_a_message_acked_before_it_is_written_is_answered_at_once(start_pzq, ctx):
    """With a sync window of 10 s, a lone message waits a tenth of it for its write. Its
    consumer ACKs it before that: the message will never be written (write avoidance), so
    its producer is answered "1" then, not when the write of its batch comes. The next,
    which nobody ACKs, waits for its write: after such an ACK the gathering grows (as it
    does while consumers keep up), up to a window after it."""
    q = start_pzq(*FAST, "--sync-window", "10000000")
    c = dealer(ctx, q.send)
    wait_counter(q, "consumers", lambda n: n == 1)
    p = dealer(ctx, q.receive)
    t0 = time.monotonic()
    p.send_multipart([b"m1", b"", b"body"])
    delivered = recv(c, 5)
    assert delivered[4] == b"body"
    c.send_multipart([delivered[0], b"1"])
    assert recv(p, 3) == [b"m1", b"1", b""]
    assert time.monotonic() - t0 < 3
    c2 = wait_counter(q, "avoided_messages", lambda n: n == 1)
    assert c2["messages"] == 0 and c2["bytes_written"] == 0, c2
    # a message nobody ACKs still waits for its write
    p.send_multipart([b"m2", b"", b"body"])
    assert recv(c, 5)[4] == b"body"
    assert not p.poll(2000)
    assert recv(p, 20) == [b"m2", b"1", b""]


def test_what_a_credit_consumer_held_is_given_back_when_its_connection_closes(start_pzq):
    """With an ACK timeout of 60 s: a credit consumer takes its window and closes its
    connection without ACKing; another gets those messages at once, not a minute later."""
    credit = f"tcp://127.0.0.1:{free_port()}"
    q = start_pzq("--ack-timeout", "60000000", "--credit-dsn", credit)
    wait_for(lambda: endpoint_accepts(credit), 10, "the credit endpoint")
    with Producer(q.receive) as p:
        for i in range(3):
            p.send(b"m%d" % i)
        p.flush(5)
    first = Consumer(credit, credit=3)
    held = [first.recv(5) for _ in range(3)]
    assert None not in held
    first.close()
    wait_counter(q, "credit_consumers", lambda n: n == 0)
    with Consumer(credit, credit=3) as second:
        got = [second.recv(5) for _ in range(3)]
        assert None not in got
        assert sorted(m.body for m in got) == sorted(m.body for m in held)
        for m in got:
            second.ack(m)
    assert q.counters()["redelivered"] == 3


def test_a_consumer_that_breaks_the_protocol_is_hung_up_on(start_pzq, ctx):
    """Bytes that are not ZMTP on the send endpoint, a PUB socket's greeting on the credit
    endpoint: hung up on, logged, counted; the queue goes on serving its consumers."""
    credit = f"tcp://127.0.0.1:{free_port()}"
    q = start_pzq(*FAST, "--credit-dsn", credit)
    wait_for(lambda: endpoint_accepts(credit), 10, "the credit endpoint")
    for endpoint, data in ((q.send, b"GET / HTTP/1.1\r\n\r\n"),
                           (credit, V3_GREETING + ready(b"PUB"))):
        host, port = endpoint[len("tcp://"):].rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=10)
        raw.sendall(data)
        wait_for(lambda raw=raw: hung_up(raw), 10, "the hang up")
        raw.close()
    wait_counter(q, "consumers_hung_up", lambda n: n == 2)
    log = q.log()
    assert "pzq consumer connection refused" in log and "not a ZMTP 2.0 or 3.x peer" in log
    assert "a PUB socket cannot talk to a ROUTER" in log
    round_trip(q, credit)


def hung_up(raw: socket.socket) -> bool:
    """Whether the other side closed (what it sent before, its greeting, is read and let
    go)."""
    try:
        return raw.recv(1000) == b""
    except ConnectionResetError:
        return True


def test_the_dealer_side_of_the_codec_says_dealer_and_refuses_a_req():
    """Sans I/O: the DEALER side of the codec greets a ZMTP 3 peer with a READY that says
    DEALER, and refuses a REQ (which cannot talk to a DEALER)."""
    conn = zmtp.DealerConnection(16, 1 << 20)
    assert conn.data_to_send() == zmtp.SIGNATURE
    conn.receive_data(V3_GREETING + ready(b"ROUTER"))
    assert conn.next_events() == [zmtp.Ready(b"ROUTER", b"")]
    assert conn.data_to_send().endswith(zmtp.ready_command(b"DEALER"))
    req = zmtp.DealerConnection(16, 1 << 20)
    req.receive_data(zmtp.SIGNATURE + b"\x01\x03")  # ZMTP 2.0, REQ
    (closed,) = req.next_events()
    assert isinstance(closed, zmtp.Closed) and "REQ socket cannot talk to a DEALER" in (
        closed.reason)


def test_an_ipc_endpoint_file_of_a_live_queue_is_not_taken_over(start_pzq, tmp_path):
    """A second queue given the monitor socket file of a running one fails to start with the
    reason, and the first goes on answering there; once the first is SIGKILLed, its file is
    taken over by the next start."""
    from pzq.client import monitor

    path = f"ipc://{tmp_path}/shared.monitor"
    first = start_pzq(monitor_=path)
    second = spawn_pzq(tmp_path / "second", monitor_=path)
    try:
        assert second.proc.wait(timeout=30) != 0
    finally:
        second.kill()
    assert "monitor socket" in second.log_path.read_text()
    assert isinstance(monitor(path), dict)  # the first still answers there (else a timeout)
    first.proc.kill()
    first.proc.wait(timeout=10)
    third = start_pzq(monitor_=path, database=tmp_path / "third")
    assert isinstance(monitor(third.monitor), dict)
