"""Service messages numbered within a life, without sockets: two memberships meet, then
messages are lost, reordered or sent in a life the receiver does not have."""

import dataclasses

import pytest
from test_membership import exchange

from zbroker.cluster.membership import Hello, Membership

A_AT, B_AT = "tcp://10.0.0.1:5670", "tcp://10.0.0.2:5670"


def meet(a=None, b=None):
    a = a or Membership(Hello("a", "ha", "prod", A_AT), timeout=3)
    b = b or Membership(Hello("b", "hb", "prod", B_AT), timeout=3)
    a.add_contact(B_AT, 0)
    exchange(a, b, A_AT, B_AT, [(B_AT, a.greeting(B_AT, reply=False))])
    return a, b


def test_messages_in_order_are_taken_and_a_ping_counting_them_is_whole():
    a, b = meet()
    out, into = a.peers["b"].numbering, b.peers["a"].numbering
    for _ in range(3):
        assert into.take(out.next_tag()) is None
    assert into.check_count(out.count_tag()) is None
    # and the other way, independently
    back = b.peers["a"].numbering
    assert a.peers["b"].numbering.take(back.next_tag()) is None


def test_a_message_lost_on_the_way_is_noticed_by_the_next():
    a, b = meet()
    out, into = a.peers["b"].numbering, b.peers["a"].numbering
    assert into.take(out.next_tag()) is None
    out.next_tag()  # lost with a connection that was reset
    problem = into.take(out.next_tag())
    assert problem and "1 of its messages were lost" in problem


def test_the_last_messages_lost_are_noticed_by_the_ping():
    a, b = meet()
    out, into = a.peers["b"].numbering, b.peers["a"].numbering
    assert into.take(out.next_tag()) is None
    out.next_tag()
    out.next_tag()  # nothing came after them
    problem = into.check_count(out.count_tag())
    assert problem and "the last 2 of its messages were lost" in problem


def test_a_message_again_or_out_of_order_is_refused():
    a, b = meet()
    out, into = a.peers["b"].numbering, b.peers["a"].numbering
    first = out.next_tag()
    assert into.take(first) is None
    assert "out of order" in into.take(first)


def test_a_message_of_a_new_life_the_receiver_was_not_told_of_is_refused():
    """The sender lost the receiver and met it again, but its new HELLO did not get there:
    the receiver still has the old life, whose numbers may even match (nothing sent in it).
    (b's HELLO does not say which session of a's it admitted, as a broker of before: one
    that does is not taken, see below.)"""
    a, b = meet()
    into = b.peers["a"].numbering
    a.bye("b", 1.0)  # a lost b; its HELLO saying so is lost too
    says = dataclasses.replace(b.greeting(A_AT, reply=False), admitted="")
    assert a.hello(says, 1.1, sender="b").joined  # b says HELLO
    out = a.peers["b"].numbering  # a's new life of b
    assert out.sent == 0 and into.received == 0
    problem = into.take(out.next_tag())
    assert problem and "another session" in problem


def test_junk_tags_are_refused_not_raised():
    a, b = meet()
    into = b.peers["a"].numbering
    assert into.take(b"") == "invalid message tag"
    assert into.check_count(b"\x00" * 3) == "invalid count tag"
    assert "another session" in into.take(b"\x00" * 8 + b"x" * 500)


def test_a_broker_of_before_is_not_numbered():
    old = {k: v for k, v in Hello("b", "hb", "prod", B_AT, session="s").to_dict().items()
           if k != "numbered"}
    assert Hello.from_dict(old).numbered is False
    a = Membership(Hello("a", "ha", "prod", A_AT), timeout=3)
    a.add_contact(B_AT, 0)
    a.hello(Hello("b", "hb", "prod", B_AT, nonce="n", echo=a.nonce(B_AT), session="s",
                  numbered=False), 0, sender="b")
    assert a.peers["b"].numbering is None


def lost_in_a_partition_with_a_hello_held_back(relearned=True):
    """a and b meet, then a partition: both lose each other. A HELLO a says to b meanwhile is
    held back on the way (on the connection the partition cut: the kernel sends it again once
    the link is back); a gives its contact of b up and, if ``relearned``, learns it again
    (gossip): that contact's session is a new one. Returns a, b and the HELLO held back."""
    a, b = meet()
    a.bye("b", 1.0)  # silent for peer_timeout, on both sides
    b.bye("a", 1.0)
    held = a.greeting(B_AT, reply=False)  # with b's nonce echoed, and a's session then
    assert a.forget_contact(B_AT).dropped == [B_AT]  # given up after contact_timeout
    if relearned:
        a.add_contact(B_AT, 9.0, pinned=False)
        assert a.greeting(B_AT, reply=False).session != held.session
    return a, b, held


def assert_one_life_each_whose_numbers_agree(a, b):
    assert list(a.peers) == ["b"] and list(b.peers) == ["a"]
    a_to_b, b_to_a = a.peers["b"].numbering, b.peers["a"].numbering
    for out, into in ((a_to_b, b_to_a), (b_to_a, a_to_b)):
        assert into.check_count(out.count_tag()) is None
        assert into.take(out.next_tag()) is None


@pytest.mark.parametrize("relearned", [True, False])
def test_a_hello_held_back_by_a_partition_does_not_start_a_life_of_an_old_session(relearned):
    """The HELLO held back reaches b first, after the partition: b admits a with the session
    it names and answers. a's session with b is another one now: had a taken the answer as
    its admission, its every message (and its PING's count) would be of a session b did not
    admit, and the life would end at once, failing the first pipe through it. The answer
    names the session b admitted, so a says HELLO again with its own, and b starts afresh."""
    a, b, held = lost_in_a_partition_with_a_hello_held_back(relearned)
    exchange(a, b, A_AT, B_AT, [(B_AT, held)])
    assert_one_life_each_whose_numbers_agree(a, b)


def test_a_hello_held_back_that_comes_after_a_new_meeting_began_is_undone_too():
    """a's new HELLO reaches b first (b asks back), then the HELLO held back (b admits a with
    the session of before), then b's question (a admits b with its new session): each side
    has the other, with sessions that do not agree. b's answer to the HELLO held back names
    the session it admitted, so a ends its life and both start afresh."""
    a, b, held = lost_in_a_partition_with_a_hello_held_back()
    exchange(a, b, A_AT, B_AT, [(B_AT, a.greeting(B_AT, reply=False)), (B_AT, held)])
    assert_one_life_each_whose_numbers_agree(a, b)
