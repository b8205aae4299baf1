"""Why brokers do not link (zbroker.cluster.troubles, tcp_table): said at once, then bounded
by the log budget, which counts what it held back."""

from __future__ import annotations

import contextlib
import itertools

import structlog
import zmq
from cluster_cores import Network

from zbroker.cluster import handshake, tcp_table, troubles
from zbroker.cluster.core.actions import Log
from zbroker.cluster.core.diagnosis import Diagnosis
from zbroker.cluster.membership import Hello, Membership
from zbroker.cluster.troubles import OURS, THEIRS, Refusals, Seeds
from zbroker.logs.budget import RATES, LogBudget

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


def test_a_refusal_is_said_first_then_again_at_each_one_under_the_budget_of_its_episode():
    """How often is not decided here (the log budget is): each refusal after the first is
    to be said again, and the lines of one episode share one budget."""
    r = Refusals()
    peer = "tcp://10.0.0.2:5670"
    what, first = r.note(peer, troubles.ANOTHER_KEY, OURS, 0.0)
    assert what == troubles.FIRST and first.times == 1
    for i in range(1, 100):  # ten a second
        assert r.note(peer, troubles.ANOTHER_KEY, OURS, i / 10) == (troubles.AGAIN, first)
    assert first.times == 100 and r.total == {OURS: 100, THEIRS: 0}
    assert r.due(600.0) == []  # (no clock of its own says it again)
    # another peer, or the other side of the link, is said at once too
    assert r.note("10.0.0.3", troubles.ANOTHER_KEY, OURS, 10.0)[0] == troubles.FIRST
    assert r.note(peer, troubles.ANOTHER_KEY, THEIRS, 10.0)[0] == troubles.FIRST
    # an episode ends when the peer links: the next refusal is another, with another budget
    assert [x.side for x in r.linked({peer}, 12.0, quiet=2.0)] == [OURS, THEIRS]
    what, again = r.note(peer, troubles.ANOTHER_KEY, OURS, 13.0)
    assert what == troubles.FIRST and again.times == 1
    assert troubles.budget(f"ours {peer}", again.since) != troubles.budget(f"ours {peer}", 0.0)
    assert troubles.budget("x", 1.0).partition(":")[0] == troubles.BUDGET in RATES


def test_a_guessed_cause_waits_for_a_sure_one():
    r = Refusals(wait=2.0)
    peer = "tcp://10.0.0.2:5670"
    assert r.note(peer, troubles.CLOSED, THEIRS, 0.0, sure=False) is None
    assert r.due(1.0) == []
    what, said = r.note(peer, troubles.PEER_NO_KEY, THEIRS, 1.5)  # the sure one came: said
    assert what == troubles.FIRST and said.why == troubles.PEER_NO_KEY and said.times == 2
    # (said again, still with the sure cause)
    assert r.note(peer, troubles.CLOSED, THEIRS, 1.6, sure=False) == (troubles.AGAIN, said)
    assert r.kept[(peer, THEIRS)].why == troubles.PEER_NO_KEY
    # a guess with no sure cause is said after the wait
    assert r.note("tcp://10.0.0.4:5670", troubles.ANOTHER_KEY, THEIRS, 0.0, sure=False) is None
    (said,) = r.due(2.0)
    assert said.peer == "tcp://10.0.0.4:5670" and said.said and not said.sure
    assert r.due(3.0) == []
    # a sure cause after it: said if it is another, as a correction, once
    what, corrected = r.note("tcp://10.0.0.4:5670", troubles.PEER_NO_KEY, THEIRS, 3.5)
    assert what == troubles.FOUND and corrected.corrected and corrected.times == 2
    assert r.note("tcp://10.0.0.4:5670", troubles.PEER_NO_KEY, THEIRS, 3.6)[0] == troubles.AGAIN
    # the guess was right: nothing more to say than once more
    assert r.note("tcp://10.0.0.5:5670", troubles.NO_KEY_HERE, THEIRS, 0.0, sure=False) is None
    assert len(r.due(2.0)) == 1
    assert r.note("tcp://10.0.0.5:5670", troubles.NO_KEY_HERE, THEIRS, 2.5)[0] == troubles.AGAIN
    assert r.kept[("tcp://10.0.0.5:5670", THEIRS)].sure


