"""Which peers hold a queue's copies (placement.py): pure, no sockets."""

from collections import deque

from zbroker.services.pzq.core.placement import RECOPY_WINDOW, Placement, Recopy

ORIGIN = "a" * 32


def node(i: int) -> str:
    return f"{i:032x}"


def test_holders_are_chosen_up_to_replicas_and_get_the_backlog():
    p = Placement(ORIGIN, 2)
    assert p.available("life1", node(1), [b"k1", b"k2"]) == ["life1"]
    assert list(p.recopies["life1"].todo) == [b"k1", b"k2"]
    assert p.available("life2", node(2), [b"k1"]) == ["life2"]
    assert p.available("life3", node(3), [b"k1"]) == []  # two are enough
    assert sorted(p.holders) == ["life1", "life2"] and len(p) == 2


def test_no_backlog_no_recopy_and_ourselves_never_hold():
    p = Placement(ORIGIN, 1)
    assert p.available("me", ORIGIN, []) == []
    assert p.available("life1", node(1), []) == ["life1"]
    assert p.recopies == {}


def test_a_lost_holder_is_replaced_by_a_candidate_with_the_whole_backlog():
    p = Placement(ORIGIN, 1)
    p.available("life1", node(1), [])
    p.available("life2", node(2), [])
    first = p.holders[0]
    other = "life2" if first == "life1" else "life1"
    assert p.gone(first, [b"x", b"y"]) == [other]
    assert p.holders == [other]
    assert list(p.recopies[other].todo) == [b"x", b"y"]
    assert p.gone(other, []) == [] and len(p) == 0
    assert p.gone("never-seen", []) == []


def test_a_candidate_that_is_not_a_holder_leaves_quietly():
    p = Placement(ORIGIN, 1)
    p.available("life1", node(1), [])
    p.available("life2", node(2), [])
    spare = "life2" if p.holders == ["life1"] else "life1"
    assert p.gone(spare, [b"x"]) == []
    assert len(p) == 1 and p.recopies == {}


def test_a_replacement_is_ranked_per_origin_stable_and_spread():
    chosen = set()
    for origin in range(40):
        picks = set()
        for order in ([2, 3], [3, 2]):
            p = Placement(node(1000 + origin), 1)
            p.available("life1", node(1), [])
            for i in order:
                p.available(f"life{i}", node(i), [])
            p.gone("life1", [])
            picks.add(p.holders[0])
        assert len(picks) == 1  # the arrival order of the candidates does not matter
        chosen |= picks
    assert chosen == {"life2", "life3"}  # but the origin does: copies spread out


def test_recopy_window_and_confirmations():
    keys = [b"%d" % i for i in range(RECOPY_WINDOW + 10)]
    p = Placement(ORIGIN, 1)
    p.available("life1", node(1), keys)
    r = p.recopies["life1"]
    sent = r.next_keys()
    assert len(sent) == RECOPY_WINDOW and r.next_keys() == []  # the window is full
    for k in sent[:5]:
        p.confirmed("life1", k)
    assert r.next_keys() == keys[RECOPY_WINDOW:RECOPY_WINDOW + 5]
    p.forget(keys[0])  # no effect: already confirmed
    p.forget(sent[5])  # ACKed while its copy was on the way: frees its place
    assert r.next_keys() == keys[RECOPY_WINDOW + 5:RECOPY_WINDOW + 6]
    for k in list(r.sent):
        p.confirmed("life1", k)
    rest = r.next_keys()
    assert rest == keys[RECOPY_WINDOW + 6:]
    for k in rest:
        p.confirmed("life1", k)
    assert "life1" not in p.recopies  # done


def test_recopy_done():
    r = Recopy(deque([b"a"]))
    assert not r.done
    assert r.next_keys(1) == [b"a"] and not r.done
    r.confirmed(b"a")
    assert r.done


def test_a_large_recopy_one_confirmation_at_a_time():
    """What a holder's CONFIRMs do: each frees one place. The backlog is consumed from its
    front in place (slicing it on each call made a 100 000-message re-copy quadratic)."""
    keys = [b"%d" % i for i in range(200_000)]
    r = Recopy(deque(keys))
    todo = r.todo
    sent = r.next_keys()
    order = list(sent)
    while sent:
        r.confirmed(sent.pop())
        more = r.next_keys()
        assert len(more) <= 1
        order.extend(more)
        sent.extend(more)
    assert r.done and order == keys and r.todo is todo
