"""The pzq dispatcher and queue core: credit, least-loaded dispatch, timeouts, late ACKs,
idempotent producers, write failures. No sockets, no clock."""

from __future__ import annotations

from pzq_helpers import FakeStore

from pzq import wire
from zbroker.services.pzq.core.dispatcher import Dispatcher
from zbroker.services.pzq.core.queue import QUEUE_FULL, Limits, QueueCore


def two_consumers(credit: int, messages: int = 6) -> Dispatcher:
    """Consumers "a" and "b" with ``credit`` each, and ``messages`` of 10 bytes ready."""
    d = Dispatcher(ack_timeout=5)
    d.set_consumer("a", credit)
    d.set_consumer("b", credit)
    for seq in range(messages):
        d.add(seq, 10)
    return d


def test_least_loaded_consumer_with_credit_gets_the_next_message():
    d = two_consumers(2)
    got = [d.next_delivery(0) for _ in range(5)]
    assert [g.consumer for g in got[:4]].count("a") == 2
    assert got[4] is None  # no credit left anywhere
    d.ack(0 if got[0].consumer == "a" else 1)
    nxt = d.next_delivery(0)
    assert nxt is not None and nxt.seq == 4


def test_no_consumer_no_delivery_and_inflight_bytes_cap():
    d = Dispatcher(ack_timeout=5, max_inflight_bytes=25)
    d.add(0, 10)
    assert d.next_delivery(0) is None
    d.set_consumer("a", 100)
    for seq in (1, 2):
        d.add(seq, 10)
    assert [d.next_delivery(0).seq for _ in range(2)] == [0, 1]
    assert d.next_delivery(0) is None  # 30 bytes would pass the cap
    d.ack(0)
    assert d.next_delivery(0).seq == 2


def test_more_of_a_batch_stops_at_the_windows_and_at_a_message_that_goes_alone():
    d = Dispatcher(ack_timeout=5, max_inflight_bytes=1000)
    d.set_consumer("a", 6, max_bytes=60)
    for seq in range(10):
        d.add(seq, 10)
    first = d.next_delivery(0)
    d.ack(1)  # ACKed while ready: skipped
    more = d.more_to("a", 0, 100, set())
    assert more.seqs == [2, 3, 4, 5, 6]  # its window: 6 messages
    assert more.consumer == "a" and more.attempts == [1] * 5
    assert d.inflight == 6 and d.inflight_bytes == 60
    for seq in (first.seq, *more.seqs):
        d.ack(seq)
    assert d.more_to("a", 0, 100, {9}).seqs == [7, 8]
    assert d.more_to("a", 0, 100, set()).seqs == [9]
    d.set_consumer("b", 100, max_bytes=25)
    for seq in range(10, 20):
        d.add(seq, 10)
    assert d.more_to("b", 0, 100, set()).seqs == [10, 11]  # 25 B
    assert d.more_to("b", 0, 1, set()).seqs == []
    d.set_consumer("c", 100)
    assert d.more_to("c", 0, 3, set()).seqs == [12, 13, 14]
    assert d.expire(4.9) == []
    assert d.expire(5) == list(range(7, 15))  # each has its deadline, as one by one
    again = d.more_to("c", 6, 2, set())
    assert list(zip(again.seqs, again.attempts, strict=True)) == [(7, 2), (8, 2)]
    assert d.redelivered == 2


def test_acks_in_one_go_over_several_consumers_ready_messages_and_unknown_seqs():
    d = two_consumers(10)
    assert d.more_to("a", 0, 2, set()).seqs == [0, 1]
    assert d.more_to("b", 0, 2, set()).seqs == [2, 3]
    d.ack_many([1, 3, 4, 99, 1])  # in flight to a and to b, ready, unknown, twice
    assert (d.inflight, d.inflight_bytes) == (2, 20)
    assert d.consumers["a"].inflight == {0} and d.consumers["b"].inflight == {2}
    assert d.consumers["a"].inflight_bytes == d.consumers["b"].inflight_bytes == 10
    assert [seq in d for seq in range(6)] == [True, False, True, False, False, True]
    d.ack_many([0])  # all in flight to one consumer
    assert d.consumers["a"].inflight == set() and d.consumers["a"].inflight_bytes == 0
    assert (d.inflight, d.inflight_bytes, d.attempts(0)) == (1, 10, 0)
    assert d.more_to("a", 0, 5, set()).seqs == [5]  # the ACKed ready one is skipped


