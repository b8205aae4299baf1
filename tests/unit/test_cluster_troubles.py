"""Why brokers do not link (zbroker.cluster.troubles, tcp_table): once, then counted."""

from __future__ import annotations

import zmq

from zbroker.cluster import handshake, tcp_table, troubles
from zbroker.cluster.troubles import OURS, THEIRS, Refusals, Seeds

PROTOCOL, NO_DETAIL = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


def test_causes_from_what_libzmq_says():
    crypto, mismatch = zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC, \
        zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
    assert handshake.cause(PROTOCOL, crypto, True, OURS) == troubles.ANOTHER_KEY
    assert handshake.cause(PROTOCOL, mismatch, True, OURS) == troubles.PEER_NO_KEY
    assert handshake.cause(PROTOCOL, mismatch, False, THEIRS) == troubles.NO_KEY_HERE
    # our link closed by a keyed peer that could not read our HELLO: another key, a guess
    assert handshake.cause(NO_DETAIL, 104, True, THEIRS) == troubles.ANOTHER_KEY
    assert not handshake.sure(NO_DETAIL) and handshake.sure(PROTOCOL)
    # ours closed by a keyed peer, when we have no key: a guess as well
    assert handshake.cause(NO_DETAIL, 104, False, THEIRS) == troubles.NO_KEY_HERE
    assert handshake.cause(NO_DETAIL, 104, True, OURS) == troubles.CLOSED
    assert "0x10000001" in handshake.cause(PROTOCOL, 0x10000001, True, OURS)


def test_advice_names_the_key_file_and_the_reload():
    fix = troubles.advice(troubles.ANOTHER_KEY, "/etc/zbroker/cluster.key")
    assert "/etc/zbroker/cluster.key" in fix and "zbroker reload" in fix
    assert "cluster.key_file" in troubles.advice(troubles.NO_KEY_HERE, None)


def test_a_refusal_is_said_once_then_counted_then_summed_up_at_a_bounded_rate():
    r = Refusals(every=60.0)
    first = r.note("tcp://10.0.0.2:5670", troubles.ANOTHER_KEY, OURS, 0.0)
    assert first is not None and first.times == 1
    for i in range(1, 100):  # ten a second
        assert r.note("tcp://10.0.0.2:5670", troubles.ANOTHER_KEY, OURS, i / 10) is None
    assert r.due(30.0) == []
    (summary,) = r.due(60.0)
    assert summary.times == 100 and summary.told_at is not None
    assert r.due(61.0) == []  # nothing new since
    r.note("tcp://10.0.0.2:5670", troubles.ANOTHER_KEY, OURS, 70.0)
    assert r.due(100.0) == []  # a minute after the last summary, not before
    assert [s.times for s in r.due(120.0)] == [101]
    assert r.total == {OURS: 101, THEIRS: 0}
    # another peer, or the other side of the link, is said once too
    assert r.note("10.0.0.3", troubles.ANOTHER_KEY, OURS, 121.0) is not None
    assert r.note("tcp://10.0.0.2:5670", troubles.ANOTHER_KEY, THEIRS, 121.0) is not None


def test_a_guessed_cause_waits_for_a_sure_one():
    r = Refusals(wait=2.0)
    peer = "tcp://10.0.0.2:5670"
    assert r.note(peer, troubles.CLOSED, THEIRS, 0.0, sure=False) is None
    assert r.due(1.0) == []
    said = r.note(peer, troubles.PEER_NO_KEY, THEIRS, 1.5)  # the sure one came: said
    assert said is not None and said.why == troubles.PEER_NO_KEY and said.times == 2
    assert r.note(peer, troubles.CLOSED, THEIRS, 1.6, sure=False) is None  # still sure
    assert r.kept[(peer, THEIRS)].why == troubles.PEER_NO_KEY
    # a guess with no sure cause is said after the wait
    assert r.note("tcp://10.0.0.4:5670", troubles.ANOTHER_KEY, THEIRS, 0.0, sure=False) is None
    (said,) = r.due(2.0)
    assert said.peer == "tcp://10.0.0.4:5670" and said.told_at is None
    assert r.due(3.0) == []
    # a sure cause after it: said again if it is another, as a correction
    corrected = r.note("tcp://10.0.0.4:5670", troubles.PEER_NO_KEY, THEIRS, 3.5)
    assert corrected is not None and corrected.corrected and corrected.times == 2
    # the guess was right: nothing more to say
    assert r.note("tcp://10.0.0.5:5670", troubles.NO_KEY_HERE, THEIRS, 0.0, sure=False) is None
    assert len(r.due(2.0)) == 1
    assert r.note("tcp://10.0.0.5:5670", troubles.NO_KEY_HERE, THEIRS, 2.5) is None
    assert r.kept[("tcp://10.0.0.5:5670", THEIRS)].sure


