"""The credit endpoint of a pzq queue: consumers say READY with a window and never hold more
unACKed messages, so a slow or stuck consumer cannot hoard. Real ``pzq`` processes."""

from __future__ import annotations

import time

import pytest
from helpers import endpoint_accepts, wait_for
from pzq_helpers import dealer, free_port, recv, wait_counter

from pzq.client import Consumer, Producer

FAST = ("--ack-timeout", "400000", "--reaper-frequency", "50000")


def credit_queue(start_pzq, *args: str):
    credit = f"tcp://127.0.0.1:{free_port()}"
    q = start_pzq(*FAST, "--credit-dsn", credit, *args)
    wait_for(lambda: endpoint_accepts(credit), 10, "the credit endpoint")
    return q, credit


def produce(q, n: int, prefix: bytes = b"m") -> None:
    with Producer(q.receive, window=64) as p:
        for i in range(n):
            p.send(prefix + b"%d" % i, msg_id=prefix + b"-%d" % i)
        p.flush(30)


def drain(c: Consumer, idle: float = 1.0, ack: bool = True) -> list[bytes]:
    got = []
    while (m := c.recv(idle)) is not None:
        got.append(m.body)
        if ack:
            c.ack(m)
    return got


def test_a_consumer_never_holds_more_than_its_credit(start_pzq):
    q, credit = credit_queue(start_pzq, "--ack-timeout", "60000000")  # nothing times out
    produce(q, 100)
    with Consumer(credit, credit=5) as c:
        held = drain(c, idle=1.5, ack=False)  # does not ACK: five, then nothing
        assert len(held) == 5
        assert q.counters()["messages_inflight"] == 5
        assert q.counters()["credit_consumers"] == 1


def test_a_stuck_consumer_does_not_starve_a_working_one(start_pzq, ctx):
    """Over the send endpoint, a connected consumer that stops reading absorbs messages
    into its socket buffers until their ACK timeouts; over the credit endpoint it holds its
    credit and no more, and the working consumer gets everything else at once."""
    q, credit = credit_queue(start_pzq, "--ack-timeout", "60000000")  # no timeout rescues it
    stuck = Consumer(credit, credit=3)
    try:
        wait_counter(q, "credit_consumers", lambda n: n == 1)
        produce(q, 2000)
        with Consumer(credit, credit=16) as worker:
            got = drain(worker)
        assert len(got) == 1997 and len(set(got)) == 1997  # all but the three it holds
        assert q.counters()["messages"] == 3 and q.counters()["redelivered"] == 0
    finally:
        stuck.close()


def test_messages_of_a_consumer_that_went_away_are_delivered_to_another(start_pzq):
    q, credit = credit_queue(start_pzq, "--ack-timeout", "3000000")
    produce(q, 20)
    first = Consumer(credit, credit=20)
    held = drain(first, idle=1.0, ack=False)
    assert len(held) == 20
    first.close()  # never ACKs: after the ACK timeout they are another's
    with Consumer(credit, credit=20) as second:
        got = drain(second, idle=5.0)
    assert sorted(got) == sorted(held)


def test_legacy_and_credit_consumers_share_a_queue(start_pzq):
    q, credit = credit_queue(start_pzq)
    with Consumer(q.send) as legacy, Consumer(credit, credit=4) as modern:
        wait_counter(q, "credit_consumers", lambda n: n == 1)
        wait_counter(q, "consumers", lambda n: n == 1)
        produce(q, 400)
        got: dict[str, set[bytes]] = {"legacy": set(), "modern": set()}
        deadline = time.monotonic() + 20
        while len(got["legacy"] | got["modern"]) < 400 and time.monotonic() < deadline:
            for name, c in (("legacy", legacy), ("modern", modern)):
                m = c.recv(0.05)
                if m is not None:
                    got[name].add(m.body)
                    c.ack(m)
    # at least once: a message held past the ACK timeout on a loaded machine may come twice
    assert got["legacy"] | got["modern"] == {b"m%d" % i for i in range(400)}
    assert got["legacy"] and got["modern"]


def test_malformed_ready_is_counted_and_changes_nothing(start_pzq, ctx):
    q, credit = credit_queue(start_pzq)
    s = dealer(ctx, credit)
    for frames in ([b"READY"], [b"READY", b"abc"], [b"READY", b" 1"], [b"READY", b"100001"],
                   [b"READY", b"-1"], [b"READY", b"1", b"extra"], [b"READY", b"1" * 50]):
        s.send_multipart(frames)
    wait_counter(q, "malformed", lambda n: n == 7)
    assert q.counters()["credit_consumers"] == 0
    s.send_multipart([b"READY", b"2"])  # a valid one still works
    produce(q, 3)
    assert len(recv(s)) >= 5 and len(recv(s)) >= 5
    assert q.counters()["credit_consumers"] == 1 and q.counters()["messages_inflight"] == 2


def test_a_credit_consumer_is_known_again_after_the_queue_restarts(start_pzq):
    q, credit = credit_queue(start_pzq)
    with Consumer(credit, credit=4) as c:
        produce(q, 3)
        assert len(drain(c)) == 3
        q = q.restart()  # forgets its consumers; the client says READY again within a second
        wait_for(lambda: endpoint_accepts(credit), 10, "the credit endpoint")
        produce(q, 5, b"n")
        got = drain(c, idle=3.0)
    assert sorted(got) == sorted(b"n%d" % i for i in range(5))


def test_acks_are_confirmed_once_a_crash_cannot_undo_them(start_pzq, ctx):
    q, credit = credit_queue(start_pzq, "--ack-timeout", "60000000")
    produce(q, 50)
    with Consumer(credit, credit=8) as c:
        got = drain(c)
        assert len(got) == 50
        c.confirm(5)
        assert not c.unconfirmed
        c.ack(b"no-such-key")  # not in the queue: answered at once (UNKNOWN)
        c.confirm(5)
    q.kill()
    q = q.restart()
    assert q.counters()["messages"] == 0  # every confirmed ACK survived the SIGKILL
    with Consumer(q.send) as legacy, pytest.raises(ValueError):
        legacy.confirm(1)  # the send endpoint has no confirmations


def test_ready_0_stops_deliveries_and_a_nack_after_it_goes_to_another(start_pzq):
    q, credit = credit_queue(start_pzq, "--ack-timeout", "60000000")
    produce(q, 20)
    with Consumer(credit, credit=5) as leaving:
        held = [leaving.recv(5) for _ in range(5)]
        leaving.stop_taking()  # READY 0
        for m in held[:3]:
            leaving.ack(m)
        leaving.confirm(5)  # the room those ACKs made: nothing more for it
        assert leaving.recv_nowait() is None
        for m in held[3:]:
            leaving.nack(m)
        with Consumer(credit, credit=100) as other:
            got = drain(other)
        assert leaving.recv_nowait() is None
    assert sorted(got) == sorted(b"m%d" % i for i in range(20)
                                 if b"m%d" % i not in {m.body for m in held[:3]})