def test_refusals_end_when_the_peer_links_and_are_bounded():
    r = Refusals(limit=3)
    for i in range(5):
        r.note(f"10.0.0.{i}", troubles.ANOTHER_KEY, OURS, float(i))
    assert [x.peer for x in r.current(10.0, 30.0)] == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert [x.peer for x in r.current(33.5, 30.0)] == ["10.0.0.4"]  # only the last is recent
    # linked: over once they stopped for a while (one that goes on is kept: not said anew)
    assert r.linked({"10.0.0.3", "tcp://10.0.0.9:5670"}, 4.0, quiet=2.0) == []
    assert [x.peer for x in r.linked({"10.0.0.3"}, 5.0, quiet=2.0)] == ["10.0.0.3"]
    assert [x.peer for x in r.current(10.0, 30.0)] == ["10.0.0.2", "10.0.0.4"]
    assert r.total[OURS] == 5


def test_a_seed_is_said_not_answering_after_its_grace_then_at_each_look_and_when_it_answers():
    seeds = Seeds(["tcp://a:1", "tcp://b:1"], now=0.0, grace=3.0)
    assert seeds.check(set(), 1.0) == []
    assert seeds.check({"tcp://b:1"}, 2.0) == []  # answered in time: nothing to say
    assert seeds.check({"tcp://b:1"}, 3.0) == [("tcp://a:1", Seeds.NOT_ANSWERING, 0.0)]
    for t in (4.0, 30.0, 63.0):  # (the log budget bounds how many of these go out)
        assert seeds.check({"tcp://b:1"}, t) == [("tcp://a:1", Seeds.STILL, 0.0)]
    assert seeds.check({"tcp://b:1", "tcp://a:1"}, 70.0) == [("tcp://a:1", Seeds.ANSWERS, 0.0)]
    assert seeds.check({"tcp://b:1", "tcp://a:1"}, 200.0) == []
    # it stops answering: said again after the grace, from then
    assert seeds.check({"tcp://b:1"}, 300.0) == []
    assert seeds.check({"tcp://b:1"}, 303.0) == [("tcp://a:1", Seeds.NOT_ANSWERING, 300.0)]
    # a seed found to be this broker itself is none
    seeds.retain({"tcp://b:1"})
    assert "tcp://a:1" not in seeds and seeds.check(set(), 1000.0) == []
    assert seeds.check(set(), 1003.0) == [("tcp://b:1", Seeds.NOT_ANSWERING, 1000.0)]


# --- what the operator reads: the lines as the log budget lets them out ---------------------


