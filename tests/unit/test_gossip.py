"""Members learning of each other from each other, without sockets: the MEMBERS wire form,
what a broker takes from it, and whole clusters of the real cluster cores wired together in
memory with a clock of their own (cluster_cores.py: join through one seed, leave, loss, stale
gossip, partitions). The same over real namespaces and routers: test_cluster_netns.py."""

import json
import random

import pytest
from cluster_cores import Network

from zbroker.cluster import gossip
from zbroker.cluster.gossip import MAX_FRAME, MAX_MEMBERS, Member
from zbroker.cluster.membership import Hello, Membership

SECRET = b"s" * 16
ME = Hello("me", "local", "prod", "tcp://10.0.0.1:5670")
NONCES = Membership(ME, secret=SECRET, timeout=3)


def proven_hello(peer, endpoint=None, reply=False, gossips=True):
    """A HELLO from ``peer`` that echoes our nonce (it answered us there)."""
    endpoint = endpoint or f"tcp://{peer}:5670"
    return Hello(peer, f"host-{peer}", "prod", endpoint, reply=reply, nonce=f"n-{peer}",
                 echo=NONCES.nonce(endpoint), gossip=gossips)


def with_peers(*peers, **kw):
    m = Membership(ME, secret=SECRET, timeout=3, **kw)
    for peer in peers:
        assert m.hello(proven_hello(peer), 0).joined
    return m


# --- the wire form ---------------------------------------------------------------------------


def test_members_round_trip():
    members = [Member("a" * 32, "hosta", "tcp://10.0.0.2:5670"), Member("b", "", "tcp://h:1")]
    assert gossip.decode(gossip.encode(members)) == (members, None)
    assert gossip.decode(gossip.encode([])) == ([], None)


@pytest.mark.parametrize("frame, problem", [
    (b"", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100_000, "not JSON"),
    (b"[]", "no list of members"),
    (b'{"members": {"id": "x"}}', "no list of members"),
    (b'"members"', "no list of members"),
    (b" " * (MAX_FRAME + 1), f"{MAX_FRAME + 1} bytes, more than {MAX_FRAME}"),
])
def test_malformed_members_frames_are_refused_with_the_reason(frame, problem):
    assert gossip.decode(frame) == ([], problem)


def test_malformed_entries_are_skipped_and_counted():
    good = {"id": "x", "name": "hx", "endpoint": "tcp://x:1"}
    entries = [good, None, 7, "tcp://y:1", {"id": "y"}, {"id": 1, "name": "n", "endpoint": "e"},
               {"id": "", "name": "n", "endpoint": "tcp://z:1"},
               {"id": "z" * 65, "name": "n", "endpoint": "tcp://z:1"},
               {"id": "z", "name": "n", "endpoint": "tcp://" + "z" * 300 + ":1"}]
    members, problem = gossip.decode(json.dumps({"members": entries}).encode())
    assert members == [Member("x", "hx", "tcp://x:1")]
    assert problem == "8 malformed entries skipped"


def test_a_member_list_is_bounded():
    many = [Member(f"id{i}", "h", f"tcp://10.1.{i // 250}.{i % 250}:5670")
            for i in range(MAX_MEMBERS + 50)]
    frame = gossip.encode(many)  # a sender never says more than the bound
    assert gossip.decode(frame) == (many[:MAX_MEMBERS], None)
    longer = json.dumps({"members": [m.__dict__ for m in many]}).encode()
    members, problem = gossip.decode(longer)  # a receiver never takes more
    assert members == many[:MAX_MEMBERS]
    assert problem == f"{MAX_MEMBERS + 50} members, only the first {MAX_MEMBERS} taken"


def test_no_frame_makes_decode_raise():
    rng = random.Random(14)
    good = gossip.encode([Member("x", "hx", "tcp://x:1"), Member("y", "hy", "tcp://y:1")])
    for _ in range(2000):
        frame = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        members, problem = gossip.decode(bytes(frame))
        assert all(isinstance(m, Member) for m in members)
        assert members or problem


