"""Cluster membership without sockets: admission, heartbeats, loss, new lives, contacts."""

import dataclasses

import pytest

from zbroker.cluster.membership import PROTOCOL_VERSION, Hello, Membership

ME = Hello("me", "local", "prod", "tcp://10.0.0.1:5670")
ZPIPES = {"directory": True, "fanout": True, "write_frames": True, "confirm": True}
SECRET = b"s" * 16
NONCES = Membership(ME, secret=SECRET, timeout=3)  # our nonces, as a peer echoes them


def hello(peer="b", reply=False, cluster="prod", version=PROTOCOL_VERSION, proven=True,
          endpoint=None):
    """A HELLO from ``peer``; ``proven``: it echoes our nonce (it answered us there)."""
    endpoint = endpoint or f"tcp://{peer}:5670"
    return Hello(peer, "hostb", cluster, endpoint, version, reply, nonce=f"n-{peer}",
                 echo=NONCES.nonce(endpoint) if proven else "",
                 features={"zpipes": ZPIPES, "pzq": {}})


def test_hello_admits_and_asks_for_a_reply():
    m = Membership(ME, secret=SECRET, timeout=3)
    change = m.hello(hello(), now=0)
    assert [p.id for p in change.joined] == ["b"] and change.reply_hello_to == "tcp://b:5670"
    assert m.hello(hello(reply=True), now=0.1).joined == []  # a reply to a known peer


def test_other_clusters_versions_and_ourselves_are_refused():
    m = Membership(ME, secret=SECRET, timeout=3)
    assert "not ours" in m.hello(hello(cluster="test"), 0).refused
    assert "protocol version" in m.hello(hello(version=99), 0).refused
    assert m.hello(Hello("me", "x", "prod", "tcp://x:1"), 0).refused
    assert "another broker" in m.hello(hello(), 0, sender="c").refused
    assert m.peers == {}


def test_silence_for_timeout_loses_the_peer_any_traffic_keeps_it():
    m = Membership(ME, secret=SECRET, timeout=3, interval=1)
    m.hello(hello(), 0)
    for t in range(1, 10):
        m.heard("b", t)
        to_ping, change = m.due(t + 0.5)
        assert change.left == []
    for t in (10.5, 11.5):  # (our timers run every interval at least)
        assert m.due(t)[1].left == []
    to_ping, change = m.due(12.0)
    assert [(p.id, why) for p, why in change.left] == [("b", "silent for 3.0 s")]
    assert not m.heard("b", 12.1)  # traffic of a lost peer is ignored


def test_time_this_broker_did_not_run_is_not_its_peers_silence():
    """Resumed after SIGSTOP (or a blocked loop), a broker's timers come late: the time it
    did not run is credited to its peers, whose traffic waits unread, so it does not declare
    them lost before reading it; a peer that stays silent is lost a timeout later."""
    m = Membership(ME, secret=SECRET, timeout=3, interval=1)
    m.hello(hello(), 0)
    m.hello(hello("c"), 0)
    m.heard("b", 1.0)
    m.heard("c", 1.0)
    assert m.due(1.0)[1].left == []
    to_ping, change = m.due(7.0)  # 6 s late: paused
    assert change.stalled == pytest.approx(5.0) and change.left == []
    m.heard("b", 7.05)  # what b sent meanwhile, read now
    assert m.due(7.9)[1].left == []
    _, change = m.due(8.9)
    assert [p.id for p, _ in change.left] == []
    m.heard("b", 9.0)
    _, change = m.due(9.5)
    assert change.stalled == 0.0
    assert [p.id for p, _ in change.left] == ["c"]  # silent for 3 s of our running
    assert "b" in m.peers


def test_ping_only_when_nothing_was_sent():
    m = Membership(ME, secret=SECRET, timeout=3, interval=1)
    m.hello(hello(), 0)
    m.heard("b", 0.9)
    m.sent("b", 0.9)
    assert m.due(1.5)[0] == []
    assert [p.id for p in m.due(2.0)[0]] == ["b"]


def test_a_fresh_hello_from_a_known_peer_starts_a_new_life():
    m = Membership(ME, secret=SECRET, timeout=3, interval=1)
    first = m.hello(hello(), 0).joined[0]
    change = m.hello(hello(), 5)  # it lost us (partition) and starts afresh
    assert [p.life for p, _ in change.left] == [first.life]
    assert change.joined[0].life != first.life


def test_hellos_crossing_when_brokers_meet_do_not_churn():
    m = Membership(ME, secret=SECRET, timeout=3, interval=1)
    m.hello(hello(), 0)
    change = m.hello(hello(), 0.2)
    assert change.left == [] and change.joined == [] and change.reply_hello_to