def test_refusals_end_when_the_peer_links_and_are_bounded():
    r = Refusals(limit=3)
    for i in range(5):
        r.note(f"10.0.0.{i}", troubles.ANOTHER_KEY, OURS, float(i))
    assert [x.peer for x in r.current(10.0, 30.0)] == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert [x.peer for x in r.current(33.5, 30.0)] == ["10.0.0.4"]  # only the last is recent
    # linked: over once they stopped for a while (one that goes on is kept: not said again)
    assert r.linked({"10.0.0.3", "tcp://10.0.0.9:5670"}, 4.0, quiet=2.0) == []
    assert [x.peer for x in r.linked({"10.0.0.3"}, 5.0, quiet=2.0)] == ["10.0.0.3"]
    assert [x.peer for x in r.current(10.0, 30.0)] == ["10.0.0.2", "10.0.0.4"]
    assert r.total[OURS] == 5


def test_a_seed_is_said_not_answering_once_then_at_a_bounded_rate_and_when_it_answers():
    seeds = Seeds(["tcp://a:1", "tcp://b:1"], now=0.0, grace=3.0, every=60.0)
    assert seeds.check(set(), 1.0) == []
    assert seeds.check({"tcp://b:1"}, 2.0) == []  # answered in time: nothing to say
    assert seeds.check({"tcp://b:1"}, 3.0) == [("tcp://a:1", Seeds.NOT_ANSWERING, 0.0)]
    assert seeds.check({"tcp://b:1"}, 30.0) == []
    assert seeds.check({"tcp://b:1"}, 63.0) == [("tcp://a:1", Seeds.STILL, 0.0)]
    assert seeds.check({"tcp://b:1", "tcp://a:1"}, 70.0) == [("tcp://a:1", Seeds.ANSWERS, 0.0)]
    assert seeds.check({"tcp://b:1", "tcp://a:1"}, 200.0) == []
    # it stops answering: said again after the grace, from then
    assert seeds.check({"tcp://b:1"}, 300.0) == []
    assert seeds.check({"tcp://b:1"}, 303.0) == [("tcp://a:1", Seeds.NOT_ANSWERING, 300.0)]
    # a seed found to be this broker itself is none
    seeds.retain({"tcp://b:1"})
    assert "tcp://a:1" not in seeds and seeds.check(set(), 1000.0) == []
    assert seeds.check(set(), 1003.0) == [("tcp://b:1", Seeds.NOT_ANSWERING, 1000.0)]


TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1626 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100E70A:1626 0200E70A:9C40 06 00000000:00000000 03:00001770 00000000     0        0 0 3
   2: 0100E70A:1626 0300E70A:9C41 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   3: 0100E70A:D431 0200E70A:1626 06 00000000:00000000 03:00001770 00000000     0        0 0 3
   4: 0100E70A:1626 0200E70A:9C42 04 00000000:00000000 03:00001770 00000000     0        0 0 3
   5: garbage
"""
TABLE6 = """\
  sl  local_address                         remote_port                           st
   0: 0000000000000000FFFF00000100E70A:1626 0000000000000000FFFF00000400E70A:A000 06 0
   1: 000080FE00000000FF0000000100E70A:1626 000080FE00000000FF0000000500E70A:A001 06 0
"""


def test_the_connections_we_closed_at_our_port_name_the_peers():
    # listening and established ones, and those at another local port, are not
    assert tcp_table.parse(TABLE, 5670) == {("10.231.0.2", 40000), ("10.231.0.2", 40002)}
    assert tcp_table.parse(TABLE, 1) == set()
    found = tcp_table.parse(TABLE6, 5670)
    assert ("10.231.0.4", 40960) in found  # an IPv4-mapped address as IPv4
    assert len(found) == 2