def test_only_really_timed_out_messages_are_redelivered():
    d = Dispatcher(ack_timeout=1.0)
    d.set_consumer("a", 10)
    d.add(0, 1)
    d.add(1, 1)
    d.next_delivery(0.0)
    d.next_delivery(0.5)
    assert d.next_deadline() == 1.0
    assert d.expire(0.99) == []
    assert d.expire(1.0) == [0]
    assert d.next_delivery(1.0).seq == 0  # the timed-out one goes first, attempt 2
    assert d.attempts(0) == 2 and d.redelivered == 1
    assert d.expire(1.2) == []  # message 1 is not due before 1.5


def test_a_batch_times_out_only_for_what_is_still_in_flight_from_that_send():
    """A batch's messages share one deadline: at it, only those still in flight from that
    send are due; ACKed ones, and one NACKed and sent again (its own deadline), are not."""
    d = Dispatcher(ack_timeout=5.0)
    d.set_consumer("a", 10)
    for seq in range(4):
        d.add(seq, 1)
    first = d.next_delivery(0.0)
    assert [first.seq] + d.more_to("a", 0.0, 3, set()).seqs == [0, 1, 2, 3]
    d.ack_many([0, 1])
    assert d.nack(2)
    again = d.next_delivery(1.0)
    assert (again.seq, again.attempt) == (2, 2)
    assert d.next_deadline() == 5.0  # 3 is still in flight from the first send
    assert d.expire(5.0) == [3]
    assert d.next_deadline() == 6.0  # 2's second send
    d.ack(2)
    d.ack(3)
    assert d.next_deadline() is None and d.expire(100.0) == []


def test_a_single_send_made_stale_by_a_later_send_is_not_the_next_deadline():
    """Message 1 is NACKed and sent again while 0 is still in flight: once 0 is ACKed, the
    next deadline is 1's second send's, not its first's."""
    d = Dispatcher(ack_timeout=5.0)
    d.set_consumer("a", 10)
    d.add(0, 1)
    d.add(1, 1)
    assert [d.next_delivery(0.0).seq, d.next_delivery(1.0).seq] == [0, 1]
    assert d.nack(1)
    assert d.next_deadline() == 5.0  # 0's
    again = d.next_delivery(2.0)
    assert (again.seq, again.attempt) == (1, 2)
    d.ack(0)
    assert d.next_deadline() == 7.0
    assert d.expire(6.0) == [] and d.expire(7.0) == [1]


def test_a_send_given_back_does_not_time_the_message_out_once_sent_again():
    """A send that its consumer's full connection could not take is given back; sent again
    later, the message times out a full ACK timeout after that send, not after the first
    (while an older send is still in flight before it)."""
    d = Dispatcher(ack_timeout=5.0)
    d.set_consumer("a", 10)
    d.add(0, 1)
    d.add(1, 1)
    assert d.next_delivery(0.0).seq == 0  # in flight until 5.0
    d.unsent(d.next_delivery(0.0))  # 1: given back
    assert d.attempts(1) == 0 and d.next_deadline() == 5.0
    again = d.next_delivery(3.0)
    assert (again.seq, again.attempt) == (1, 1)
    assert d.expire(5.0) == [0]  # not 1: its send is due at 8.0
    d.ack(0)
    assert d.next_deadline() == 8.0 and d.expire(8.0) == [1]


def test_late_ack_is_honoured_after_the_timeout():
    d = Dispatcher(ack_timeout=1.0)
    d.set_consumer("a", 10)
    d.add(0, 1)
    d.next_delivery(0)
    d.set_consumer("a", 0)  # no credit: it stays in the ready queue once expired
    assert d.expire(2.0) == [0]
    assert d.ack(0) is True  # the late ACK
    d.set_consumer("a", 10)
    assert d.next_delivery(2.0) is None  # not sent again
    assert d.ack(0) is False  # a duplicate ACK is just unknown