def test_bye_leaves_at_once():
    m = Membership(ME, secret=SECRET, timeout=3)
    m.hello(hello(), 0)
    assert [p.id for p, _ in m.bye("b").left] == ["b"]
    assert m.bye("b").left == []


def test_hello_wire_form_round_trips_and_rejects_junk():
    h = hello(reply=True)
    assert Hello.from_dict(h.to_dict()) == h
    assert Hello.from_dict({"id": "x"}) is None
    assert Hello.from_dict("junk") is None


def test_hello_says_fan_out_and_a_broker_of_before_is_taken_without_it():
    m = Membership(ME, secret=SECRET, timeout=3)
    h = hello()
    assert h.to_dict()["fanout"] is True and Hello.from_dict(h.to_dict()).features == h.features
    assert m.hello(h, 0).joined[0].features["zpipes"]["fanout"]
    old = {k: v for k, v in hello("c").to_dict().items() if k not in ("fanout", "services")}
    assert Hello.from_dict(old).features["zpipes"]["fanout"] is False
    assert m.hello(Hello.from_dict(old), 0).joined[0].features["zpipes"]["fanout"] is False
    assert h.to_dict()["write_frames"] is True and m.peers["b"].features["zpipes"]["write_frames"]
    old = {k: v for k, v in hello("d").to_dict().items()
           if k not in ("write_frames", "services")}
    assert m.hello(Hello.from_dict(old), 0).joined[0].features["zpipes"]["write_frames"] is False


def test_hello_carries_each_services_features_and_a_broker_of_before_is_read_as_zpipes():
    """The cluster carries what each service says of itself without knowing what it means; a
    broker of before says ZPIPES's flags at the top level, and is still told them there."""
    h = hello()
    said = h.to_dict()
    assert said["services"] == {"zpipes": ZPIPES, "pzq": {}}
    assert {k: said[k] for k in ZPIPES} == ZPIPES  # what a broker of before reads
    before = {k: v for k, v in said.items() if k != "services"}
    assert Hello.from_dict(before).features == {"zpipes": ZPIPES}
    before = {k: v for k, v in before.items() if k not in ZPIPES}
    assert Hello.from_dict(before).features == {"zpipes": dict.fromkeys(ZPIPES, False)}
    odd = {**said, "services": {"zpipes": {"fanout": True}, "x": "junk", "y": {"n": 1}}}
    assert Hello.from_dict(odd).features == {"zpipes": {"fanout": True}, "y": {"n": 1}}
    m = Membership(Hello("me", "local", "prod", "tcp://m:1", features=h.features), timeout=3)
    assert m.greeting("tcp://b:5670", reply=False).features == h.features  # what we say
    plain = Hello("e", "hoste", "prod", "tcp://e:5670")  # a broker without ZPIPES
    assert plain.to_dict()["fanout"] is False and plain.to_dict()["services"] == {}


def test_a_closed_connection_loses_the_peer_after_the_grace_not_the_timeout():
    m = Membership(ME, secret=SECRET, timeout=10, interval=3, suspect_grace=1)
    m.hello(hello(), 0)
    m.disconnected("tcp://b:5670", 2.0)
    m.disconnected("tcp://b:5670", 2.5)  # a second event does not move the start
    assert m.next_deadline() == 3.0
    assert m.due(2.9)[1].left == []
    (peer, why), = m.due(3.0)[1].left
    assert peer.id == "b" and why.startswith("its connection closed")


def test_a_connection_made_again_or_traffic_clears_the_suspicion():
    m = Membership(ME, secret=SECRET, timeout=10, interval=3, suspect_grace=1)
    m.hello(hello(), 0)
    m.disconnected("tcp://b:5670", 1.0)
    m.connected("tcp://b:5670")  # it was only the link
    assert m.due(5.0)[1].left == []
    m.disconnected("tcp://b:5670", 6.0)
    assert m.heard("b", 6.5)  # its own traffic still comes: alive
    assert m.due(8.0)[1].left == []
    m.disconnected("tcp://other:1", 8.0)  # someone else's endpoint: nothing
    assert m.due(9.0)[1].left == [] and "b" in m.peers


def test_the_default_grace_is_a_sixth_of_the_timeout_at_least_half_a_second():
    assert Membership(ME, secret=SECRET, timeout=3).suspect_grace == 0.5
    assert Membership(ME, secret=SECRET, timeout=12).suspect_grace == 2.0
    assert Membership(ME, secret=SECRET, timeout=0.3).suspect_grace == 0.3


