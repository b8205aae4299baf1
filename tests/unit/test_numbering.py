"""Service messages numbered within a life, without sockets: two memberships meet, then
messages are lost, reordered or sent in a life the receiver does not have."""

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
    the receiver still has the old life, whose numbers may even match (nothing sent in it)."""
    a, b = meet()
    into = b.peers["a"].numbering
    a.bye("b", 1.0)  # a lost b; its HELLO saying so is lost too
    assert a.hello(b.greeting(A_AT, reply=False), 1.1, sender="b").joined  # b says HELLO
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