def test_nack_redelivers_at_once_and_a_leaving_consumer_gives_back_its_messages():
    d = Dispatcher(ack_timeout=100)
    d.set_consumer("a", 10)
    for seq in range(3):
        d.add(seq, 1)
    for _ in range(3):
        d.next_delivery(0)
    assert d.nack(1)
    assert d.next_delivery(0).seq == 1
    d.set_consumer("b", 10)
    assert d.remove_consumer("a") == [0, 1, 2]
    assert [d.next_delivery(0).consumer for _ in range(3)] == ["b"] * 3


def test_a_backlog_drains_without_duplicates_when_acks_come_in_time():
    d = Dispatcher(ack_timeout=1.0)
    d.set_consumer("a", 32)
    d.set_consumer("b", 32)
    n = 100_000
    for seq in range(n):
        d.add(seq, 100)
    now, seen = 0.0, 0
    while True:
        batch = []
        while (x := d.next_delivery(now)) is not None:
            batch.append(x)
        if not batch:
            break
        now += 0.001
        for x in batch:
            assert x.attempt == 1
            d.ack(x.seq)
            seen += 1
        assert d.expire(now) == []
    assert seen == n and d.redelivered == 0 and len(d) == 0


# --- the queue core --------------------------------------------------------------------------


def core(**limits) -> tuple[QueueCore, FakeStore]:
    store = FakeStore()
    return store.attach(QueueCore(Limits(**limits))), store


def test_producer_ack_only_after_the_batch_is_stored():
    q, store = core()
    q.produce(b"P", [b"m1", b"", b"hello"], 1)
    assert store.replies == []
    q.batch_done(store.done(placed=(0,)))
    assert store.replies == [(b"P", [b"m1", b"1", b""])]


def test_malformed_input_gets_a_failure_ack_with_a_reason():
    q, store = core(max_message_size=4)
    q.produce(b"P", [b"m1"], 1)
    q.produce(b"P", [b"m2", b""], 1)
    q.produce(b"P", [b"m3", b"", b"too big"], 1)
    assert [r[1][:2] for r in store.replies] == [[b"m1", b"0"], [b"m2", b"0"], [b"m3", b"0"]]
    assert store.replies[0][1][3] == wire.MALFORMED.encode()
    assert store.replies[1][1][3] == wire.EMPTY.encode()
    assert b"too large" in store.replies[2][1][3]


def test_a_retried_id_is_stored_once_and_answered_each_time():
    q, store = core()
    q.produce(b"P", [b"m1", b"", b"x"], 1)
    q.produce(b"Q", [b"m1", b"", b"x"], 1)  # retried before the first ACK (another link)
    assert store.appended == [0]
    q.batch_done(store.done(placed=(0,)))
    assert sorted(store.replies) == [(b"P", [b"m1", b"1", b""]), (b"Q", [b"m1", b"1", b""])]
    store.replies.clear()
    q.produce(b"P", [b"m1", b"", b"x"], 1)  # and after it
    assert store.replies == [(b"P", [b"m1", b"1", b""])] and store.appended == [0]
    assert q.counters["duplicates"] == 2 and len(q.messages) == 1


def test_a_failed_write_answers_0_and_forgets_the_message():
    q, store = core()
    q.consumers_changed(1)
    q.produce(b"P", [b"m1", b"", b"x"], 1)
    q.batch_done(store.done(failed=(0,), error="store failed: No space left on device"))
    assert store.replies == [(b"P", [b"m1", b"0", b"", b"store failed: No space left on device"])]
    assert not q.messages and q.next_delivery(0, 0) is None
    q.produce(b"P", [b"m1", b"", b"x"], 1)  # the retry is stored, not deduplicated
    assert store.appended == [0, 1]