def test_a_stranger_is_asked_at_the_endpoint_it_claims_and_admitted_once_it_answers():
    m = Membership(ME, secret=SECRET, timeout=3)
    change = m.hello(hello(proven=False), 0, sender="b")
    assert change.joined == [] and change.challenge == "tcp://b:5670" and m.peers == {}
    ours = m.greeting("tcp://b:5670", reply=False)  # what we say there
    assert ours.echo == "n-b" and ours.nonce == m.nonce("tcp://b:5670") and not ours.reply
    assert m.nonce("tcp://c:5670") != ours.nonce
    # a wrong echo is no answer
    forged = Hello("b", "hostb", "prod", "tcp://b:5670", nonce="n-b", echo="0" * 32)
    assert m.hello(forged, 0.1, sender="b").joined == []
    change = m.hello(hello(), 0.2, sender="b")  # it answered: it got what we sent there
    assert [p.id for p in change.joined] == ["b"] and change.reply_hello_to == "tcp://b:5670"


@pytest.mark.parametrize("endpoint", [
    "tcp://nonsense", "tcp://10.0.0.2:notaport", "tcp://*:5670", "tcp://:5670",
    "tcp://10.0.0.2:0", "tcp://10.0.0.2:70000", "inproc://zeromq.zap.01", "ipc://@/zpipes/local",
    "udp://10.0.0.2:1", "tcp://" + "x" * 300 + ":1",
])
def test_endpoints_a_peer_cannot_be_at_are_refused_before_anything_is_made(endpoint):
    m = Membership(ME, secret=SECRET, timeout=3)
    change = m.hello(hello(proven=False, endpoint=endpoint), 0)
    assert change.refused and change.challenge is None and m.contacts == {}


def test_pending_contacts_learned_from_hellos_are_bounded_oldest_first():
    m = Membership(ME, secret=SECRET, timeout=3, max_pending=4)
    m.add_contact("tcp://static:5670", 0, pinned=True)
    dropped = []
    for i in range(10):
        dropped += m.hello(hello(f"x{i}", proven=False), i).dropped
    assert dropped == [f"tcp://x{i}:5670" for i in range(6)]
    assert list(m.contacts) == ["tcp://static:5670"] + [f"tcp://x{i}:5670" for i in range(6, 10)]
    # a peer's contact does not count, and is never given up while it is a peer
    m.hello(hello("x9"), 10)
    assert m.hello(hello("y", proven=False), 11).dropped == []
    assert "tcp://x9:5670" in m.contacts


def test_pending_contacts_are_given_up_after_the_contact_timeout_pinned_ones_never():
    m = Membership(ME, secret=SECRET, timeout=3, interval=10, contact_timeout=5)
    m.add_contact("tcp://static:5670", 0, pinned=True)
    m.hello(hello("x", proven=False), 1)
    m.hello(hello("b", proven=False), 1)
    m.hello(hello("b"), 1.1)  # b answered: a peer
    assert m.next_deadline() == 4.1  # b's silence; x expires at 6
    m.heard("b", 5.0)
    assert m.due(5.9)[1].dropped == []
    assert m.due(6.0)[1].dropped == ["tcp://x:5670"]
    assert set(m.contacts) == {"tcp://static:5670", "tcp://b:5670"}
    assert [p.id for p, _ in m.due(8.0)[1].left] == ["b"]
    assert m.due(12.9)[1].dropped == []  # b's contact is pending again since it left
    assert m.due(13.0)[1].dropped == ["tcp://b:5670"]
    assert list(m.contacts) == ["tcp://static:5670"] and m.next_deadline() == float("inf")
    assert [c.endpoint for c in m.unanswered()] == ["tcp://static:5670"]


def exchange(a, b, a_at, b_at, first):
    """Deliver HELLOs between two memberships until none is left; ``first``: the HELLOs said at
    the start, as (to, hello). Returns how many were delivered."""
    queue, n = list(first), 0
    nodes = {a_at: a, b_at: b}
    while queue:
        to, h = queue.pop(0)
        n += 1
        assert n < 20, "HELLOs without end"
        node = nodes[to]
        change = node.hello(h, 0.0, sender=h.id)
        assert not change.refused
        for target, reply in ((change.challenge, False), (change.reply_hello_to, True)):
            if target:
                queue.append((target, node.greeting(target, reply)))
    return n


@pytest.mark.parametrize("crossing", [False, True])
def test_two_brokers_meet(crossing):
    a_at, b_at = "tcp://10.0.0.1:5670", "tcp://10.0.0.2:5670"
    a = Membership(Hello("a", "ha", "prod", a_at), timeout=3)
    b = Membership(Hello("b", "hb", "prod", b_at), timeout=3)
    a.add_contact(b_at, 0)
    first = [(b_at, a.greeting(b_at, reply=False))]
    if crossing:
        b.add_contact(a_at, 0)
        first.append((a_at, b.greeting(a_at, reply=False)))
    exchange(a, b, a_at, b_at, first)
    assert list(a.peers) == ["b"] and list(b.peers) == ["a"]
    assert a.unanswered() == [] and b.unanswered() == []


