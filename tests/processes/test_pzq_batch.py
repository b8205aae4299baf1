"""The batch path of pzq: many messages in one ZeroMQ message, from producers (one log
record, one answer) and to consumers of the credit endpoint (one delivery, one ACK).
Pure codec and core tests first, then the store on a real disk, then real ``pzq``
processes: atomicity across SIGKILL, idempotent resends, windows, hostile input beside a
live producer and consumer, and original clients beside batch clients."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest
import zmq
from helpers import broker_env, endpoint_accepts, free_port, wait_for
from hypothesis import given
from hypothesis import strategies as st
from pzq_helpers import FakeStore, dealer, recv, wait_counter
from test_pzq_credit import credit_queue, drain
from test_pzq_store import Harness, recover

from pzq import wire
from pzq.client import Consumer, Producer
from pzq.client import monitor as queue_monitor
from zbroker import zmtp
from zbroker.services.pzq.consumers import Consumers
from zbroker.services.pzq.core import records
from zbroker.services.pzq.core.actions import Confirm
from zbroker.services.pzq.core.counters import Dropped
from zbroker.services.pzq.core.queue import Limits, QueueCore
from zbroker.services.pzq.receiver import SENT
from zbroker.services.pzq.settings import QueueSettings

# --- the codec ---------------------------------------------------------------------------


@given(st.lists(st.tuples(st.binary(max_size=255), st.binary(max_size=300)), min_size=1,
                max_size=40))
def test_pack_and_unpack_are_inverse(messages):
    ids, bodies = [m[0] for m in messages], [m[1] for m in messages]
    assert wire.unpack(wire.pack(ids, bodies)) == (ids, bodies)
    assert wire.unpack(wire.pack(ids), with_bodies=False) == (ids, [])
    got = wire.unpack(memoryview(wire.pack(ids, bodies)))  # as a consumer reads a large one
    assert got == (ids, bodies) and all(type(x) is bytes for x in got[0] + got[1])
    assert b"".join(wire.packed_parts(ids, bodies)) == wire.pack(ids, bodies)


@given(st.binary(max_size=200))
def test_unpack_never_raises_on_garbage(data):
    got = wire.unpack(data)
    assert isinstance(got, str) or wire.pack(*got) == data


def test_malformed_batches_are_named():
    good = wire.pack([b"a", b"b"], [b"x", b"yy"])
    assert "shorter" in wire.unpack(b"\x01")
    assert wire.unpack(b"\0\0\0\0") == "empty batch"
    assert wire.unpack(good, max_count=1) == "more than 1 messages in a batch (2)"
    assert "do not add up" in wire.unpack(good[:-1])
    assert "do not add up" in wire.unpack(good + b"z")
    assert "cut short" in wire.unpack(good[:6])
    bad = wire.decode_produce_batch([b"B1", wire.BATCH_HEADER, b"", good, b"extra"])
    assert isinstance(bad, wire.WireError) and bad.msg_id == b"B1"


# --- the queue core ----------------------------------------------------------------------


def core(**limits) -> tuple[QueueCore, FakeStore]:
    store = FakeStore()
    return store.attach(QueueCore(Limits(**limits))), store


def batch(batch_id: bytes, ids: list[bytes], bodies: list[bytes] | None = None) -> list:
    bodies = bodies or [b"body-" + i for i in ids]
    return [batch_id, wire.BATCH_HEADER, b"", wire.pack(ids, bodies)]


def test_a_batch_is_one_record_and_one_answer_after_it_is_durable():
    q, store = core()
    q.produce_batch(b"P", batch(b"B1", [b"a", b"b", b"c"]), 1_000)
    assert store.appended == [0, 1, 2] and store.replies == []
    assert len(q.messages) == 3 and q.counters["produced"] == 3
    q.batch_done(store.done(placed=(0, 1, 2)))
    assert store.replies == [(b"P", [b"B1", b"1", b""])]
    assert [q.messages[s].frames for s in range(3)] == [(b"body-a",), (b"body-b",), (b"body-c",)]
    assert len({q.messages[s].key for s in range(3)}) == 3


def test_a_batch_sent_again_is_not_stored_twice_and_is_answered_each_time():
    q, store = core()
    q.produce_batch(b"P", batch(b"B1", [b"a", b"b"]), 1)
    q.produce_batch(b"P", batch(b"B1", [b"a", b"b"]), 2)  # resent before its answer
    assert store.appended == [0, 1] and store.replies == []
    q.batch_done(store.done(placed=(0, 1)))
    assert store.replies == [(b"P", [b"B1", b"1", b""])] * 2
    q.produce_batch(b"P", batch(b"B2", [b"b", b"c"]), 3)  # one new, one stored before
    assert store.appended == [0, 1, 2] and q.counters["duplicates"] == 3
    q.batch_done(store.done(placed=(2,)))
    assert store.replies[-1] == (b"P", [b"B2", b"1", b""]) and len(q.messages) == 3
    q.produce_batch(b"P", batch(b"B3", [b"d", b"d"]), 4)  # an id twice: stored once
    assert store.appended[-1] == 3 and len(q.messages) == 4


def test_a_failed_write_fails_the_whole_batch_and_a_retry_is_stored():
    q, store = core()
    q.produce_batch(b"P", batch(b"B1", [b"a", b"b"]), 1)
    q.batch_done(store.done(failed=(0, 1), error="store failed: No space left on device"))
    assert store.replies == [(b"P", wire.producer_ack(b"B1", False,
                                                      "store failed: No space left on device"))]
    assert not q.messages
    q.produce_batch(b"P", batch(b"B1", [b"a", b"b"]), 2)
    assert store.appended == [0, 1, 2, 3]


def test_a_batch_over_the_limits_is_refused_whole():
    q, store = core(max_backlog=200, max_message_size=100)
    q.produce_batch(b"P", batch(b"big", [b"a"], [b"x" * 120]), 1)
    q.produce_batch(b"P", batch(b"full", [b"%d" % i for i in range(6)]), 1)  # 6 x 41 bytes
    q.produce_batch(b"P", batch(b"empty", [b"a", b"b"], [b"x", b""]), 1)
    q.produce_batch(b"P", [b"bad", wire.BATCH_HEADER, b"", b"\x05\0\0\0"], 1)
    answers = {frames[0]: frames[3].decode() for _, frames in store.replies}
    assert answers[b"big"].startswith("Batch too large")
    assert answers[b"full"] == "Queue full"
    assert answers[b"empty"] == wire.EMPTY
    assert "malformed batch" in answers[b"bad"]
    assert all(frames[1] == b"0" for _, frames in store.replies)
    assert not q.messages and store.appended == []


def test_a_batch_consumer_gets_batches_within_its_windows_and_acks_them_in_one():
    q, store = core()
    q.produce_batch(b"P", batch(b"B", [b"%d" % i for i in range(10)], [b"x" * 10] * 10), 1)
    q.produce(b"P", [b"multi", b"", b"f1", b"f2"], 1)  # several frames: goes alone
    assert q.credit_consumer(b"C", 4, 90)  # 4 messages, 90 bytes: each costs 1 + 10 + 32
    d, frames = q.next_delivery(0.0, 7)
    assert frames[0] == wire.BATCH and frames[1] == b"7"
    keys, bodies = wire.unpack(frames[3])
    assert bodies == [b"x" * 10] * 2  # the byte window: 2 x 43 <= 90 < 3 x 43
    assert q.next_delivery(0.0, 8) is None  # its window is full
    q.consumer_acks(keys + [b"unknown"], b"C", b"ack-1")
    assert q.counters["unknown_acks"] == 1 and store.acked == [0, 1]
    assert store.confirmations == []
    q.batch_done(store.done(acked=(0, 1)))
    assert store.confirmations == [(b"C", b"ack-1", wire.ACKED)]
    q.credit_consumer(b"C", 100, 1 << 20)
    d, frames = q.next_delivery(0.0, 9)
    assert len(wire.unpack(frames[3])[0]) == 8
    d, frames = q.next_delivery(0.0, 9)  # the message of two frames, alone
    assert frames[3:] == [b"", b"f1", b"f2"]
    q.unsent(d)
    assert q.next_delivery(0.0, 10)[1][4:] == [b"f1", b"f2"]


class RecordingEndpoint:
    """A consumers' endpoint that records what is sent to it and each write to its
    connections (a flush with something to write, as the real endpoints do)."""

    def __init__(self, calls: list):
        self.calls = calls
        self.connected = 1
        self.queued = False

    def send(self, cid, frames):
        self.calls.append(("send", cid, frames[0]))
        self.queued = True
        return SENT

    def flush(self):
        if self.queued:
            self.calls.append(("write",))
        self.queued = False


def test_a_confirmation_and_the_next_batch_to_its_consumer_leave_in_one_write(tmp_path,
                                                                             request):
    """The ACK of a batch is confirmed (ACKED) in the same turn as the next batch goes to
    that consumer: both are written together, one write to its connection, not two."""
    q, store = core()
    calls: list = []
    settings = QueueSettings("q", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", None, tmp_path)
    loop = asyncio.new_event_loop()  # (not run: Consumers only reads its clock)
    request.addfinalizer(loop.close)
    consumers = Consumers(q, settings, loop, lambda: None, lambda: None, None, Dropped())
    consumers.send, consumers.credit = RecordingEndpoint([]), RecordingEndpoint(calls)
    q.produce_batch(b"P", batch(b"B", [b"%d" % i for i in range(4)]), 1)
    q.credit_consumer(b"C", 2, 1 << 20)
    consumers.deliver()  # the first two
    assert calls == [("send", b"C", wire.BATCH), ("write",)]
    first = [q.messages[s].key for s in (0, 1)]
    q.consumer_acks(first, b"C", b"ack-1")
    q.batch_done(store.done(acked=(0, 1)))
    assert store.confirmations == [(b"C", b"ack-1", wire.ACKED)]
    calls.clear()
    consumers.confirm([Confirm(*c) for c in store.confirmations])
    consumers.deliver()
    assert calls == [("send", b"C", b"ack-1"), ("send", b"C", wire.BATCH), ("write",)]


def test_a_recovered_message_of_several_frames_goes_alone_and_gone_ones_are_let_go():
    """Which messages go alone is kept as a set of seqs: a recovered message of several
    frames is in it, and the seqs of messages ACKed since do not pile up."""
    q, _ = core()
    q.recover([records.MessageRecord(0, b"k0", b"m0", (b"x",)),
               records.MessageRecord(1, b"k1", b"m1", (b"f1", b"f2")),
               records.MessageRecord(2, b"k2", b"m2", (b"y",))], 3)
    assert q.credit_consumer(b"C", 100, 1 << 20)
    got = [q.next_delivery(0.0, 7)[1] for _ in range(3)]
    assert [wire.unpack(got[0][3])[1], got[1][4:], wire.unpack(got[2][3])[1]] == [
        [b"x"], [b"f1", b"f2"], [b"y"]]
    for i in range(200):
        q.produce(b"P", [b"m%d" % i, b"", b"a", b"b"], 1)
    for m in list(q.messages.values()):
        q.consumer_ack([m.key, wire.OK])
    assert not q.messages
    q.produce(b"P", [b"last", b"", b"a", b"b"], 1)
    assert q.alone == set(q.messages)


def test_a_batch_of_large_bodies_goes_out_as_its_parts_not_joined():
    """With a body of zmtp.LARGE_FRAME or more, the packed frame is handed to the writer as its
    parts: the bodies the queue holds, not a copy of them joined (a consumer reads the same
    bytes: the end-to-end test below)."""
    q, _ = core()
    big = [bytes([97 + i]) * (zmtp.LARGE_FRAME + i) for i in range(3)]
    q.produce_batch(b"P", batch(b"B", [b"a", b"b", b"c"], big), 1)
    q.produce_batch(b"P", batch(b"S", [b"s"], [b"small"]), 1)
    assert q.credit_consumer(b"C", 10, 1 << 20)
    _, frames = q.next_delivery(0.0, 7)
    assert type(frames[3]) is list
    keys, bodies = wire.unpack(b"".join(frames[3]))
    assert bodies[:3] == big and bodies[3:] == [b"small"]
    held = [m.frames[0] for m in q.messages.values()]
    assert sum(any(p is body for p in frames[3]) for body in held) == 4
    q.produce_batch(b"P", batch(b"T", [b"t"], [b"tiny"]), 1)
    _, frames = q.next_delivery(0.0, 8)  # small bodies only: one buffer, as before
    assert type(frames[3]) is bytes and wire.unpack(frames[3])[1] == [b"tiny"]


def test_a_batch_that_could_not_be_sent_is_ready_again_as_it_was():
    q, _ = core(ack_timeout=5.0)
    q.produce_batch(b"P", batch(b"B", [b"%d" % i for i in range(6)], [b"x"] * 6), 1)
    assert q.credit_consumer(b"C", 100, 1 << 20)
    d, frames = q.next_delivery(0.0, 7)
    keys = wire.unpack(frames[3])[0]
    assert len(keys) == 6 and d.attempts == [1] * 6
    q.unsent(d)  # its connection was full
    assert q.counters["delivered"] == 0
    assert (q.dispatcher.inflight, q.dispatcher.inflight_bytes) == (0, 0)
    d, frames = q.next_delivery(0.0, 8)
    assert wire.unpack(frames[3])[0] == keys and d.attempts == [1] * 6  # same order
    assert q.dispatcher.expire(5.0) == d.seqs  # not ACKed in time
    d, frames = q.next_delivery(5.0, 9)
    assert wire.unpack(frames[3])[0] == keys and d.attempts == [2] * 6
    assert q.dispatcher.redelivered == 6
    q.unsent(d)
    assert q.dispatcher.redelivered == 0 and q.dispatcher.inflight == 0
    d, _ = q.next_delivery(6.0, 10)
    assert d.attempts == [2] * 6 and q.dispatcher.redelivered == 6


# --- the store ---------------------------------------------------------------------------


def test_a_batch_record_is_recovered_with_its_keys(tmp_path):
    h = Harness(tmp_path, sync="batch", sync_window=0.001)
    base = wire.key_base(123, b"k" * 24)
    h.wait_batch(h.store.append_batch(10, 3, base, wire.pack([b"a", b"b", b"c"],
                                                             [b"1", b"22", b"333"])))
    h.close()
    got = recover(tmp_path)
    assert [(m.seq, m.msg_id, m.frames) for m in got.messages] == [
        (10, b"a", (b"1",)), (11, b"b", (b"22",)), (12, b"c", (b"333",))]
    assert [m.key for m in got.messages] == [wire.message_key(base, s) for s in (10, 11, 12)]
    assert got.next_seq == 13


def test_a_torn_batch_record_is_all_gone_never_a_part(tmp_path):
    h = Harness(tmp_path, sync="batch", sync_window=0.001)
    h.wait_batch(h.store.append_batch(0, 2, b"1|x", wire.pack([b"a", b"b"], [b"1", b"2"])))
    h.wait_batch(h.store.append_batch(2, 3, b"1|x", wire.pack([b"c", b"d", b"e"],
                                                              [b"3", b"4", b"5" * 100])))
    h.close()
    (segment,) = tmp_path.glob("*.seg")
    data = segment.read_bytes()
    first = records.HEADER.unpack_from(data, 0)[0] + records.HEADER.size
    for cut in range(first, len(data)):
        segment.write_bytes(data[:cut])
        assert [m.seq for m in recover(tmp_path).messages] == [0, 1], cut
    segment.write_bytes(data)
    assert [m.seq for m in recover(tmp_path).messages] == [0, 1, 2, 3, 4]


def test_acks_of_a_waiting_batch_follow_it_or_avoid_it(tmp_path):
    h = Harness(tmp_path, sync="batch", sync_window=0.5)  # waits: the ACKs come first
    b1 = h.store.append_batch(0, 3, b"1|x", wire.pack([b"a", b"b", b"c"], [b"1"] * 3))
    h.store.ack(1)  # one of three: the batch is written, an ACK record follows it
    h.store.append_batch(3, 2, b"1|x", wire.pack([b"d", b"e"], [b"2"] * 2))
    h.store.ack(3)
    h.store.ack(4)  # all of it: never written
    h.wait_batch(b1)
    h.settle()
    assert h.store.avoided_messages == 2
    h.close()
    assert [m.seq for m in recover(tmp_path).messages] == [0, 2]


def test_acks_taken_together_follow_or_avoid_each_waiting_batch(tmp_path):
    """One ack_many over several waiting records (two batches and a message), and a batch
    ACKed whole across two calls: what is returned as never to be written, and what comes
    back after the writes, are as if each ACK came alone."""
    h = Harness(tmp_path, sync="batch", sync_window=0.5)  # waits: the ACKs come first
    b1 = h.store.append_batch(0, 3, b"1|x", wire.pack([b"a", b"b", b"c"], [b"1"] * 3))
    h.store.append_batch(3, 2, b"1|x", wire.pack([b"d", b"e"], [b"2"] * 2))
    h.store.append(5, b"1|x-5", b"f", [b"3"])
    h.store.append_batch(6, 4, b"1|x", wire.pack([b"g", b"h", b"i", b"j"], [b"4"] * 4))
    # 1 of the first batch (an ACK record follows it), all of the second, the message,
    # and half of the last
    assert h.store.ack_many([1, 3, 5, 4, 6, 8]) == [range(5, 6), range(3, 5)]
    assert h.store.ack_many([7, 9]) == [range(6, 10)]  # the rest of the last: all of it
    assert h.store.ack_many([2]) == []  # the first batch: two of three, still written
    h.wait_batch(b1)
    h.settle()
    assert h.store.avoided_messages == 2 + 1 + 4
    h.close()
    assert [m.seq for m in recover(tmp_path).messages] == [0]


def test_acks_of_waiting_batches_in_any_order_avoid_each_batch_once_all_of_it_is_acked(
        tmp_path):
    """A batch consumer's ACK of seqs from two waiting records, interleaved or each in one
    piece: a record is never written once all of it is ACKed, whatever the order."""
    h = Harness(tmp_path, sync="batch", sync_window=0.5)  # waits: the ACKs come first
    b1 = h.store.append_batch(0, 3, b"1|x", wire.pack([b"a", b"b", b"c"], [b"1"] * 3))
    h.store.append_batch(3, 2, b"1|x", wire.pack([b"d", b"e"], [b"2"] * 2))
    h.store.append_batch(5, 2, b"1|x", wire.pack([b"f", b"g"], [b"3"] * 2))
    assert h.store.ack_many([0, 3, 1, 4]) == [range(3, 5)]  # interleaved
    assert h.store.ack_many([2, 5]) == [range(0, 3)]  # each in one piece
    h.wait_batch(b1)
    h.settle()
    assert h.store.avoided_messages == 3 + 2
    h.close()
    assert [m.seq for m in recover(tmp_path).messages] == [6]  # 5: ACKed after its batch


# --- real pzq processes ------------------------------------------------------------------


def batch_consumer_drain(c: Consumer, idle: float = 1.0) -> list:
    got = []
    while batch := c.recv_many(1000, timeout=idle):
        got.extend(batch)
        c.ack_many(batch)
    return got


def test_a_batch_consumer_takes_at_most_what_it_asks_for_in_order(start_pzq):
    """recv_many(n) gives at most n messages, in order, the rest of a batch on the next
    calls; a message is read-only, its fields as the queue sent them."""
    q, credit = credit_queue(start_pzq, "--ack-timeout", "60000000")
    with Producer(q.receive, window=200, batch=100) as p:
        for i in range(100):
            p.send(b"m-%d" % i)
        p.flush(30)
    with Consumer(credit, credit=200, credit_bytes=1 << 20) as c:
        got = []
        while len(got) < 100:
            part = c.recv_many(30, timeout=5)
            assert 0 < len(part) <= 30
            got.extend(part)
        assert [m.body for m in got] == [b"m-%d" % i for i in range(100)]
        first = got[0]
        assert first.frames == (b"m-0",) and first.ack_timeout_us == 60_000_000
        assert abs(first.sent_us / 1e6 - time.time()) < 60
        with pytest.raises(AttributeError):
            first.key = b"other"  # type: ignore[misc]
        c.ack_many(got)
        c.confirm(10)
        assert c.recv_many(10, timeout=0.2) == []


def test_batches_end_to_end_with_original_clients_beside_them(start_pzq):
    q, credit = credit_queue(start_pzq, "--ack-timeout", "60000000")
    with Producer(q.receive, window=500, batch=64) as p:
        for i in range(2000):
            p.send(b"batch-%d" % i)
        p.flush(30)
        assert p.acked == 2000 and not p.failed
    with Producer(q.receive, window=8) as p:  # the original wire, on the same endpoint
        for i in range(100):
            p.send(b"single-%d" % i)
        p.flush(30)
    counters = q.counters()
    assert counters["messages"] == 2100 and counters["batches"] < 200
    with Consumer(credit, credit=300, credit_bytes=64 << 10) as c, \
            Consumer(q.send) as legacy:
        got = batch_consumer_drain(c)
        got += drain(legacy, idle=0.5)
        c.confirm(10)
    bodies = sorted(m.body if hasattr(m, "body") else m for m in got)
    assert bodies == sorted([b"batch-%d" % i for i in range(2000)]
                            + [b"single-%d" % i for i in range(100)])
    assert q.counters()["messages"] == 0


def test_large_bodies_reach_a_batch_consumer_whole(start_pzq):
    q, credit = credit_queue(start_pzq, "--ack-timeout", "60000000")
    bodies = [bytes([i % 251]) * (zmtp.LARGE_FRAME + 997 * i) for i in range(40)]
    bodies[::7] = [b"small-%d" % i for i in range(len(bodies[::7]))]
    with Producer(q.receive, window=16, batch=8) as p:
        for b in bodies:
            p.send(b)
        p.flush(30)
        assert p.acked == len(bodies) and not p.failed
    with Consumer(credit, credit=64, credit_bytes=8 << 20) as c:
        got = batch_consumer_drain(c)
        c.confirm(10)
    assert sorted(m.body for m in got) == sorted(bodies)
    assert q.counters()["messages"] == 0


def test_a_producer_batch_is_at_most_half_its_window(ctx):
    """A batch as large as the window would wait for its ACK before the next could start:
    the producer sends a batch once it holds half the window, so the next is made while the
    queue stores it. Seen from a ROUTER standing in for the queue."""
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    with Producer(f"tcp://127.0.0.1:{port}", window=8, batch=8, linger=60) as p:
        for i in range(4):
            p.send(b"m%d" % i, msg_id=b"%d" % i)
        assert router.poll(5000), "half the window made no batch"
        peer, batch_id, header, empty, packed = router.recv_multipart()
        assert header == wire.BATCH_HEADER and empty == b""
        assert wire.unpack(packed) == ([b"0", b"1", b"2", b"3"], [b"m0", b"m1", b"m2", b"m3"])
        for i in range(4, 7):  # the next batch is made while the first waits for its ACK
            p.send(b"m%d" % i, msg_id=b"%d" % i)
        assert not router.poll(300)
        p.send(b"m7", msg_id=b"7")
        assert router.poll(5000)
        assert wire.unpack(router.recv_multipart()[4])[0] == [b"4", b"5", b"6", b"7"]
        assert p.inflight == 8
        router.send_multipart([peer, batch_id, b"1", b""])
        p.poll(5)
        assert p.inflight == 4
    router.close(0)


def test_a_batch_consumer_never_holds_more_than_its_windows(start_pzq):
    q, credit = credit_queue(start_pzq, "--ack-timeout", "60000000")
    with Producer(q.receive, window=1000, batch=100) as p:
        for i in range(1000):
            p.send(b"x" * 100, msg_id=b"%04d" % i)  # each costs 4 + 100 + 2 x 16 bytes
        p.flush(30)
    with Consumer(credit, credit=50, credit_bytes=1 << 20) as c:
        held = []
        while m := c.recv(1.5):
            held.append(m)
        assert len(held) == 50  # not ACKed: its window, then nothing
        assert q.counters()["messages_inflight"] == 50
        c.ack_many(held)
        c.confirm(5)
    with Consumer(credit, credit=1000, credit_bytes=1000) as c:
        held = []
        while m := c.recv(1.5):
            held.append(m)
        assert len(held) == 7  # 7 x 136 <= 1000 < 8 x 136
        c.ack_many(held)
        c.confirm(5)


def test_a_resent_batch_is_stored_once(start_pzq, ctx):
    q = start_pzq()
    s = dealer(ctx, q.receive)
    frames = batch(b"B1", [b"id-%d" % i for i in range(50)])
    for _ in range(3):
        s.send_multipart(frames)
    answers = [recv(s) for _ in range(3)]
    assert answers == [[b"B1", b"1", b""]] * 3
    assert q.counters()["messages"] == 50 and q.counters()["duplicates"] == 100
    q.kill()
    q = q.restart()
    s.close()
    s = dealer(ctx, q.receive)
    s.send_multipart(frames)  # after a restart: the ids of messages still there are known
    assert recv(s) == [b"B1", b"1", b""]
    assert q.counters()["messages"] == 50


def test_hostile_batches_get_a_reason_and_disturb_no_one(start_pzq, ctx):
    """Malformed batches, beside a batch producer and a batch consumer that go on: each is
    answered "0" with its reason, the queue keeps serving, nothing is lost."""
    q, credit = credit_queue(start_pzq, "--max-message-size", "65536")
    n = 5000
    done = threading.Event()

    def produce() -> None:
        with Producer(q.receive, window=200, batch=20) as p:
            for i in range(n):
                p.send(b"good-%d" % i)
            p.flush(30)
            done.set()

    good = wire.pack([b"a", b"b"], [b"x", b"y"])
    hostile = {
        b"h1": [b"h1", wire.BATCH_HEADER, b"", good[:-3]],  # cut short
        b"h2": [b"h2", wire.BATCH_HEADER, b"", b"\xff\xff\xff\xff"],  # a huge count
        b"h3": [b"h3", wire.BATCH_HEADER, b"", b""],
        b"h4": [b"h4", wire.BATCH_HEADER, good],  # no delimiter
        b"h5": [b"h5", wire.BATCH_HEADER, b"", wire.pack([b"a"], [b"z" * 70000])],  # too big
        b"h6": [b"h6", wire.BATCH_HEADER, b"", good, good],
        b"h7": [b"h7", wire.BATCH_HEADER, b"", b"\x02\0\0\0\x01\x01" + b"\xff" * 8 + b"ab"],
    }
    worker = threading.Thread(target=produce)
    worker.start()
    got: set[bytes] = set()
    try:
        s = dealer(ctx, q.receive)
        with Consumer(credit, credit=100, credit_bytes=1 << 20) as c:
            for frames in hostile.values():
                s.send_multipart(frames)
                if batch := c.recv_many(100, timeout=0.05):
                    got.update(m.body for m in batch)
                    c.ack_many(batch)
            answers = {}
            while len(answers) < len(hostile):
                a = recv(s)
                answers[a[0]] = a
            deadline = time.monotonic() + 60
            while (len(got) < n or not done.is_set()) and time.monotonic() < deadline:
                if batch := c.recv_many(1000, timeout=1):
                    got.update(m.body for m in batch)
                    c.ack_many(batch)
            c.confirm(10)
    finally:
        worker.join(30)
    assert all(a[1] == b"0" and len(a) == 4 for a in answers.values()), answers
    assert b"Batch too large" in answers[b"h5"][3]
    assert b"more than" in answers[b"h2"][3]
    assert q.alive() and done.is_set()
    assert got == {b"good-%d" % i for i in range(n)}
    counters = q.counters()  # too large is a refusal, not malformed (as for messages)
    assert counters["malformed"] == len(hostile) - 1
    assert counters["producer_failures"] == len(hostile)


def test_after_a_sigkill_each_batch_is_all_there_or_was_never_acked(start_pzq):
    """Producers send batches while the queue is SIGKILLed: after the restart every batch
    is there whole or not at all, and every batch that got its "1" is there."""
    q = start_pzq()
    acked: set[bytes] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def on_ack(msg_id: bytes, ok: bool, _text: str) -> None:
        if ok:
            with lock:
                acked.add(msg_id)

    def produce() -> None:
        # batches of exactly 100 (the window is a multiple, the linger long): the body
        # names the batch
        try:
            with Producer(q.receive, window=2000, batch=100, on_ack=on_ack,
                          retry_timeout=60, linger=60) as p:
                for i in range(1_000_000):
                    if i % 100 == 0 and stop.is_set():
                        break
                    p.send(b"b%d" % (i // 100), msg_id=b"%d" % i, timeout=0.5)
        except (zmq.ZMQError, TimeoutError):
            pass

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    wait_counter(q, "stored", lambda n: n >= 20_000, timeout=30)
    q.kill()
    stop.set()
    worker.join(10)
    with lock:
        promised = set(acked)
    q = q.restart()
    with Consumer(q.send) as c:
        bodies = drain(c, idle=1.5)
    per_batch: dict[bytes, int] = {}
    for body in bodies:
        per_batch[body] = per_batch.get(body, 0) + 1
    assert len(bodies) >= 20_000
    assert set(per_batch.values()) == {100}, "a batch came back in part"
    promised_batches = {b"b%d" % (int(i) // 100) for i in promised}
    assert promised_batches <= set(per_batch), "an ACKed batch was lost"


def test_the_queue_answers_a_resent_batch_after_its_answer_was_lost(start_pzq, ctx):
    """A producer that lost its connection resends: the batch is answered, not duplicated."""
    q = start_pzq()
    frames = batch(b"B9", [b"r-%d" % i for i in range(10)])
    s = dealer(ctx, q.receive)
    s.send_multipart(frames)
    s.close(linger=1000)  # gone before the answer (it is dropped)
    wait_counter(q, "messages", lambda n: n == 10)  # the batch was stored all the same
    s = dealer(ctx, q.receive)
    s.send_multipart(frames)
    assert recv(s) == [b"B9", b"1", b""]
    assert q.counters()["messages"] == 10


@pytest.mark.parametrize("frames", [
    [b"READY", b"10", b"0"], [b"READY", b"10", b"x"], [b"ACK", b"a" * 300, b""],
    [b"ACK", b"a1", b"\x01\0\0\0"],
])
def test_malformed_batch_consumer_frames_are_counted_and_change_nothing(start_pzq, ctx,
                                                                         frames):
    q, credit = credit_queue(start_pzq)
    s = dealer(ctx, credit)
    s.send_multipart(frames)
    wait_counter(q, "malformed", lambda n: n == 1)
    assert q.alive() and q.counters()["credit_consumers"] == 0


def test_queue_put_sends_batches_and_no_batch_the_original_wire(start_pzq, tmp_path):
    q = start_pzq()
    lines = b"".join(b"line-%d\n" % i for i in range(1000))

    def put(*extra: str) -> None:
        r = subprocess.run([sys.executable, "-m", "zbroker", "queue", "put", "q",
                            "--receive", q.receive, *extra], input=lines,
                           capture_output=True, timeout=60, env=broker_env(tmp_path))
        assert r.returncode == 0, r.stderr

    put()
    counters = q.counters()
    assert counters["messages"] == 1000 and 4 <= counters["batches"] < 100
    put("--no-batch")
    counters = q.counters()
    assert counters["messages"] == 2000 and counters["batches"] < 100
    with Consumer(q.send) as c:
        assert sorted(drain(c)) == sorted(lines.split(b"\n")[:-1] * 2)


def test_a_replicated_batch_is_answered_once_every_copy_is_confirmed_or_timed_out():
    from zbroker.services.pzq.core.actions import Replicate

    q, store = core(replicas=1, replication_timeout=0.5)
    q.produce_batch(b"P", batch(b"B1", [b"a", b"b"]), 1, now=0.0)
    copies = [a for a in q.take_replication() if type(a) is Replicate]
    assert [c.body for c in copies] == [(b"body-a",), (b"body-b",)]
    q.batch_done(store.done(placed=(0, 1)))
    q.replica_confirmed(copies[0].key, True)
    assert store.replies == []  # one copy still unconfirmed
    q.replica_confirmed(copies[1].key, True)
    assert store.replies == [(b"P", [b"B1", b"1", b""])]
    q.produce_batch(b"P", batch(b"B2", [b"c", b"d"]), 2, now=1.0)
    copies = [a for a in q.take_replication() if type(a) is Replicate]
    q.batch_done(store.done(placed=(2, 3)))
    q.replica_confirmed(copies[0].key, True)
    q.tick(2.0)  # the other copy's time is up: stored here, with fewer copies
    assert store.replies[-1] == (b"P", [b"B2", b"1", b"", wire.REPLICATION_FAILED.encode()])
    assert len(store.replies) == 2


def test_queue_get_takes_batches_and_leaves_nothing_held_past_its_count(start_broker,
                                                                      tmp_path):
    """On a credit endpoint, ``zbroker queue get`` takes batches, ACKs each in one message,
    and gives back at once what came past --count: nothing waits for its ACK timeout."""
    from test_pzq_shell import Shell, queue_config

    cfg = queue_config(tmp_path)
    jobs = cfg["services"]["pzq"]["queues"]["jobs"]
    jobs.update(credit_endpoint=f"tcp://127.0.0.1:{free_port()}", ack_timeout=60,
                monitor_endpoint=f"tcp://127.0.0.1:{free_port()}")
    sh = Shell(start_broker(config=cfg), cfg)
    wait_for(lambda: endpoint_accepts(jobs["credit_endpoint"]), 10, "the credit endpoint")
    sh.put("jobs", [b"job %d" % i for i in range(3000)])
    r = sh.run("get", "jobs", "-n", "5", "-t", "5")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()
    assert len(first) == 5
    monitor = jobs["monitor_endpoint"]
    counters = wait_for(lambda: (c := queue_monitor(monitor)) and c["messages"] == 2995
                        and c["messages_inflight"] == 0 and c, 10, "the rest given back")
    assert counters["consumer_acks"] == 5
    r = sh.run("get", "jobs", "-n", "0", "-t", "1")
    assert r.returncode == 0, r.stderr
    rest = r.stdout.splitlines()
    assert sorted(first + rest) == sorted(b"job %d" % i for i in range(3000))
    assert queue_monitor(monitor)["messages"] == 0