def test_the_hello_says_whether_its_sender_gossips():
    h = proven_hello("b")
    assert Hello.from_dict(h.to_dict()) == h and h.gossip
    old = {k: v for k, v in h.to_dict().items() if k != "gossip"}  # a broker of before
    assert Hello.from_dict(old).gossip is False
    assert Hello.from_dict({**old, "gossip": "yes"}).gossip is False


# --- what a broker takes from it ----------------------------------------------------------


def test_members_a_peer_names_become_learned_contacts_to_say_hello_to():
    m = with_peers("b")
    change = m.learn([Member("c", "hc", "tcp://c:5670"), Member("d", "hd", "tcp://d:5670")],
                     "b", 1.0)
    assert change.learned == ["tcp://c:5670", "tcp://d:5670"] and change.refused is None
    assert {c.endpoint for c in m.unanswered()} == {"tcp://c:5670", "tcp://d:5670"}
    assert all(m.contacts[e].learned and not m.contacts[e].pinned for e in change.learned)
    assert set(m.peers) == {"b"}  # named is not admitted
    # admitted only once it answers our HELLO there, as any stranger
    assert m.hello(Hello("c", "hc", "prod", "tcp://c:5670"), 1.1, sender="c").challenge
    assert "c" not in m.peers
    assert m.hello(proven_hello("c"), 1.2, sender="c").joined and "c" in m.peers


def test_gossip_is_taken_only_from_peers_and_names_nothing_known_twice():
    m = with_peers("b", "c")
    assert m.learn([Member("x", "hx", "tcp://x:1")], "stranger", 0).refused == "not from a peer"
    m.add_contact("tcp://static:5670", 0)
    change = m.learn([Member("me", "local", "tcp://elsewhere:1"),  # ourselves
                      Member("me-before", "local", ME.endpoint),  # our previous start
                      Member("c", "hc", "tcp://c-other:5670"),  # a peer, seen elsewhere
                      Member("s", "hs", "tcp://static:5670"),  # a contact already
                      Member("x", "hx", "tcp://x:1"), Member("y", "hy", "tcp://x:1")], "b", 0)
    assert change.learned == ["tcp://x:1"]
    assert m.learn([Member("x", "hx", "tcp://x:1")], "b", 1).learned == []


def test_endpoints_no_peer_can_be_at_are_not_learned():
    m = with_peers("b")
    bad = [Member(f"x{i}", "h", e) for i, e in enumerate(
        ["tcp://*:5670", "inproc://zeromq.zap.01", "ipc://@/zpipes/local", "tcp://h:0",
         "tcp://nonsense", "udp://h:1"])]
    change = m.learn(bad, "b", 0)
    assert change.learned == [] and change.refused == "6 members at endpoints no peer can be at"
    assert list(m.contacts) == ["tcp://b:5670"]


def test_learned_contacts_are_bounded_and_given_up_like_those_of_hellos():
    m = with_peers("b", max_learned=3, contact_timeout=5, max_pending=2)
    members = [Member(f"x{i}", "h", f"tcp://x{i}:1") for i in range(5)]
    change = m.learn(members, "b", 1.0)
    assert len(change.learned) == 3 and change.refused == "2 members past the 3 learned " \
                                                          "contacts waiting"
    # HELLOs from strangers neither count against them nor push them out
    for i in range(4):
        m.hello(Hello(f"s{i}", "h", "prod", f"tcp://s{i}:1"), 1.5)
    assert all(f"tcp://x{i}:1" in m.contacts for i in range(3))
    m.heard("b", 5.9)
    assert set(m.due(6.0)[1].dropped) == {"tcp://x0:1", "tcp://x1:1", "tcp://x2:1"}
    assert m.learn(members, "b", 6.1).learned == [f"tcp://x{i}:1" for i in range(3)]