def test_queue_full_is_refused():
    q, store = core(max_backlog=50)  # each costs 1 + 8 bytes and 16 for each of 2 frames
    q.produce(b"P", [b"a", b"", b"x" * 8], 1)
    q.produce(b"P", [b"b", b"", b"x" * 8], 1)
    assert store.replies == [(b"P", wire.producer_ack(b"b", False, QUEUE_FULL))]


def test_delivery_frames_and_consumer_acks():
    q, store = core(ack_timeout=2.0)
    q.consumers_changed(1)
    q.produce(b"P", [b"m1", b"h", b"", b"a", b"b"], 1_000)
    d, frames = q.next_delivery(0.0, 5_000)
    key = frames[0]
    assert frames[1:] == [b"5000", b"2000000", b"", b"a", b"b"]
    assert key.startswith(b"1000|") and len(key.split(b"|")[1]) == 36
    q.consumer_ack([key, b"0"])  # failed: again at once
    d2, frames2 = q.next_delivery(0.1, 6_000)
    assert frames2[0] == key and frames2[1] == b"6000"
    q.consumer_ack([key, b"1"])
    assert store.acked == [0] and not q.messages
    q.consumer_ack([key, b"1"])
    assert q.counters["unknown_acks"] == 1


def test_when_the_last_consumer_leaves_its_messages_are_ready_again():
    q, store = core(ack_timeout=100)
    q.consumers_changed(1)
    q.produce(b"P", [b"m1", b"", b"x"], 1)
    d, frames = q.next_delivery(0, 0)
    q.consumers_changed(0)
    assert q.next_delivery(0, 0) is None
    q.consumers_changed(1)
    d2, frames2 = q.next_delivery(0, 0)
    assert frames2[0] == frames[0] and d2.attempt == 2


def test_a_paused_consumer_is_skipped_and_keeps_its_credit():
    d = Dispatcher(ack_timeout=5)
    d.set_consumer("a", 2)
    d.set_consumer("b", 2)
    for seq in range(4):
        d.add(seq, 10)
    d.pause("a")
    got = [d.next_delivery(0) for _ in range(3)]
    assert [g.consumer for g in got[:2]] == ["b", "b"] and got[2] is None
    d.pause("a", False)
    assert d.next_delivery(0).consumer == "a"
    d.pause("nobody")  # unknown: nothing happens


def test_credit_consumers_are_counted_and_bounded():
    from zbroker.services.pzq.core import consumer_side as queue_module

    core = QueueCore()
    assert core.credit_consumer(b"c1", 4) and core.credit_consumer(b"c1", 8)
    assert core.credit_consumers == 1 and core.dispatcher.consumers[b"c1"].credit == 8
    saved = queue_module.MAX_CREDIT_CONSUMERS
    queue_module.MAX_CREDIT_CONSUMERS = 1
    try:
        assert not core.credit_consumer(b"c2", 4)
    finally:
        queue_module.MAX_CREDIT_CONSUMERS = saved
    assert core.consumer_gone(b"c1") == 0 and core.credit_consumers == 0
    assert core.consumer_gone(b"c1") == 0 and core.credit_consumers == 0


def test_refusals_are_counted_by_kind_and_acks_by_latency():
    q, store = core(max_message_size=4, max_messages=2)
    clock = [5_000_000]
    q.clock_us = lambda: clock[0]
    q.produce(b"P", [b"m1"], 1)  # malformed
    q.produce(b"P", [b"m2", b"", b"too big"], 1)
    q.produce(b"P", [b"m3", b"", b"a"], 4_999_000)  # arrived 1 ms before the ACK
    q.produce(b"P", [b"m4", b"", b"b"], 4_998_000)  # 2 ms
    q.produce(b"P", [b"m5", b"", b"c"], 1)  # full: max_messages
    q.batch_done(store.done(placed=(0, 1)))
    assert q.refusals == {"full": 1, "too_large": 1, "invalid": 1, "busy": 0,
                          "store_failed": 0}
    snap = q.ack_latency.snapshot()
    assert snap["count"] == 2 and abs(snap["sum"] - 0.003) < 1e-9
    q.refuse(b"P", b"m6", "Server busy: more than 10 bytes of messages are being received")
    assert q.refusals["busy"] == 1


