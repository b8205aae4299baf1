"""The checker of the pzq fault-injection runs (pzq_faults.check) on event logs made by hand:
it finds what was lost, duplicated (and why) and unexpected, and measures throughput and the
drain, so that a run that breaks a promise cannot pass for a good one."""

from __future__ import annotations

from typing import Any

import pytest
from pzq_faults import (
    WHY_AFTER_ACK,
    WHY_HOSTS,
    WHY_KEYS,
    WHY_NO_ACK,
    Window,
    check,
)

WINDOW = Window(faults_from=100.0, faults_to=110.0, last_heal=120.0, offered_rate=10.0)


def sent(i: str, t: float = 101.0) -> dict[str, Any]:
    return {"t": t, "ev": "sent", "id": i}


def ack(i: str, ok: bool = True, text: str = "", t: float = 101.5) -> dict[str, Any]:
    return {"t": t, "ev": "ack", "id": i, "ok": ok, "text": text}


def delivered(i: str, key: str = "k", host: str = "h1", t: float = 102.0) -> dict[str, Any]:
    return {"t": t, "ev": "delivered", "id": i, "key": key, "host": host}


def acked(i: str, key: str = "k", t: float = 102.1) -> dict[str, Any]:
    return {"t": t, "ev": "acked", "id": i, "key": key}


def one(i: str, key: str | None = None) -> list[dict[str, Any]]:
    """A message sent, ACKed "1", delivered once and ACKed by its consumer."""
    key = key or f"k-{i}"
    return [sent(i), ack(i), delivered(i, key), acked(i, key)]


def test_a_clean_run_meets_every_target():
    events = one("h1.1.1") + one("h1.1.2") + one("h2.1.1")
    r = check(events, WINDOW)
    assert (r.sent, r.acked, r.delivered, r.deliveries) == (3, 3, 3, 3)
    assert r.lost == [] and r.duplicates == {} and r.unexpected == []
    # 3 ACKed in the 10 s of faults, 10/s offered: 30 %, under the 80 % target
    assert r.throughput == pytest.approx(0.3)
    assert [t[0] for t in r.targets() if not t[3]] == ["throughput"]


def test_an_acked_message_never_delivered_is_lost_with_or_without_replication_failed():
    events = [*one("h1.1.1"), sent("h1.1.2"), ack("h1.1.2"),
              sent("h1.1.3"), ack("h1.1.3", text="REPLICATION_FAILED")]
    r = check(events, WINDOW)
    assert r.lost == ["h1.1.2", "h1.1.3"]
    assert r.replication_failed == 1
    assert not r.targets()[0][3]
    assert "lost        2" in r.text() and "FAIL" in r.text()


def test_refused_or_unanswered_messages_are_not_promised_so_not_lost():
    events = [sent("h1.1.1"), ack("h1.1.1", ok=False, text="Queue full"),
              sent("h1.1.2"), {"t": 105.0, "ev": "timeout", "id": "h1.1.2"},
              sent("h1.1.3")]
    r = check(events, WINDOW)
    assert r.lost == []
    assert r.refused == {"Queue full": 1}
    assert r.unanswered == 2  # the timeout and the one with no answer at all


def test_lost_ids_are_in_send_order_numerically():
    events = [e for n in (10, 9, 2) for e in (sent(f"h1.1.{n}"), ack(f"h1.1.{n}"))]
    assert check(events, WINDOW).lost == ["h1.1.2", "h1.1.9", "h1.1.10"]


def test_duplicates_say_why_each_was_delivered_again():
    events = (
        one("h1.1.1", "a")
        + [delivered("h1.1.1", "b", host="h2", t=103.0)]  # taken over by a peer
        + one("h1.1.2", "c") + [delivered("h1.1.2", "d", t=103.0)]  # one host, a new key
        + one("h1.1.3", "e") + [delivered("h1.1.3", "e", t=103.0)]  # its ACK was lost
        + [sent("h1.1.4"), ack("h1.1.4"), delivered("h1.1.4", "f"),
           delivered("h1.1.4", "f", t=108.0)]  # never ACKed: its consumer stopped
        + one("h1.1.5"))
    r = check(events, WINDOW)
    assert r.duplicates == {"h1.1.1": WHY_HOSTS, "h1.1.2": WHY_KEYS,
                            "h1.1.3": WHY_AFTER_ACK, "h1.1.4": WHY_NO_ACK}
    assert r.duplicate_percent == pytest.approx(80.0)  # 4 of the 5 ACKed ids
    assert r.deliveries == 9 and r.delivered == 5
    assert not r.targets()[1][3]
    assert r.lost == []


def test_an_ack_after_the_second_delivery_does_not_make_it_a_redelivery_after_ack():
    events = [sent("h1.1.1"), ack("h1.1.1"), delivered("h1.1.1", "k", t=102.0),
              delivered("h1.1.1", "k", t=103.0), acked("h1.1.1", "k", t=104.0)]
    assert check(events, WINDOW).duplicates == {"h1.1.1": WHY_NO_ACK}


def test_a_few_duplicates_stay_within_the_bound():
    events = [e for n in range(1, 101) for e in one(f"h1.1.{n}")]
    events.append(delivered("h1.1.7", "k-h1.1.7", host="h3", t=103.0))
    r = check(events, WINDOW)
    assert r.duplicate_percent == pytest.approx(1.0)
    assert r.targets()[1][3]


def test_a_delivery_of_an_id_never_sent_is_unexpected():
    events = [*one("h1.1.1"), delivered("h7.1.1", "x"), delivered("garbage", "y")]
    r = check(events, WINDOW)
    assert r.unexpected == ["garbage", "h7.1.1"]
    assert r.lost == []
    assert not r.targets()[2][3]


def test_throughput_counts_the_acks_within_the_faults_only():
    events = []
    for n in range(100):  # one ACK every 0.2 s from 95 s to 115 s: 50 in [100, 110]
        t = 95.0 + n * 0.2
        events += [sent(f"h1.1.{n}", t), ack(f"h1.1.{n}", t=t + 0.01)]
    r = check(events, WINDOW)
    assert r.throughput == pytest.approx(5.0, abs=0.11)
    measured, target, met = r.targets()[3][1:]
    assert not met and "50 %" in measured and target == ">= 80 %"


def test_drain_is_from_the_last_heal_until_all_sent_before_it_was_delivered():
    events = [*one("h1.1.1"), sent("h1.1.2"), ack("h1.1.2"),
              delivered("h1.1.2", "k2", t=127.5), delivered("h1.1.2", "k2", t=140.0),
              sent("h1.1.3", t=121.0), delivered("h1.1.3", "k3", t=150.0)]
    r = check(events, WINDOW)
    # the redelivery at 140 s is not new; h1.1.3 was sent after the heal
    assert r.drain_s == pytest.approx(7.5)
    assert check(one("h1.1.1"), WINDOW).drain_s == 0.0  # all delivered before the heal
    assert check([sent("h1.1.1")], WINDOW).drain_s is None


def test_the_first_answer_of_an_id_counts():
    events = [sent("h1.1.1"), ack("h1.1.1", ok=False, text="store failed: disk full"),
              ack("h1.1.1", ok=True), delivered("h1.1.1")]
    r = check(events, WINDOW)
    assert r.acked == 0 and r.refused == {"store failed: disk full": 1}