def test_one_peer_in_turn_is_told_every_gossip_interval_brokers_of_before_never():
    m = Membership(ME, secret=SECRET, timeout=3, gossip_interval=2)
    for peer in "bcd":
        m.hello(proven_hello(peer, gossips=peer != "c"), 0)
    assert m.gossip_due(1.9) is None and m.next_deadline() <= 1.0  # pings come first
    told = []
    for t in range(2, 12, 2):
        for p in m.peers:
            m.heard(p, t)
        told.append(m.gossip_due(t).id)
        assert m.gossip_due(t + 0.1) is None
    assert told == ["b", "d", "b", "d", "b"]
    assert [p.id for p in m.members_for("b")] == ["c", "d"]


def test_a_new_start_answering_at_a_peers_endpoint_ends_the_old_life_at_once():
    m = with_peers("b")
    old = m.peers["b"]
    change = m.hello(proven_hello("b2", endpoint="tcp://b:5670"), 1.0, sender="b2")
    assert [(p.life, why) for p, why in change.left] == [
        (old.life, "a new start of it answers at its endpoint")]
    assert set(m.peers) == {"b2"}


def test_stale_gossip_does_not_bring_back_a_lost_member():
    m = with_peers("b", "c", contact_timeout=4)  # forget_after: 4 + 3
    m.heard("c", 2.9)
    assert [p.id for p, _ in m.due(3.0)[1].left] == ["b"]  # b silent: lost
    m.heard("c", 5.0)
    m.heard("c", 7.0)
    assert m.due(7.0)[1].dropped == ["tcp://b:5670"]  # and its contact given up
    stale = [Member("b", "host-b", "tcp://b:5670")]  # c said it before it lost b too
    assert m.learn(stale, "c", 7.1).learned == []
    assert "tcp://b:5670" not in m.contacts
    # b's next start (a new id) is another member: learned at once
    assert m.learn([Member("b-next", "host-b", "tcp://b:5670")], "c", 7.2).learned
    # and b itself answering our HELLO rejoins whenever (it is alive after all)
    assert m.hello(proven_hello("b"), 7.3, sender="b").joined
    # once forgotten, gossip that names b again is taken (a partition that lasted)
    m2 = with_peers("b", "c", contact_timeout=4)
    m2.bye("b", 1.0)
    m2.heard("c", 5.0)
    assert m2.due(5.0)[1].dropped == ["tcp://b:5670"]
    assert m2.learn(stale, "c", 7.9).learned == []
    assert m2.learn(stale, "c", 8.0).learned == ["tcp://b:5670"]


# --- whole clusters of cores, in memory (cluster_cores.py) --------------------------------------


def test_a_broker_given_one_seed_learns_every_member_and_each_learns_it():
    net = Network()
    net.start("a")
    for name in "bcdef":
        net.start(name, seeds=["a"])  # all through a: a star of seeds
    took = net.run(5, until=net.complete)
    assert net.complete(), {n: net.peers(n) for n in "abcdef"}
    print(f"6 brokers through one seed: complete in {took:.2f} s, {net.sent[b'MEMBERS']} MEMBERS")
    assert took < 1.0
    late = net.start("g", seeds=["c"])  # a late one, through any member
    took = net.run(5, until=net.complete)
    assert net.complete() and took < 1.0
    assert {c.endpoint for c in late.core.membership.contacts.values() if c.learned} == {
        f"tcp://{n}:5670" for n in "abdef"}  # learned, not configured


@pytest.mark.parametrize("seeds", [
    {"a": "c", "b": "d", "c": "b", "d": "a"},  # two subnets, one seed in the other each
    {"a": "b", "b": "c", "c": "d", "d": "e", "e": "f", "f": "g", "g": "h"},  # a chain
])
def test_one_seed_each_is_enough_whatever_the_shape(seeds):
    net = Network()
    for name in sorted({*seeds, *seeds.values()}):
        net.start(name, seeds=[seeds[name]] if name in seeds else [])
    took = net.run(5, until=net.complete)
    assert net.complete(), {n.name: n.peers() for n in net.nodes.values()}
    print(f"{len(net.nodes)} brokers: complete in {took:.2f} s, {net.sent[b'MEMBERS']} MEMBERS")


