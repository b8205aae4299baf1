"""The fence of a replicated queue (zbroker/services/pzq/core/fence.py), alone: the quorum of hosts
that answered our LEASEs, and the TAKEN lists an origin waits for before it delivers."""

from __future__ import annotations

from zbroker.services.pzq.core.fence import LIST_WAIT, Fence


def fence_of(hosts: int, lease: float = 1.0) -> Fence:
    f = Fence(lease, taker_wait=10.0)
    for i in range(hosts - 1):
        f.joined(f"p{i}#1", f"node{i}", 0.0)
        f.list_ended(f"p{i}#1")
    return f


def test_a_quorum_is_a_majority_of_every_host_seen():
    assert fence_of(2).others_needed() == 0  # two cannot tell a partition from a death
    assert fence_of(3).others_needed() == 1
    assert fence_of(4).others_needed() == 2
    assert fence_of(5).others_needed() == 2
    assert Fence(0.0, 1.0).others_needed() == 0  # no lease: no fence
    f = fence_of(3)
    f.left("p0#1")  # a host lost still counts: the quorum does not shrink with it
    assert f.others_needed() == 1


def test_the_quorum_holds_a_lease_after_the_answer_to_what_we_asked():
    f = fence_of(3)
    assert f.quorum_until(5.0) == 5.0  # nobody answered yet
    f.answer("p0#1", asked=4.0, now=4.01)
    assert f.quorum_until(4.5) == 5.0  # our stamp plus the lease, not the arrival
    f.answer("p1#1", asked=4.4, now=4.41)
    assert f.quorum_until(4.5) == 5.4
    assert f.quorum_until(5.4) == 5.4  # lost at the lease's end: nothing delivered after


def test_an_answer_read_late_is_as_old_as_its_stamp():
    """A broker resumed after a pause reads answers that waited meanwhile: they count from
    when it asked, so they do not lift the fence."""
    f = fence_of(3)
    f.answer("p0#1", asked=1.0, now=7.0)
    assert f.quorum_until(7.0) == 7.0
    f.answer("p0#1", asked=0.5, now=7.1)  # an older stamp changes nothing
    assert f.answered["p0#1"] == 1.0
    f.answer("p0#1", asked=9.0, now=7.1)  # a stamp from the future is not ours
    assert f.answered["p0#1"] == 1.0


def test_a_takeover_needs_a_quorum_without_the_origin_and_its_silence():
    f = fence_of(3)
    f.answer("p0#1", asked=10.0, now=10.0)  # node0 is the origin: it does not count
    assert not f.quorum_without("node0", 10.2)
    f.answer("p1#1", asked=10.1, now=10.1)
    assert f.quorum_without("node0", 10.2)
    f.heard("p0#1", 10.0)
    assert not f.silent("node0", 10.5) and f.silent("node0", 11.0)


def test_lists_owed_are_waited_for_and_let_go_in_time():
    f = fence_of(3)
    f.joined("p0#2", "node0", 20.0)  # a new life: its list is owed
    assert f.waiting(20.1)
    f.list_ended("p0#2")
    assert not f.waiting(20.2)
    f.joined("p1#2", "node1", 30.0)  # a peer of before sends no list: let go
    assert f.waiting(30.0 + LIST_WAIT - 0.1) and not f.waiting(30.0 + LIST_WAIT)
    f.told_takers(["node2", "me"], me="me", now=40.0)
    assert set(f.waiting_takers) == {"node2"}
    assert f.waiting(49.9) and not f.waiting(50.0)  # taker_wait


def test_after_a_fence_the_holders_owe_their_lists_or_an_answer_in_the_same_life():
    f = fence_of(3)
    f.fenced(["p0#1", "p1#1"], now=5.0)
    assert set(f.waiting_takers) == {"node0", "node1"}
    f.answer("p0#1", asked=5.5, now=5.6)  # the life it had: it never lost us
    assert set(f.waiting_takers) == {"node1"}
    f.left("p1#1")
    f.joined("p1#2", "node1", 6.0)
    f.answer("p1#2", asked=6.0, now=6.1)  # a new life's answer is not enough ...
    assert "node1" in f.waiting_takers
    f.list_ended("p1#2")  # ... its list is
    assert not f.waiting_takers
