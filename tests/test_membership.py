"""Cluster membership without sockets: admission, heartbeats, loss, new lives."""

from zbroker.cluster.membership import PROTOCOL_VERSION, Hello, Membership

ME = Hello("me", "local", "prod", "tcp://10.0.0.1:5670")


def hello(peer="b", reply=False, cluster="prod", version=PROTOCOL_VERSION):
    return Hello(peer, "hostb", cluster, f"tcp://{peer}:5670", version, reply)


def test_hello_admits_and_asks_for_a_reply():
    m = Membership(ME, timeout=3)
    change = m.hello(hello(), now=0)
    assert [p.id for p in change.joined] == ["b"] and change.reply_hello_to == "tcp://b:5670"
    assert m.hello(hello(reply=True), now=0.1).joined == []  # a reply to a known peer


def test_other_clusters_versions_and_ourselves_are_refused():
    m = Membership(ME, timeout=3)
    assert "not ours" in m.hello(hello(cluster="test"), 0).refused
    assert "protocol version" in m.hello(hello(version=99), 0).refused
    assert m.hello(Hello("me", "x", "prod", "tcp://x:1"), 0).refused
    assert m.peers == {}


def test_silence_for_timeout_loses_the_peer_any_traffic_keeps_it():
    m = Membership(ME, timeout=3, interval=1)
    m.hello(hello(), 0)
    for t in range(1, 10):
        m.heard("b", t)
        to_ping, change = m.due(t + 0.5)
        assert change.left == []
    to_ping, change = m.due(12.0)
    assert [(p.id, why) for p, why in change.left] == [("b", "silent for 3.0 s")]
    assert not m.heard("b", 12.1)  # traffic of a lost peer is ignored


def test_ping_only_when_nothing_was_sent():
    m = Membership(ME, timeout=3, interval=1)
    m.hello(hello(), 0)
    m.heard("b", 0.9)
    m.sent("b", 0.9)
    assert m.due(1.5)[0] == []
    assert [p.id for p in m.due(2.0)[0]] == ["b"]


def test_a_fresh_hello_from_a_known_peer_starts_a_new_life():
    m = Membership(ME, timeout=3, interval=1)
    first = m.hello(hello(), 0).joined[0]
    change = m.hello(hello(), 5)  # it lost us (partition) and starts afresh
    assert [p.life for p, _ in change.left] == [first.life]
    assert change.joined[0].life != first.life


def test_hellos_crossing_when_brokers_meet_do_not_churn():
    m = Membership(ME, timeout=3, interval=1)
    m.hello(hello(), 0)
    change = m.hello(hello(), 0.2)
    assert change.left == [] and change.joined == [] and change.reply_hello_to


def test_bye_leaves_at_once():
    m = Membership(ME, timeout=3)
    m.hello(hello(), 0)
    assert [p.id for p, _ in m.bye("b").left] == ["b"]
    assert m.bye("b").left == []


def test_hello_wire_form_round_trips_and_rejects_junk():
    h = hello(reply=True)
    assert Hello.from_dict(h.to_dict()) == h
    assert Hello.from_dict({"id": "x"}) is None
    assert Hello.from_dict("junk") is None


def test_a_closed_connection_loses_the_peer_after_the_grace_not_the_timeout():
    m = Membership(ME, timeout=10, interval=3, suspect_grace=1)
    m.hello(hello(), 0)
    m.disconnected("tcp://b:5670", 2.0)
    m.disconnected("tcp://b:5670", 2.5)  # a second event does not move the start
    assert m.next_deadline() == 3.0
    assert m.due(2.9)[1].left == []
    (peer, why), = m.due(3.0)[1].left
    assert peer.id == "b" and why.startswith("its connection closed")


def test_a_connection_made_again_or_traffic_clears_the_suspicion():
    m = Membership(ME, timeout=10, interval=3, suspect_grace=1)
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
    assert Membership(ME, timeout=3).suspect_grace == 0.5
    assert Membership(ME, timeout=12).suspect_grace == 2.0
    assert Membership(ME, timeout=0.3).suspect_grace == 0.3