class Logged:
    """The Log actions of a cluster core through the broker's log budget (its RATES), on
    the core's clock: ``lines``, the event dicts that go out, in order (a flush's too)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lines: list[dict] = []
        self.budget = LogBudget(clock=lambda: self.now,
                                emit=lambda level, event: self.lines.append(event))

    def at(self, now: float, actions: list) -> None:
        self.now = now
        for action in actions:
            if isinstance(action, Log):
                event = {"event": action.event, "level": action.level, **action.fields}
                with contextlib.suppress(structlog.DropEvent):
                    self.lines.append(self.budget(None, action.level, event))

    def flush(self, now: float) -> None:
        """As the broker does every second."""
        self.now = now
        self.budget.flush()

    def told(self, peer: str, prefix: str) -> list[dict]:
        return [e for e in self.lines if e["event"].startswith(prefix)
                and e.get("peer", e.get("seed")) == peer]


def diagnosis(seeds: tuple[str, ...] = ()) -> Diagnosis:
    me = Hello("me", "local", "prod", "tcp://10.0.0.1:5670")
    return Diagnosis(Membership(me, timeout=3, secret=b"s" * 16), seeds, True,
                     "/etc/zbroker/cluster.key", 0.0)


def stood_for(lines: list[dict]) -> int:
    """Refusals the lines stand for: each that goes out for itself, and those it held back
    (a flush's "(held back)" line only for those)."""
    return sum(e.get("suppressed", 0) + (not e["event"].endswith("(held back)")) for e in lines)


def test_a_flood_of_refusals_of_one_peer_is_one_line_then_one_a_minute_that_counts_the_rest():
    d, log = diagnosis(), Logged()
    peer, other = "tcp://10.0.0.2:5670", "10.0.0.3"
    for tenth in range(1800):  # one peer: ten a second for three minutes
        now = tenth / 10
        log.at(now, d.refused(peer, troubles.ANOTHER_KEY, OURS, now))
        if tenth in (300, 310):  # another peer, and the other side of the link, meanwhile
            log.at(now, d.refused(other, troubles.NOT_OUR_KEY, OURS, now))
            log.at(now, d.refused(peer, troubles.ANOTHER_KEY, THEIRS, now))
        if tenth % 10 == 9:
            log.flush(now)
    log.flush(181.0)  # the flood stopped: what it held back is told
    told = log.told(peer, "cluster connection")
    assert [(e["event"], e.get("suppressed")) for e in told] == [
        ("cluster connection refused", None),  # at once, with the fix
        ("cluster connection still refused", 599),  # a minute later, and each minute
        ("cluster connection still refused", 599),
        ("cluster connection still refused (held back)", 599)]
    assert "zbroker reload" in told[0]["fix"]
    assert [e["times"] for e in told[1:]] == [601, 1201, 1800]  # (its count, for status)
    assert stood_for(told) == 1800
    # each peer and side has a budget of its own: said at once, the second held and told
    for who, prefix in ((other, "cluster connection"), (peer, "cluster link")):
        assert [(e["event"].removeprefix(prefix), e.get("suppressed"))
                for e in log.told(who, prefix)] == [
            (" refused", None), (" still refused (held back)", 1)]
    assert stood_for(log.lines) == d.refusals.total[OURS] + d.refusals.total[THEIRS]
    assert len(log.lines) == 4 + 2 + 2


def test_a_peer_refused_anew_after_it_linked_is_said_at_once():
    d, log = diagnosis(), Logged()
    peer = "10.0.0.2"
    for now in (0.0, 0.5, 1.0):
        log.at(now, d.refused(peer, troubles.NOT_OUR_KEY, OURS, now))
    d.refusals.linked({peer}, 5.0, quiet=2.0)  # (as diagnose does once it linked)
    log.at(10.0, d.refused(peer, troubles.ANOTHER_KEY, OURS, 10.0))
    assert [(e["event"], e["why"]) for e in log.lines] == [
        ("cluster connection refused", troubles.NOT_OUR_KEY),
        ("cluster connection refused", troubles.ANOTHER_KEY)]
    log.flush(61.0)  # and the first episode's held back lines are told
    assert log.lines[-1]["event"] == "cluster connection still refused (held back)"
    assert log.lines[-1]["suppressed"] == 2 and log.lines[-1]["why"] == troubles.NOT_OUR_KEY


def test_a_guess_is_said_after_its_wait_and_its_correction_at_once():
    d, log = diagnosis(), Logged()
    peer = "tcp://10.0.0.4:5670"
    for tenth in range(25):  # guesses (the connection closed) for 2.5 s
        now = tenth / 10
        log.at(now, d.refused(peer, troubles.ANOTHER_KEY, THEIRS, now, sure=False))
        if tenth % 10 == 0:
            log.at(now, d.diagnose(now, 1e9 + now))
    assert [(e["event"], e["why"]) for e in log.lines] == [
        ("cluster link refused", troubles.ANOTHER_KEY)]  # said at 2 s, not before
    log.at(3.0, d.refused(peer, troubles.PEER_NO_KEY, THEIRS, 3.0))  # the sure cause
    log.at(3.1, d.refused(peer, troubles.PEER_NO_KEY, THEIRS, 3.1))
    assert [(e["event"], e["why"]) for e in log.lines[1:]] == [
        ("cluster link refused, cause found", troubles.PEER_NO_KEY)]
    log.at(62.0, d.refused(peer, troubles.PEER_NO_KEY, THEIRS, 62.0))
    last = log.lines[-1]
    assert (last["event"], last["why"], last["times"], last["suppressed"]) == (
        "cluster link still refused", troubles.PEER_NO_KEY, 28, 5)  # (4 guesses, the one at 3.1)


def test_a_seed_not_answering_is_said_once_a_minute_and_at_once_when_it_answers():
    net = Network()
    a = net.start("a", seeds=["late"])
    log, looks = Logged(), 0
    while net.now < 150:
        net.run(1)
        said = a.core.diagnosis.diagnose(net.now, 1e9 + net.now)
        looks += len(said)
        log.at(net.now, said)
        log.flush(net.now)
    net.start("late")
    net.run(1, until=net.complete)
    log.at(net.now, a.core.diagnosis.diagnose(net.now, 1e9 + net.now))
    log.flush(net.now + 61)
    said = log.told("tcp://late:5670", "cluster seed")
    assert [e["event"] for e in said] == [
        "cluster seed not answering", "cluster seed still not answering",
        "cluster seed still not answering", "cluster seed answers",  # at once
        "cluster seed still not answering (held back)"]  # the looks of its last minute
    seconds = [e["seconds"] for e in said[:3]]
    assert 3 <= seconds[0] <= 4 and all(60 <= b - a <= 61 for a, b in itertools.pairwise(seconds))
    assert stood_for(said[:3] + said[4:]) == looks  # every look told
    assert said[4]["suppressed"] < 30


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