def test_without_a_clock_no_latency_is_kept():
    q, store = core()
    q.produce(b"P", [b"m1", b"", b"x"], 1)
    q.batch_done(store.done(placed=(0,)))
    assert store.replies and q.ack_latency.count == 0


def test_consumer_acks_one_after_the_other_go_to_the_log_in_one_action():
    from zbroker.services.pzq.core.actions import AckMany, Append, Reply
    q = QueueCore(Limits())
    q.consumers_changed(1)
    for i in range(3):
        q.produce(b"P", [b"m%d" % i, b"", b"x"], 1)
    q.take_output()
    keys = [q.next_delivery(0.0, 1)[1][0] for _ in range(3)]
    q.consumer_ack([keys[0], wire.OK])
    q.consumer_ack([keys[1], wire.OK])
    q.produce(b"P", [b"m3", b"", b"x"], 2)  # an action between: the ACKs after it are apart
    q.consumer_ack([keys[2], wire.OK])
    out = q.take_output()
    log = [a for a in out if type(a) is not Reply]  # (the producers, answered at the ACKs)
    assert [type(a) for a in log] == [AckMany, Append, AckMany]
    assert log[0].seqs == [0, 1] and log[2].seqs == [2]  # in order, each once
    assert [a.frames[0] for a in out if type(a) is Reply] == [b"m0", b"m1", b"m2"]


def test_a_consumer_ack_answers_the_producer_whatever_the_log_does_with_the_record():
    """A message consumed and ACKed owes its producer nothing more: its "1" goes out at the
    consumer's ACK, whether its record still waits (the log will drop it), is being written
    (the log will report it placed) or fails to be written. Each producer is answered once."""
    q, store = core()
    q.consumers_changed(1)
    for i in range(3):
        q.produce(b"P", [b"m%d" % i, b"", b"x"], 1)
    keys = [q.next_delivery(0.0, 1)[1][0] for _ in range(3)]
    assert store.replies == []
    for key in keys:
        q.consumer_ack([key, wire.OK])
    assert store.replies == [(b"P", wire.producer_ack(b"m%d" % i)) for i in range(3)]
    q.unwritten([0])  # the log let go of one record before writing it
    q.batch_done(store.done(placed=(1,), acked=(0,)))  # wrote one
    q.batch_done(store.done(failed=(2,), error="store failed: EIO"))  # failed the last
    assert len(store.replies) == 3 and store.acked == [0, 1, 2]
    q.produce(b"P", [b"m1", b"", b"x"], 1)  # a retry of a consumed one: answered, not stored
    assert store.replies[-1] == (b"P", wire.producer_ack(b"m1")) and len(q.messages) == 0


def test_a_batch_consumers_ack_answers_the_producers_of_single_messages():
    q, store = core()
    q.credit_consumer(b"C", 10)
    for i in range(2):
        q.produce(b"P", [b"m%d" % i, b"", b"x"], 1)
    keys = [q.next_delivery(0.0, 1)[1][0] for _ in range(2)]
    q.consumer_acks(keys, b"C", b"a1")
    assert store.replies == [(b"P", wire.producer_ack(b"m%d" % i)) for i in range(2)]
    q.batch_done(store.done(placed=(0, 1)))
    assert len(store.replies) == 2  # answered once


def test_a_consumer_ack_leaves_a_producer_batch_to_its_record():
    """A producer batch is answered once its record is durable or every message of it was
    let go of by the log: one consumed message does not answer it."""
    q, store = core()
    q.credit_consumer(b"C", 10)
    packed = wire.pack([b"i1", b"i2"], [b"x", b"y"])
    q.produce_batch(b"P", [b"b1", wire.BATCH_HEADER, b"", packed], 1)
    keys = [q.next_delivery(0.0, 1)[1][0] for _ in range(2)]
    q.consumer_ack([keys[0], wire.OK])
    assert store.replies == []
    q.consumer_acks([keys[1]], b"C", b"a1")
    assert store.replies == []
    q.batch_done(store.done(placed=(0, 1)))
    assert [frames[0] for _, frames in store.replies] == [b"b1"]