def test_a_broker_that_lost_its_peer_starts_afresh_without_a_new_challenge():
    a_at, b_at = "tcp://10.0.0.1:5670", "tcp://10.0.0.2:5670"
    a = Membership(Hello("a", "ha", "prod", a_at), timeout=3)
    b = Membership(Hello("b", "hb", "prod", b_at), timeout=3)
    a.add_contact(b_at, 0)
    exchange(a, b, a_at, b_at, [(b_at, a.greeting(b_at, reply=False))])
    life = b.peers["a"].life
    a.bye("b", 5.0)  # a lost b (a partition b did not notice)
    change = b.hello(a.greeting(b_at, reply=False), 5.0, sender="a")
    assert change.challenge is None and [p.life for p, _ in change.left] == [life]
    assert change.joined and change.reply_hello_to == a_at


def test_a_loss_right_after_the_meeting_still_starts_afresh_on_both_sides():
    """A broker that loses its peer within a heartbeat interval of meeting it (a link that
    came back flaps, a send fails): its new HELLO carries a new session, so the peer ends the
    old life instead of taking the HELLO for one that crossed at the meeting, and neither
    keeps pipe ends the other has forgotten."""
    a_at, b_at = "tcp://10.0.0.1:5670", "tcp://10.0.0.2:5670"
    a = Membership(Hello("a", "ha", "prod", a_at), timeout=3, interval=1)
    b = Membership(Hello("b", "hb", "prod", b_at), timeout=3, interval=1)
    a.add_contact(b_at, 0)
    exchange(a, b, a_at, b_at, [(b_at, a.greeting(b_at, reply=False))])
    life = b.peers["a"].life
    crossing = a.greeting(b_at, reply=False)  # said again before a saw b's answer
    assert b.hello(crossing, 0.2, sender="a").left == []
    a.bye("b", 0.3)
    change = b.hello(a.greeting(b_at, reply=False), 0.3, sender="a")
    assert [p.life for p, _ in change.left] == [life]
    assert change.joined and change.reply_hello_to == a_at


def test_the_session_crosses_the_wire_and_a_broker_of_before_sends_none():
    m = Membership(ME, secret=SECRET, timeout=3)
    m.add_contact("tcp://b:5670", 0)
    h = m.greeting("tcp://b:5670", reply=False)
    assert h.session and Hello.from_dict(h.to_dict()).session == h.session
    old = {k: v for k, v in h.to_dict().items() if k != "session"}
    assert Hello.from_dict(old).session == ""


def test_a_hello_names_the_session_its_sender_admitted_and_a_broker_of_before_none():
    m = Membership(ME, secret=SECRET, timeout=3)
    m.hello(dataclasses.replace(hello(), session="theirs"), 0)
    assert m.greeting("tcp://b:5670", reply=True).admitted == "theirs"
    assert m.greeting("tcp://c:5670", reply=False).admitted == ""  # no peer there
    h = m.greeting("tcp://b:5670", reply=True)
    assert Hello.from_dict(h.to_dict()).admitted == "theirs"
    old = {k: v for k, v in h.to_dict().items() if k != "admitted"}
    assert Hello.from_dict(old).admitted == ""


def test_only_an_answer_at_its_endpoint_naming_another_session_of_ours_ends_a_life():
    """A peer's HELLO that names a session of ours we do not have with it ends our life of
    it, and we say HELLO again (with ours), only if it echoes our nonce for its endpoint."""
    m = Membership(ME, secret=SECRET, timeout=3)
    m.add_contact("tcp://b:5670", 0)
    m.hello(hello(), 0)
    ours = m.contacts["tcp://b:5670"].session
    assert m.hello(dataclasses.replace(hello(reply=True), admitted=ours), 1).left == []
    forged = dataclasses.replace(hello(reply=True, proven=False), admitted="another")
    assert m.hello(forged, 1).left == [] and list(m.peers) == ["b"]
    change = m.hello(dataclasses.replace(hello(reply=True), admitted="another"), 1)
    assert [p.id for p, _ in change.left] == ["b"] and change.joined == []
    assert change.challenge == "tcp://b:5670" and m.peers == {}
    assert m.greeting("tcp://b:5670", reply=False).session not in (ours, "another")


def test_only_our_own_hello_makes_us_give_up_a_contact_that_is_ourselves():
    m = Membership(ME, secret=SECRET, timeout=3)
    m.add_contact("tcp://10.0.0.1:5670", 0)  # a static list that names us too
    m.add_contact("tcp://b:5670", 0)
    ours = m.greeting("tcp://10.0.0.1:5670", reply=False)
    assert m.own_contact(ours) == "tcp://10.0.0.1:5670"
    forged = Hello("me", "x", "prod", "tcp://b:5670", nonce="0" * 32)  # our id, not our nonce
    assert m.own_contact(forged) is None
    assert m.hello(forged, 0).refused == "that is this broker"
    assert m.own_contact(hello()) is None
