"""The pzq wire codec and the log records: pure functions, no sockets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pzq import wire
from zbroker.services.pzq.core import records


def test_produce_with_headers_and_several_body_frames():
    p = wire.decode_produce([b"id1", b"REPLICA:x", b"H2", b"", b"a", b"bc"])
    assert p == wire.Produce(b"id1", (b"REPLICA:x", b"H2"), (b"a", b"bc"))
    assert p.size == 3 and p.is_replica


def test_produce_without_headers():
    assert wire.decode_produce([b"i", b"", b"body"]) == wire.Produce(b"i", (), (b"body",))


def test_malformed_produce_is_an_error_value_with_the_id():
    assert wire.decode_produce([b"id"]) == wire.WireError(wire.MALFORMED, b"id")
    assert wire.decode_produce([b"id", b"x", b"y"]) == wire.WireError(wire.MALFORMED, b"id")
    assert wire.decode_produce([b"id", b""]) == wire.WireError(wire.EMPTY, b"id")
    assert wire.decode_produce([]) == wire.WireError(wire.MALFORMED, None)


def test_producer_ack_frames():
    assert wire.producer_ack(b"i") == [b"i", b"1", b""]
    assert wire.producer_ack(b"i", False, "Queue full") == [b"i", b"0", b"", b"Queue full"]
    assert wire.producer_ack(b"i", True, wire.REPLICATION_FAILED)[3] == b"REPLICATION_FAILED"


def test_delivery_frames():
    assert wire.delivery(b"k", 12, 5_000_000, [b"a", b"b"]) == [
        b"k", b"12", b"5000000", b"", b"a", b"b"]


def test_consumer_ack():
    assert wire.decode_consumer_ack([b"k", b"1"]) == wire.ConsumerAck(b"k", True)
    assert wire.decode_consumer_ack([b"k", b"0"]) == wire.ConsumerAck(b"k", False)
    assert isinstance(wire.decode_consumer_ack([b"k"]), wire.WireError)
    assert isinstance(wire.decode_consumer_ack([b"k", b"yes"]), wire.WireError)


def test_monitor_request_and_text():
    assert wire.split_monitor_request([b"", b"MONITOR"]) == [b""]
    assert wire.split_monitor_request([b"MONITOR"]) == [b""]
    assert wire.split_monitor_request([b"", b"PING"]) is None
    text = wire.monitor_text({"messages": 3, "syncs": 7})
    assert text == b"messages: 3\nsyncs: 7\n"
    assert wire.parse_monitor_text(text) == {"messages": 3, "syncs": 7}


@given(st.lists(st.binary(max_size=8), max_size=6))
def test_decoders_never_raise(frames):
    for decode in (wire.decode_produce, wire.decode_consumer_ack):
        r = decode(frames)
        assert isinstance(r, wire.WireError | wire.Produce | wire.ConsumerAck)


@given(st.integers(0, 2**64 - 1), st.binary(max_size=60), st.binary(max_size=40),
       st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_message_record_round_trip(seq, key, msg_id, frames):
    data = records.encode(records.message_parts(seq, key, msg_id, frames))
    [(end, rec)] = list(records.scan(data))
    assert end == len(data)
    assert rec == records.MessageRecord(seq, key, msg_id, tuple(frames))
    # the size the log counts a record it has not encoded yet at
    assert len(data) == records.message_size(key, msg_id, frames) + records.HEADER.size


def test_ack_record_round_trip_and_corruption_stops_the_scan():
    a = records.encode([records.ack_payload([1, 2, 3])])
    b = records.encode(records.message_parts(4, b"k", b"i", [b"body"]))
    assert [r for _, r in records.scan(a + b)] == [
        records.AckRecord((1, 2, 3)), records.MessageRecord(4, b"k", b"i", (b"body",))]
    flipped = bytearray(a + b)
    flipped[len(a) + 12] ^= 0x01  # a bit of the second record's payload
    assert [r for _, r in records.scan(bytes(flipped))] == [records.AckRecord((1, 2, 3))]
    assert list(records.scan(b"\0" * 16)) == []  # zeroes (a preallocated tail) end it too
