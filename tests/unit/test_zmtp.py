"""The ZMTP codec of every endpoint the broker serves (zbroker/zmtp/codec.py), no sockets: the
handshakes of libzmq 4 (ZMTP 3.x) and libzmq 3.2 (ZMTP 2.0) peers, framing, and refusing a
message past the limits before the rest of it arrives. That libzmq itself talks to it is
shown by every pzq test with a real producer."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zbroker import zmtp
from zbroker.zmtp import Closed, Message, Ready, Refused

V3_GREETING = zmtp.SIGNATURE + bytes([3, 1]) + b"NULL".ljust(20, b"\0") + b"\0" * 32


def ready(socket_type: bytes = b"DEALER", identity: bytes = b"") -> bytes:
    props = b""
    for name, value in ((b"Socket-Type", socket_type), (b"Identity", identity)):
        props += bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    return zmtp.command(b"READY", props)


def v3_peer(conn: zmtp.Connection, socket_type: bytes = b"DEALER", identity: bytes = b"",
            step: int = 0) -> list:
    data = V3_GREETING + ready(socket_type, identity)
    return feed(conn, data, step)


def feed(conn: zmtp.Connection, data: bytes, step: int = 0) -> list:
    if step:
        for i in range(0, len(data), step):
            conn.receive_data(data[i:i + step])
    else:
        conn.receive_data(data)
    return conn.next_events()


def connection(max_frames: int = 100, max_bytes: int = 1000, frame_cost: int = 0
               ) -> zmtp.Connection:
    return zmtp.Connection(max_frames, max_bytes, frame_cost, keep_first=8)


@pytest.mark.parametrize("step", [0, 1, 7])
def test_a_zmtp3_dealer_is_greeted_as_libzmq_greets_it(step):
    conn = connection()
    assert conn.data_to_send() == zmtp.SIGNATURE  # at once: the peer waits for it
    assert v3_peer(conn, identity=b"me", step=step) == [Ready(b"DEALER", b"me")]
    out = conn.data_to_send()
    assert out[:1] == b"\x03"  # the major version, then the rest of the greeting
    assert out[1:2] == b"\x01" and out[2:22] == b"NULL".ljust(20, b"\0")
    assert out[22:54] == b"\0" * 32
    assert out[54:] == zmtp.ready_command()
    assert b"Socket-Type" in out and b"ROUTER" in out


@pytest.mark.parametrize("step", [0, 1, 5])
def test_a_zmtp2_peer_of_libzmq_3_2_gets_our_socket_type_and_identity_and_sends_its_own(step):
    conn = connection()
    conn.data_to_send()
    events = feed(conn, zmtp.SIGNATURE + b"\x01\x05" + b"\x00\x03abc"
                  + zmtp.encode_message([b"id", b"", b"body"]), step)
    assert events == [Ready(b"DEALER", b"abc"), Message([b"id", b"", b"body"])]
    assert events[1].size == 6
    # major version, ROUTER (6), then our identity: an empty message, which the peer's
    # libzmq takes for it (were it missing, the peer would drop our first answer instead)
    assert conn.data_to_send() == b"\x03\x06\x00\x00"


@pytest.mark.parametrize("data, why", [
    (b"\x05\x00hello", "not a ZMTP 2.0 or 3.x peer"),  # ZMTP 1.0 (libzmq 2.x)
    (zmtp.SIGNATURE + b"\x00", "revision 0"),
    (zmtp.SIGNATURE + b"\x01\x01", "PUB socket cannot talk to a ROUTER"),
    (zmtp.SIGNATURE + bytes([3, 0]) + b"CURVE".ljust(20, b"\0") + b"\0" * 32,
     "mechanism 'CURVE'"),
    (V3_GREETING + zmtp.encode_message([b"x"]), "before the handshake"),
    (V3_GREETING + b"\x06" + struct.pack(">Q", 1 << 40), "a command of"),
])
def test_what_cannot_talk_to_a_router_is_closed_with_a_reason(data, why):
    conn = connection()
    events = feed(conn, data)
    assert len(events) == 1 and isinstance(events[0], Closed), events
    assert why in events[0].reason
    assert conn.closed and conn.buffered == 0
    assert feed(conn, b"more") == []


def test_a_pub_socket_in_zmtp3_is_told_error_and_closed():
    conn = connection()
    conn.data_to_send()
    events = v3_peer(conn, socket_type=b"PUB")
    assert isinstance(events[0], Closed) and "PUB" in events[0].reason
    assert b"\x05ERROR" in conn.data_to_send()


def test_messages_short_and_long_frames_and_a_ping():
    conn = connection(max_bytes=10_000)
    v3_peer(conn)
    conn.data_to_send()
    big = bytes(range(256)) * 10
    ping = zmtp.command(b"PING", b"\x00\x0actx")
    data = zmtp.encode_message([b"a", b"", big]) + ping + zmtp.encode_message([b"b"])
    assert feed(conn, data, step=3) == [Message([b"a", b"", big]), Message([b"b"])]
    assert conn.data_to_send() == zmtp.command(b"PONG", b"ctx")
    assert conn.buffered == 0


def test_encode_uses_long_sizes_past_255_bytes():
    out = zmtp.encode_message([b"k", b"x" * 300])
    assert out[:3] == b"\x01\x01k" and out[3] == zmtp.LONG and out[4:12] == struct.pack(">Q", 300)


def test_a_message_past_max_bytes_is_refused_at_the_header_of_the_frame_that_passes():
    conn = connection(max_bytes=1000, frame_cost=16)
    v3_peer(conn)
    # the header says 1 GiB: refused before any of it came, and none of it is kept
    head = bytes([zmtp.MORE | zmtp.LONG]) + struct.pack(">Q", 1 << 30)
    events = feed(conn, zmtp.encode_message([b"msg-id-long-id", b""])[:-2] + b"\x01\x00" + head)
    assert events == [Refused(b"msg-id-l", "Message too large: more than 1000 bytes with its "
                                           "id and headers")]
    chunk = b"z" * (1 << 20)
    for _ in range(64):
        assert feed(conn, chunk) == []
        assert conn.buffered == 0
    # the rest of the big frame and the message's last frame are let go; the next one counts
    feed(conn, b"z" * ((1 << 30) - (64 << 20)))
    assert feed(conn, zmtp.encode_message([b"tail"]) + zmtp.encode_message([b"next", b"", b"ok"])
                ) == [Message([b"next", b"", b"ok"])]


def test_many_small_frames_are_let_go_as_they_come():
    conn = connection(max_frames=10_000, max_bytes=1000, frame_cost=16)
    v3_peer(conn)
    frames = [b"id"] + [b"f" * 100] * 5000
    events = feed(conn, zmtp.encode_message(frames), step=4096)
    assert [type(e) for e in events] == [Refused]
    assert events[0].first == b"id" and conn.buffered == 0


def test_too_many_frames_is_refused_at_the_first_frame_past_the_limit():
    conn = connection(max_frames=3, max_bytes=10_000)
    v3_peer(conn)
    events = feed(conn, zmtp.encode_message([b"id", b"", b"a", b"b"]) +
                  zmtp.encode_message([b"ok", b"", b"a"]))
    assert events == [Refused(b"id", "more than 3 frames in a message"),
                      Message([b"ok", b"", b"a"])]


def test_refuse_current_lets_go_of_a_message_under_way_and_of_its_frame_in_flight():
    conn = connection(max_bytes=1 << 20)
    v3_peer(conn)
    data = zmtp.encode_message([b"big-id", b"", b"x" * 500_000])
    assert feed(conn, data[:200_000]) == []
    assert conn.buffered > 190_000
    assert conn.refuse_current("busy")
    assert conn.next_events() == [Refused(b"big-id", "busy")] and conn.buffered == 0
    assert feed(conn, data[200_000:] + zmtp.encode_message([b"next"])) == [Message([b"next"])]
    assert not conn.refuse_current("busy")  # nothing under way


def test_refuse_current_of_a_first_frame_in_flight_keeps_its_start_as_the_id():
    conn = connection(max_bytes=1 << 20)
    v3_peer(conn)
    data = zmtp.encode_message([b"i" * 1000, b"", b"x"])
    feed(conn, data[:500])
    assert conn.refuse_current("busy")
    assert conn.next_events() == [Refused(b"iiiiiiii", "busy", 1000)]  # the frame's length
    assert feed(conn, data[500:] + zmtp.encode_message([b"n"])) == [Message([b"n"])]


def test_an_error_command_from_the_peer_closes():
    conn = connection()
    v3_peer(conn)
    events = feed(conn, zmtp.command(b"ERROR", b"\x04oops"))
    assert events == [Closed("the peer said ERROR: oops")]


def _direct_connection() -> zmtp.Connection:
    conn = zmtp.Connection(100, 1 << 22, keep_first=8, writable=True, direct_min=1000)
    v3_peer(conn)
    return conn


@pytest.mark.parametrize("step", [1, 999, 4096, 70_000])
@pytest.mark.parametrize("into_buffer", [False, True], ids=["receive_data", "frame_buffer"])
def test_a_large_frame_in_pieces_is_read_into_its_own_buffer(step, into_buffer):
    """With ``direct_min``, the rest of a large frame goes to a buffer of its own, whether
    the caller reads it there or hands it to receive_data: the same messages come out."""
    conn = _direct_connection()
    big = bytes(range(256)) * 800
    data = zmtp.encode_message([b"id", big]) + zmtp.encode_message([b"small"]) \
        + zmtp.encode_message([big])
    events, pos = [], 0
    while pos < len(data):
        view = conn.frame_buffer()
        if into_buffer and view is not None:
            n = min(len(view), step, len(data) - pos)
            view[:n] = data[pos:pos + n]
            conn.frame_filled(n)
        else:
            n = min(step, len(data) - pos)
            conn.receive_data(data[pos:pos + n])
        pos += n
        events += conn.next_events()
    assert events == [Message([b"id", big]), Message([b"small"]), Message([big])]
    assert [ev.size for ev in events] == [2 + len(big), 5, len(big)]  # the frames' bytes
    assert all(type(f) is bytearray for ev in events for f in ev.frames)
    assert conn.frame_buffer() is None and conn.buffered == 0


def test_refuse_current_lets_go_of_a_large_frame_in_its_own_buffer():
    conn = _direct_connection()
    data = zmtp.encode_message([b"big-id", b"x" * 500_000])
    feed(conn, data[:200_000])
    assert conn.frame_buffer() is not None and conn.buffered > 190_000
    assert conn.refuse_current("busy")
    assert conn.next_events() == [Refused(b"big-id", "busy")] and conn.buffered == 0
    assert conn.frame_buffer() is None
    assert feed(conn, data[200_000:] + zmtp.encode_message([b"next"])) == [Message([b"next"])]


def test_a_huge_length_header_is_refused_before_anything_is_allocated():
    """A frame header that claims more than the limit is refused as it arrives: no buffer
    of its size is made, and the rest of it would be let go as it came."""
    conn = zmtp.Connection(100, 1 << 20, keep_first=8, direct_min=1000)
    v3_peer(conn)
    events = feed(conn, bytes([zmtp.LONG]) + (1 << 62).to_bytes(8, "big") + b"x" * 100)
    assert len(events) == 1 and type(events[0]) is Refused and b"x" * 8 == events[0].first
    assert conn.frame_buffer() is None and conn.buffered == 0 and not conn.closed


def test_routing_ids_as_a_router_gives_them():
    ids = zmtp.RoutingIds(0xFFFFFFFE)
    assert ids.pick(b"alice", set()) == b"alice"  # the one asked for, when free
    made = ids.pick(b"alice", {b"alice"})  # taken: one made here, marked by a zero byte
    assert made == b"\0\xff\xff\xff\xff"
    assert ids.pick(b"\0abcd", set()) == b"\0\0\0\0\0"  # a zero byte is ours to give; wraps
    assert ids.pick(b"", {b"\0\0\0\0\1"}) == b"\0\0\0\0\2"  # a made one that is taken: next


def test_a_large_frame_is_asked_for_before_its_buffer_is_made_and_counted_whole():
    """``admit`` is asked with the frame's size as its head arrives: refused, the message is
    let go as it comes (nothing of its size made); taken, its buffer counts whole in
    ``buffered`` from then on."""
    asked = []
    conn = _direct_connection()
    conn.admit = lambda size: (asked.append(size), "no room" if size > 400_000 else None)[1]
    big = zmtp.encode_message([b"big-id", b"x" * 500_000])
    assert feed(conn, big[:1000]) == [Refused(b"big-id", "no room", 500_000)]
    assert asked == [500_000] and conn.frame_buffer() is None and conn.buffered == 0
    small = zmtp.encode_message([b"id2", b"y" * 300_000])
    assert feed(conn, big[1000:] + small[:1000]) == []
    assert asked == [500_000, 300_000] and conn.buffered >= 300_000
    assert feed(conn, small[1000:]) == [Message([b"id2", b"y" * 300_000])]
    assert conn.buffered == 0


@pytest.mark.parametrize("sizes", [(3, 4), (100, 200), (20_000, 5, 30_000), (1 << 16,)])
def test_a_frame_given_in_parts_is_the_frame_of_their_bytes_and_large_parts_are_not_copied(
        sizes):
    parts = [bytes([65 + i]) * n for i, n in enumerate(sizes)]
    frames = [b"BATCH", b"7", parts]
    out, size = zmtp.encode_parts(frames)
    joined = zmtp.encode_message([b"BATCH", b"7", b"".join(parts)])
    assert b"".join(out) == joined and size == len(joined)
    for p in parts:  # a large part goes to the write as it is
        if len(p) >= zmtp.LARGE_FRAME:
            assert any(o is p for o in out)
    # and a peer reads it back as that one frame
    conn = connection(max_bytes=1 << 20)
    v3_peer(conn)
    assert feed(conn, joined) == [Message([b"BATCH", b"7", b"".join(parts)])]


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=6),
                         max_size=8),
       cuts=st.lists(st.integers(1, 600), max_size=30), max_frames=st.integers(1, 5),
       max_bytes=st.integers(0, 900), cost=st.sampled_from([0, 16]))
def test_any_split_of_the_bytes_gives_each_message_or_its_refusal(messages, cuts, max_frames,
                                                                  max_bytes, cost):
    """Short and long frames, cut anywhere: a message within the limits comes whole, one past
    them is refused (with the start of its first frame); its size is counted as it came."""
    conn = connection(max_frames=max_frames, max_bytes=max_bytes, frame_cost=cost)
    v3_peer(conn)
    data = b"".join(zmtp.encode_message(m) for m in messages)
    events, pos = [], 0
    for cut in [*cuts, len(data)]:
        conn.receive_data(data[pos:pos + cut])
        events += conn.next_events()
        pos += cut
        if pos >= len(data):
            break
    assert len(events) == len(messages)
    for event, m in zip(events, messages, strict=True):
        if len(m) <= max_frames and sum(len(f) + cost for f in m) <= max_bytes:
            assert type(event) is Message and event.frames == m
            assert event.size == sum(map(len, m))
        else:
            assert type(event) is Refused and m[0][:8].startswith(event.first)
    assert conn.buffered == 0 and not conn.closed


# --- the handshake, cut anywhere ------------------------------------------------------------

def props(**named: bytes) -> bytes:
    out = b""
    for name, value in named.items():
        key = name.replace("_", "-").encode()
        out += bytes([len(key)]) + key + struct.pack(">I", len(value)) + value
    return out


def v2_greeting(socket_type: int, identity: bytes) -> bytes:
    return (zmtp.SIGNATURE + bytes([1, socket_type]) + bytes([0, len(identity)]) + identity)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    pieces, pos = [], 0
    for cut in cuts:
        if pos >= len(data):
            break
        pieces.append(data[pos:pos + cut])
        pos += cut
    if pos < len(data):
        pieces.append(data[pos:])
    return pieces


# (what the peer says, the socket type it says, the identity) for each kind of peer
V3_READIES = st.sampled_from([
    (zmtp.command(b"READY", props(Socket_Type=b"DEALER", Identity=b"me")), b"DEALER", b"me"),
    (zmtp.command(b"READY", props(Socket_Type=b"REQ")), b"REQ", b""),
    (zmtp.command(b"READY", props(Socket_Type=b"ROUTER", Identity=b"r1")), b"ROUTER", b"r1"),
    # libzmtp (the original C clients' library): a READY with no properties at all; libzmq
    # takes it, and so do we
    (zmtp.command(b"READY"), b"", b""),
    (zmtp.command(b"READY", props(Identity=b"x")), b"", b"x"),
])


@settings(max_examples=300, deadline=None)
@given(ready_=V3_READIES, minor=st.sampled_from([0, 1]), cuts=st.lists(st.integers(1, 80)),
       message=st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_a_zmtp3_handshake_cut_anywhere_ends_ready_and_the_first_message_follows(
        ready_, minor, cuts, message):
    said, socket_type, identity = ready_
    conn = connection(max_bytes=10_000)
    assert conn.data_to_send() == zmtp.SIGNATURE
    data = (zmtp.SIGNATURE + bytes([3, minor]) + b"NULL".ljust(20, b"\0") + b"\0" * 32
            + said + zmtp.encode_message(message))
    events = []
    for piece in split(data, cuts):
        conn.receive_data(piece)
        events += conn.next_events()
    assert events == [Ready(socket_type, identity), Message(message)]
    out = conn.data_to_send()
    assert out == bytes([3, 1]) + b"NULL".ljust(20, b"\0") + b"\0" * 32 + zmtp.ready_command()
    assert conn.buffered == 0 and not conn.closed


@settings(max_examples=200, deadline=None)
@given(peer=st.sampled_from([(3, b"REQ"), (5, b"DEALER"), (6, b"ROUTER")]),
       identity=st.binary(max_size=20), cuts=st.lists(st.integers(1, 40)),
       message=st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_a_zmtp2_handshake_cut_anywhere_ends_ready_and_the_first_message_follows(
        peer, identity, cuts, message):
    number, socket_type = peer
    conn = connection(max_bytes=10_000)
    conn.data_to_send()
    events = []
    for piece in split(v2_greeting(number, identity) + zmtp.encode_message(message), cuts):
        conn.receive_data(piece)
        events += conn.next_events()
    assert events == [Ready(socket_type, identity), Message(message)]
    assert conn.data_to_send() == b"\x03\x06\x00\x00"


@settings(max_examples=200, deadline=None)
@given(version=st.sampled_from([2, 3]), peer=st.sampled_from([b"DEALER", b"ROUTER", b"REP"]),
       cuts=st.lists(st.integers(1, 40)))
def test_the_dealer_side_greets_as_a_dealer_and_takes_its_peers_cut_anywhere(version, peer,
                                                                            cuts):
    conn = zmtp.DealerConnection(16, 1000)
    conn.data_to_send()
    numbers = {b"DEALER": 5, b"ROUTER": 6, b"REP": 4}
    if version == 2:
        data = v2_greeting(numbers[peer], b"")
    else:
        data = V3_GREETING + zmtp.command(b"READY", props(Socket_Type=peer))
    events = []
    for piece in split(data + zmtp.encode_message([b"a", b"b"]), cuts):
        conn.receive_data(piece)
        events += conn.next_events()
    assert events == [Ready(peer, b""), Message([b"a", b"b"])]
    out = conn.data_to_send()
    if version == 2:
        assert out == b"\x03\x05\x00\x00"  # DEALER is 5 in ZMTP 2.0
    else:
        assert out.endswith(zmtp.ready_command(b"DEALER"))


def test_the_dealer_side_refuses_a_req_peer():
    conn = zmtp.DealerConnection(16, 1000)
    events = feed(conn, V3_GREETING + zmtp.command(b"READY", props(Socket_Type=b"REQ")))
    assert isinstance(events[0], Closed) and "REQ socket cannot talk to a DEALER" in \
        events[0].reason


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from([2, 3]), at=st.integers(0, 200), junk=st.binary(min_size=1,
                                                                               max_size=64),
       cuts=st.lists(st.integers(1, 30)))
def test_bytes_gone_wrong_at_any_point_of_the_handshake_end_in_one_refusal_or_a_wait(
        version, at, junk, cuts):
    """A peer that breaks off into garbage anywhere in its greeting: the codec raises nothing,
    says Closed at most once (with a reason), or is still waiting for more; nothing it holds
    grows past what came."""
    good = (v2_greeting(5, b"id") if version == 2
            else V3_GREETING + zmtp.command(b"READY", props(Socket_Type=b"DEALER")))
    data = good[:at] + junk
    conn = connection()
    conn.data_to_send()
    events = []
    for piece in split(data, cuts):
        conn.receive_data(piece)
        events += conn.next_events()
    closed = [e for e in events if isinstance(e, Closed)]
    assert len(closed) <= 1 and all(e.reason for e in closed)
    if closed:
        assert conn.closed and conn.buffered == 0
    assert conn.buffered <= len(data)