def test_a_member_that_leaves_or_is_lost_is_forgotten_by_all_and_stays_forgotten():
    net = Network(timeout=3.0)
    net.start("a")
    for name in "bcde":
        net.start(name, seeds=["a"])
    net.run(5, until=net.complete)
    net.stop("e")  # leaves: forgotten at once
    assert all("e" not in net.peers(n) for n in "abcd")
    net.kill("d")  # lost: forgotten within the timeout
    took = net.run(10, until=lambda: all("d" not in net.peers(n) for n in "abc"))
    assert all("d" not in net.peers(n) for n in "abc") and took <= 3.0 + 0.1, took
    # and gossip goes on, in turn, without ever naming them again: their contacts are given
    # up and stay so
    net.run(30)
    assert net.contacts_of("d") == [] and net.contacts_of("e") == []
    assert net.complete() and net.peers("a") == {"b", "c"}


def test_a_broker_restarted_rejoins_as_a_new_member():
    net = Network()
    net.start("a")
    for name in "bcd":
        net.start(name, seeds=["a"])
    net.run(5, until=net.complete)
    old = net.node("d").id
    net.kill("d")
    net.start("d", seeds=["b"])  # at once, at the same endpoint, before anyone noticed
    net.run(5, until=net.complete)
    assert net.complete()
    assert all(old not in net.node(n).core.membership.peers for n in "abc")


def test_a_partition_heals_on_its_own_when_the_link_returns():
    net = Network(timeout=3.0)
    seeds = {"a": "c", "b": "d", "c": "b", "d": "a"}  # one seed in the other side each
    for name in "abcd":
        net.start(name, seeds=[seeds[name]])
    net.run(5, until=net.complete)
    net.partition("ab", "cd")
    net.run(4)
    assert net.peers("a") == {"b"} and net.peers("c") == {"d"}
    net.run(26)  # long enough for every learned contact and every "gone" to be forgotten
    net.partition("ab", "cd", cut=False)
    took = net.run(10, until=net.complete)
    assert net.complete(), {n: net.peers(n) for n in "abcd"}
    print(f"healed in {took:.2f} s")
    assert took < 3.0


def test_a_partition_of_one_link_only_is_bridged_by_nothing_and_heals():
    """a and b cannot reach each other, c reaches both: gossip from c keeps naming b to a
    (it cannot make a peer of it), and once the link is back they pair again."""
    net = Network(timeout=3.0)
    net.start("c")
    net.start("a", seeds=["c"])
    net.start("b", seeds=["c"])
    net.run(5, until=net.complete)
    net.partition("a", "b")
    net.run(20)
    assert net.peers("a") == {"c"} and net.peers("b") == {"c"} and net.peers("c") == {"a", "b"}
    net.partition("a", "b", cut=False)
    took = net.run(15, until=net.complete)
    assert net.complete() and took < 3.0 + 0.5, took


def test_a_chain_of_forty_seeds_ends_in_a_full_mesh_at_two_members_messages_per_link():
    """Each broker names only the one started before it: every broker still ends up linked to
    every other, within a few HELLO retries, and MEMBERS are sent only when a link is made
    (one each way) — the telling in turn comes only every peer_timeout."""
    net, n = Network(), 40
    net.start("b0")
    for i in range(1, n):
        net.start(f"b{i}", seeds=[f"b{i - 1}"])
    took = net.run(5, until=net.complete)
    print(f"{n} brokers in a chain of seeds: complete in {took:.2f} s, "
          f"{net.sent[b'MEMBERS']} MEMBERS")
    assert net.complete() and took < 1.0
    assert net.sent[b"MEMBERS"] <= n * (n - 1)
