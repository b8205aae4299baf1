"""pzq stream mode: HEAD / RANGE / COMMIT on a real ``pzq`` process over tcp on 127.0.0.1,
with a real disk and SIGKILL restarts (what a Spark stream reader relies on)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import zmq
from pzq_helpers import FakeStore, dealer, nothing, recv

from pzq import wire
from pzq.client import Producer, ProducerError, StreamConsumer, StreamError
from zbroker.services.pzq.core.queue import QueueCore
from zbroker.services.pzq.core.stream import Offsets, StreamCore
from zbroker.services.pzq.offsets_file import load_offsets, save_offsets

STREAM = ("--mode", "stream")


def produce(q, bodies, ctx) -> None:
    with Producer(q.receive, window=64, context=ctx) as p:
        p.sock.setsockopt(zmq.LINGER, 0)
        for b in bodies:
            p.send(b)
        p.flush(timeout=10)


def snapshot(messages):
    return [(m.offset, m.key, m.sent_us, m.frames) for m in messages]


# --- the wire, without a queue ---------------------------------------------------------------

@pytest.mark.parametrize("request_, reason", [
    ([], "Empty request"),
    ([b"NOPE"], "Unknown command 'NOPE'"),
    ([b"RANGE", b"5"], "RANGE takes"),
    ([b"RANGE", b"9", b"3"], "start 9 is past its end 3"),
    ([b"RANGE", b"a", b"3"], "RANGE start must be a decimal integer"),
    ([b"RANGE", b"0", b"3", b"0"], "at least 1"),
    ([b"HEAD", b"1"], "HEAD takes no argument"),
    ([b"COMMIT"], "COMMIT takes one argument"),
    ([b"COMMIT", b"-1"], "COMMIT end must be a decimal integer"),
    ([b"COMMIT", b"99999999999999999999"], "COMMIT end must be a decimal integer"),
    ([b"RANGE", b"BATCH"], "RANGE takes"),
    ([b"RANGE", b"0", b"3", b"BATCH", b"1"], "RANGE max bytes must be a decimal integer"),
    ([b"RANGE", b"0", b"3", b"1", b"1", b"1", b"BATCH"], "RANGE takes"),
])
def test_bad_requests_decode_to_a_reason(request_, reason):
    r = wire.decode_stream_request(request_)
    assert isinstance(r, wire.WireError) and reason in r.reason


def test_requests_decode_with_their_caps():
    r = wire.decode_stream_request([b"RANGE", b"3", b"9"])
    assert (r.start, r.end, r.max_bytes, r.max_messages) == (
        3, 9, wire.RANGE_MAX_BYTES, wire.RANGE_MAX_MESSAGES)
    r = wire.decode_stream_request([b"RANGE", b"3", b"9", b"%d" % (1 << 40), b"10000000"])
    assert (r.max_bytes, r.max_messages) == (wire.RANGE_BYTES_CAP, wire.RANGE_MESSAGES_CAP)
    assert wire.decode_stream_request([b"COMMIT", b"7"]).end == 7
    assert not wire.decode_stream_request([b"RANGE", b"3", b"9"]).batch
    r = wire.decode_stream_request([b"RANGE", b"3", b"9", b"100", b"5", b"BATCH"])
    assert r.batch and (r.start, r.end, r.max_bytes, r.max_messages) == (3, 9, 100, 5)
    r = wire.decode_stream_request([b"GROUP", b"g", b"RANGE", b"3", b"9", b"BATCH"])
    assert r.batch and r.group == "g" and r.max_bytes == wire.RANGE_MAX_BYTES
    env, req = wire.split_stream_request([b"id", b"", b"HEAD"])
    assert env == [b"id", b""] and req == [b"HEAD"]


# --- the core, without sockets -------------------------------------------------------------

def put(q, n, start=0):
    for i in range(start, start + n):
        q.produce(b"P", [b"id%d" % i, b"", b"body%d" % i], 1_000 + i)


def test_head_passes_only_durable_messages_and_failed_writes_leave_gaps():
    store = FakeStore()
    q = store.attach(QueueCore(stream=True))
    q.consumers_changed(1)
    put(q, 3)
    assert q.head == 0 and q.range(0, 10, 0, 1 << 20, 100) == (0, [])  # not durable yet
    q.batch_done(store.done(placed=(0, 1, 2)))
    put(q, 2, 3)
    q.batch_done(store.done(failed=(3, 4), error="store failed: disk full"))
    assert q.head == 3  # the failed ones at the top are not passed
    put(q, 1, 5)
    q.batch_done(store.done(placed=(5,)))
    assert q.head == 6
    nxt, got = q.range(0, 10, 0, 1 << 20, 100)
    assert nxt == 6 and [m.seq for m in got] == [0, 1, 2, 5]
    assert q.next_delivery(0, 0) is None  # nothing is pushed
    q.consumer_ack([got[0].key, b"1"])  # nor ACKed by a consumer
    assert 0 in q.messages and q.counters["unknown_acks"] == 1
    assert q.commit_below(3) == 3 and store.acked == [0, 1, 2]
    assert [m.seq for m in q.range(0, 10, 3, 1 << 20, 100)[1]] == [5]
    assert q.range(0, 2, 3, 1 << 20, 100) == (2, [])  # all committed: answered


def test_a_commit_is_answered_once_written_and_an_error_leaves_all_as_it_was():
    store = FakeStore()
    q = store.attach(QueueCore(stream=True))
    put(q, 5)
    q.batch_done(store.done(placed=tuple(range(5))))
    st = StreamCore(q, Offsets({"default": 0}))
    assert st.request([b"r", b"", b"COMMIT", b"3"]) is None
    assert st.request([b"r", b"", b"COMMIT", b"4"]) is None
    value = st.to_write()
    assert value.groups == {"default": 4} and st.to_write() is None  # one write at a time
    assert st.written(value, "commit failed: disk full") == [
        [b"r", b"", b"ERROR", b"commit failed: disk full"]] * 2
    assert st.committed == 0 and len(q.messages) == 5
    assert st.request([b"r", b"", b"COMMIT", b"2"]) is None
    assert st.written(st.to_write(), None) == [[b"r", b"", b"OK", b"5", b"2"]]
    assert st.committed == 2 and sorted(q.messages) == [2, 3, 4]
    assert st.request([b"r", b"", b"COMMIT", b"1"]) == [b"r", b"", b"OK", b"5", b"2"]


def test_a_batch_range_packs_the_messages_up_to_one_of_several_frames_which_comes_alone():
    store = FakeStore()
    q = store.attach(QueueCore(stream=True))
    put(q, 3)
    q.produce(b"P", [b"multi", b"", b"f1", b"f2"], 2_000)  # seq 3: two body frames
    put(q, 2, 4)
    q.batch_done(store.done(placed=tuple(range(6))))
    st = StreamCore(q, Offsets({"default": 0}))
    plain = st.request([b"r", b"", b"RANGE", b"0", b"9"])
    batch = st.request([b"r", b"", b"RANGE", b"0", b"9", b"BATCH"])
    assert batch[:8] == [b"r", b"", b"OK", b"6", b"0", b"3", b"3", wire.BATCH]  # next: 3
    values, got = wire.decode_stream_reply(batch[2:])
    assert values == [6, 0, 3, 3]
    _, expected = wire.decode_stream_reply(plain[2:])
    assert got == expected[:3]  # offsets, keys, times, bodies: as the plain answer gives them
    # from the message of two frames: it alone, answered as a plain RANGE answers it
    alone = st.request([b"r", b"", b"RANGE", b"3", b"9", b"BATCH"])
    assert alone == [b"r", b"", b"OK", b"6", b"0", b"4", b"1",
                     *wire.range_entry(3, q.messages[3].key, (b"f1", b"f2"))]
    rest = st.request([b"r", b"", b"GROUP", b"g", b"RANGE", b"4", b"9", b"BATCH"])
    assert rest is None  # a new group: made durably first
    rest = st.written(st.to_write(), None)[0]
    assert rest[:10] == [b"r", b"", b"OK", b"6", b"0", b"6", b"2", b"0", b"0", wire.BATCH]
    assert wire.decode_stream_reply(rest[2:], grouped=True)[1] == expected[4:]
    # nothing in range: the plain answer, no BATCH frame
    assert st.request([b"r", b"", b"RANGE", b"6", b"9", b"BATCH"]) == [
        b"r", b"", b"OK", b"6", b"0", b"6", b"0"]


def test_a_malformed_batch_range_reply_raises():
    good = [wire.STREAM_OK, b"9", b"0", b"9", b"2",
            *wire.range_batch([7, 8], [b"1|k7", b"2|k8"], [b"a", b"b"])]
    values, got = wire.decode_stream_reply(good)
    assert [(e.offset, e.key, e.sent_us, e.frames) for e in got] == [
        (7, b"1|k7", 1, (b"a",)), (8, b"2|k8", 2, (b"b",))]
    for bad in (good[:-1], good[:-2] + [b"x" * 8, good[-1]], good[:4] + [b"3"] + good[5:],
                good[:-1] + [b"\x02\0\0\0"]):
        with pytest.raises(ValueError, match="malformed RANGE BATCH reply"):
            wire.decode_stream_reply(bad)


def test_the_offsets_file(tmp_path):
    assert load_offsets(tmp_path) is None
    save_offsets(tmp_path, Offsets({"default": 42, "a": 7}, {"a": (3, 7)}, 5))
    assert load_offsets(tmp_path) == Offsets({"default": 42, "a": 7}, {"a": (3, 7)}, 5)
    (tmp_path / "stream-offsets").write_text('{"committed": 9}\n')  # an older version's
    assert load_offsets(tmp_path) == Offsets({"default": 9})
    for garbage in ("garbage", '{"groups": {"a": -1}}', '{"groups": []}', "[]"):
        (tmp_path / "stream-offsets").write_text(garbage)
        with pytest.raises(OSError, match="unreadable"):
            load_offsets(tmp_path)


# --- end to end ------------------------------------------------------------------------------

def test_head_and_repeatable_ranges(start_pzq, ctx):
    q = start_pzq(*STREAM)
    bodies = [b"m%03d" % i for i in range(200)]
    before = time.time() * 1e6
    produce(q, bodies, ctx)
    with StreamConsumer(q.stream, context=ctx) as s:
        assert s.offsets() == (200, 0)
        first = s.range(0, 200)
        assert first.next == 200 and (first.head, first.committed) == (200, 0)
        assert [m.offset for m in first.messages] == list(range(200))
        assert [m.body for m in first.messages] == bodies
        assert all(before - 60e6 < m.sent_us < time.time() * 1e6 + 60e6
                   for m in first.messages)
        assert snapshot(s.range(0, 200).messages) == snapshot(first.messages)
        # capped answers: at least one message, and where to go on
        one = s.range(10, 200, max_bytes=1)
        assert [m.offset for m in one.messages] == [10] and one.next == 11
        part = s.range(0, 200, max_messages=7)
        assert [m.offset for m in part.messages] == list(range(7)) and part.next == 7
        assert snapshot(s.read(0, 200, max_messages=13)) == snapshot(first.messages)
        # past the head: up to the head, nothing more
        r = s.range(150, 10_000)
        assert r.next == 200 and len(r.messages) == 50
        assert s.range(500, 600).messages == ()
    # a stream queue pushes nothing to ordinary consumers
    cons = dealer(ctx, q.send)
    assert nothing(cons, 0.5)
    c = q.counters()
    assert c["messages"] == 200 and c["delivered"] == 0 and c["stream_head"] == 200


def test_commit_is_durable_and_replay_after_sigkill_loses_nothing(start_pzq, ctx):
    q = start_pzq(*STREAM)
    produce(q, [b"a%03d" % i for i in range(300)], ctx)
    with StreamConsumer(q.stream, context=ctx) as s:
        before = snapshot(s.read(0, 300))
        assert s.commit(120) == 120
        assert s.commit(120) == 120  # again: the same answer, nothing changes
        assert s.commit(50) == 120  # below the committed offset: a no-op
        assert s.offsets() == (300, 120)
        assert snapshot(s.read(0, 300)) == before[120:]
    assert q.counters()["messages"] == 180
    q = q.restart()  # SIGKILL, same data
    with StreamConsumer(q.stream, context=ctx) as s:
        assert s.offsets() == (300, 120)
        after = s.range(0, 300)
        assert snapshot(after.messages) == before[120:]  # same offsets, keys, bodies
        assert after.committed == 120 and after.next == 300
        # new messages go on after the old offsets
        produce(q, [b"b%d" % i for i in range(10)], ctx)
        assert s.head() == 310
        assert [m.body for m in s.read(300, 310)] == [b"b%d" % i for i in range(10)]
        assert s.commit(310) == 310
    q = q.restart()
    with StreamConsumer(q.stream, context=ctx) as s:
        assert s.offsets() == (310, 310) and s.range(0, 310).messages == ()
        produce(q, [b"c"], ctx)
        assert [m.offset for m in s.read(0, 400)] == [310]
        assert s.commit(311) == 311
    # the segments of committed messages go; offsets still never go back
    q = q.restart()
    q = q.restart()
    with StreamConsumer(q.stream, context=ctx) as s:
        assert s.offsets() == (311, 311)
        produce(q, [b"d"], ctx)
        assert [(m.offset, m.body) for m in s.read(0, 400)] == [(311, b"d")]
    assert q.counters()["messages"] == 1


def test_batch_ranges_read_what_plain_ranges_read(start_pzq, ctx):
    """StreamConsumer asks for packed RANGE answers (RANGE ... BATCH): the same messages as
    the plain answers, large bodies and empty ones, and a message of several frames alone;
    a plain RANGE is answered as before."""
    q = start_pzq(*STREAM)
    large = bytes(range(256)) * 320  # 80 KiB: its batch goes out in parts, and is read as a
    # view of what libzmq received (client.ZERO_COPY_MIN)
    with Producer(q.receive, window=64, context=ctx) as p:
        for i in range(50):
            p.send(b"s%03d" % i)
        p.send(large)
        p.send(b"")
        p.send([b"f1", b"f2"])  # offset 52
        for i in range(20):
            p.send(b"t%02d" % i)
        p.flush(10)
    with (StreamConsumer(q.stream, context=ctx) as s,
          StreamConsumer(q.stream, context=ctx, batch=False) as plain):
        expected = snapshot(plain.read(0, 1000))
        assert len(expected) == 73 and expected[50][3] == (large,)
        assert snapshot(s.read(0, 1000)) == expected
        first = s.range(0, 1000)
        assert first.next == 52 and snapshot(first.messages) == expected[:52]
        alone = s.range(52, 1000)
        assert alone.next == 53 and snapshot(alone.messages) == expected[52:53]
        assert snapshot(s.range(53, 1000, max_messages=5).messages) == expected[53:58]
        assert s.batch
    sock = dealer(ctx, q.stream)
    sock.send_multipart([b"id", b"", b"RANGE", b"0", b"1"])
    reply = recv(sock)
    key = bytes(expected[0][1])
    assert reply == [b"id", b"", b"OK", b"73", b"0", b"1", b"1", b"0", key,
                     wire.key_time(key), b"1", b"s000"]
    sock.close()


def test_a_reader_asks_a_queue_that_knows_no_batch_range_the_plain_way(ctx):
    """A queue from before RANGE ... BATCH answers it ERROR "RANGE takes ...": the reader
    asks again the plain way, and goes on so."""
    server = ctx.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    seen = []

    def serve():
        for _ in range(3):
            if not server.poll(5000):
                return
            rid, *envelope_and_request = server.recv_multipart()
            envelope, request = envelope_and_request[:2], envelope_and_request[2:]
            seen.append(request)
            if request[-1] == wire.BATCH:
                server.send_multipart([rid, *envelope, b"ERROR", b"RANGE takes [start][end]"])
            else:
                server.send_multipart([rid, *envelope, b"OK", b"9", b"0", b"9", b"1",
                                       *wire.range_entry(4, b"1|k", (b"x",))])

    t = threading.Thread(target=serve)
    t.start()
    try:
        with StreamConsumer(f"tcp://127.0.0.1:{port}", context=ctx, timeout=2) as s:
            assert [(m.offset, m.body) for m in s.range(0, 9).messages] == [(4, b"x")]
            assert not s.batch
            assert [m.offset for m in s.range(0, 9).messages] == [4]
    finally:
        t.join()
        server.close()
    assert [r[-1] == wire.BATCH for r in seen] == [True, False, False]


def test_messages_below_a_commit_made_before_a_crash_are_dropped_at_start(start_pzq, ctx):
    q = start_pzq(*STREAM)
    produce(q, [b"%d" % i for i in range(10)], ctx)
    q.kill()
    # as if the queue died after writing the committed offset, before the ACK records
    (q.database / "stream-offsets").write_text(json.dumps({"committed": 4}) + "\n")
    q = q.restart()
    with StreamConsumer(q.stream, context=ctx) as s:
        assert s.offsets() == (10, 4)
        assert [m.body for m in s.read(0, 10)] == [b"%d" % i for i in range(4, 10)]
    assert q.counters()["messages"] == 6


def test_commit_past_the_head_stops_at_the_head(start_pzq, ctx):
    q = start_pzq(*STREAM)
    produce(q, [b"x"] * 5, ctx)
    with StreamConsumer(q.stream, context=ctx) as s:
        assert s.commit(10**12) == 5
        assert s.offsets() == (5, 5)
        produce(q, [b"y"], ctx)
        assert [(m.offset, m.body) for m in s.read(5, 6)] == [(5, b"y")]


def test_bad_requests_get_an_error_reply_and_the_queue_goes_on(start_pzq, ctx):
    q = start_pzq(*STREAM)
    produce(q, [b"z"] * 3, ctx)
    sock = dealer(ctx, q.stream)
    for request, reason in [
        ([b"id1", b"", b"NOPE"], b"Unknown command"),
        ([b"id2", b"", b"RANGE", b"5"], b"RANGE takes"),
        ([b"id3", b"", b"RANGE", b"9", b"3"], b"past its end"),
        ([b"id4", b"", b"COMMIT", b"x"], b"decimal integer"),
        ([b"id5", b""], b"Empty request"),
        ([b"HEAD", b"junk"], b"HEAD takes no argument"),  # no delimiter: all is the request
        ([b"id6", b"", b"RANGE", b"BATCH"], b"RANGE takes"),
        ([b"id7", b"", b"RANGE", b"0", b"3", b"BATCH", b"BATCH"], b"decimal integer"),
        ([b"id8", b"", b"RANGE", b"3", b"0", b"BATCH"], b"past its end"),
    ]:
        sock.send_multipart(request)
        reply = recv(sock)
        envelope = request[:2] if b"" in request else [b""]
        assert reply[:len(envelope)] == envelope, reply
        status, text = reply[len(envelope):]
        assert status == b"ERROR" and reason in text, reply
    req = dealer(ctx, q.stream, zmq.REQ)  # a REQ socket works too
    req.send(b"HEAD")
    assert recv(req) == [b"OK", b"3", b"0"]
    with StreamConsumer(q.stream, context=ctx) as s:
        with pytest.raises(StreamError, match="past its end"):
            s.range(9, 3)
        assert s.offsets() == (3, 0)
    c = q.counters()
    assert q.alive() and c["stream_errors"] == 10 and c["messages"] == 3


def test_a_full_backlog_refuses_producers_until_a_commit_frees_room(start_pzq, ctx):
    # a message costs its body, its id (18 or 19 bytes here) and 16 bytes for each of the two
    q = start_pzq(*STREAM, "--max-backlog", "1510")
    produce(q, [b"%0100d" % i for i in range(10)], ctx)  # 10 x ~150 bytes: full
    with pytest.raises(ProducerError, match="Queue full"):
        produce(q, [b"one more"], ctx)
    with StreamConsumer(q.stream, context=ctx) as s:
        assert s.head() == 10  # the refused one has no offset
        assert s.commit(3) == 3
        produce(q, [b"%0100d" % i for i in range(3)], ctx)  # room for 450 bytes again
        with pytest.raises(ProducerError, match="Queue full"):
            produce(q, [b"x"], ctx)
        assert s.offsets() == (13, 3)
        assert len(list(s.read(0, 100))) == 10


def test_a_silent_queue_times_out_the_client(ctx):
    with StreamConsumer("tcp://127.0.0.1:9", timeout=0.2, retries=1, context=ctx) as s:
        t = time.monotonic()
        with pytest.raises(TimeoutError):
            s.head()
        assert time.monotonic() - t < 2


def test_a_push_queue_has_no_stream_endpoint(start_pzq, ctx):
    q = start_pzq()
    assert "stream_head" not in q.counters()
    with StreamConsumer(q.stream, timeout=0.3, retries=0, context=ctx) as s:
        with pytest.raises(TimeoutError):
            s.head()


def test_requests_waiting_for_a_slow_offsets_file_are_bounded_and_the_refused_change_nothing(
        monkeypatch):
    from zbroker.services.pzq.core import stream
    monkeypatch.setattr(stream, "MAX_WAITING", 3)
    monkeypatch.setattr(stream, "BUSY", "busy: 3 requests wait")
    store = FakeStore()
    q = store.attach(QueueCore(stream=True))
    put(q, 5)
    q.batch_done(store.done(placed=tuple(range(5))))
    st = StreamCore(q, Offsets({"default": 0}))
    for end in (1, 2, 3):  # the write of the first is under way; the others wait behind it
        assert st.request([b"r", b"", b"COMMIT", b"%d" % end]) is None
        if end == 1:
            first = st.to_write()
    busy = [b"r", b"", b"ERROR", b"busy: 3 requests wait"]
    assert st.request([b"r", b"", b"COMMIT", b"4"]) == busy
    assert st.request([b"r", b"", b"GROUP", b"new", b"HEAD"]) == busy
    assert st.request([b"r", b"", b"HEAD"]) == [b"r", b"", b"OK", b"5", b"0"]  # needs no write
    assert st.written(first, None) == [[b"r", b"", b"OK", b"5", b"1"]]
    assert st.written(st.to_write(), None) == [[b"r", b"", b"OK", b"5", b"3"]] * 2
    assert st.to_write() is None  # the refused COMMIT 4 and group were never asked for
    assert st.offsets.groups == {"default": 3}
    assert st.request([b"r", b"", b"COMMIT", b"4"]) is None  # room again
