"""The ZPIPES codec: byte-exact with the original's wire, round-trips, and no exception on any
input."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zpipes import protocol as p

# Bytes seen on the wire of the original broker and client.
WIRE_EXAMPLES = [
    (p.Input(b"hello"), "aa a0 01 05 68 65 6c 6c 6f"),
    (p.Output(b"hello"), "aa a0 04 05 68 65 6c 6c 6f"),
    (p.Write(b"abc", 1000), "aa a0 0c 00 00 00 03 61 62 63 00 00 03 e8"),
    (p.Read(3, 1000), "aa a0 07 00 00 00 03 00 00 03 e8"),
    (p.ReadOk(b"abc"), "aa a0 08 00 00 00 03 61 62 63"),
    (p.InputFailed(""), "aa a0 03 00"),
    (p.Ping(), "aa a0 13"),
    (p.PingOk(), "aa a0 14"),
    (p.Close(), "aa a0 10"),
    (p.CloseOk(), "aa a0 11"),
    (p.Invalid(), "aa a0 15"),
]


@pytest.mark.parametrize(("msg", "wire"), WIRE_EXAMPLES, ids=lambda v: type(v).__name__)
def test_wire_bytes_match_the_original(msg, wire):
    assert p.encode(msg) == bytes.fromhex(wire)
    assert p.decode(bytes.fromhex(wire)) == msg


def test_message_ids_match_the_table():
    names = ["INPUT", "INPUT_OK", "INPUT_FAILED", "OUTPUT", "OUTPUT_OK", "OUTPUT_FAILED", "READ",
             "READ_OK", "READ_END", "READ_TIMEOUT", "READ_FAILED", "WRITE", "WRITE_OK",
             "WRITE_TIMEOUT", "WRITE_FAILED", "CLOSE", "CLOSE_OK", "CLOSE_FAILED", "PING",
             "PING_OK", "INVALID"]
    assert [(m.name, m.value) for m in p.MessageId] == [(n, i + 1) for i, n in enumerate(names)]
    assert set(p.LAYOUT) == set(p.MessageId)


names = st.binary(max_size=255)
texts = st.text(max_size=60)
u32 = st.integers(0, 2**32 - 1)
chunks = st.binary(max_size=4096)

messages = st.one_of(
    st.builds(p.Input, names), st.builds(p.Output, names),
    st.builds(p.Read, u32, u32), st.builds(p.Write, chunks, u32),
    st.builds(p.ReadOk, chunks),
    st.builds(p.InputFailed, texts), st.builds(p.OutputFailed, texts),
    st.builds(p.ReadFailed, texts), st.builds(p.WriteFailed, texts),
    st.builds(p.CloseFailed, texts),
    *[st.just(cls()) for cls in (p.InputOk, p.OutputOk, p.ReadEnd, p.ReadTimeout, p.WriteOk,
                                 p.WriteTimeout, p.Close, p.CloseOk, p.Ping, p.PingOk, p.Invalid)],
)


@given(messages)
def test_every_message_round_trips(msg):
    frame = p.encode(msg)
    assert frame[:2] == b"\xaa\xa0" and frame[2] == msg.id
    assert p.decode(frame) == msg


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(data):
    result = p.decode(data)
    assert isinstance(result, (p.DecodeError, *[cls for cls, _ in p.LAYOUT.values()]))
    if not isinstance(result, p.DecodeError):
        assert p.encode(result) == data  # what decodes is exactly what it says


@given(messages, st.data())
def test_any_truncation_or_extension_is_an_error(msg, data):
    frame = p.encode(msg)
    cut = data.draw(st.integers(0, len(frame) - 1))
    assert isinstance(p.decode(frame[:cut]), p.DecodeError)
    extra = data.draw(st.binary(min_size=1, max_size=8))
    assert isinstance(p.decode(frame + extra), p.DecodeError)


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"", "shorter than a header"),
        (b"\xaa", "shorter than a header"),
        (b"\xab\xa0\x13", "bad signature"),
        (b"\xaa\xa0\x00", "unknown message id 0"),
        (b"\xaa\xa0\x16", "unknown message id 22"),
        (b"\xaa\xa0\x01", "INPUT: truncated pipename"),
        (b"\xaa\xa0\x01\x05abc", "INPUT: pipename overruns"),
        (b"\xaa\xa0\x07\x00\x00\x00\x03", "READ: truncated timeout"),
        (b"\xaa\xa0\x0c\xff\xff\xff\xffabc", "WRITE: chunk of 4294967295 bytes overruns"),
        (b"\xaa\xa0\x13\x00", "PING: 1 trailing bytes"),
    ],
)
def test_malformed_frames_say_what_is_wrong(frame, says):
    result = p.decode(frame)
    assert isinstance(result, p.DecodeError)
    assert says in result.reason


def test_direction_is_checked():
    assert p.decode_command([p.encode(p.Ping())]) == p.Ping()
    err = p.decode_command([p.encode(p.ReadOk(b"x"))])
    assert isinstance(err, p.DecodeError) and "broker reply" in err.reason
    err = p.decode_reply([p.encode(p.Write(b"x", 0))])
    assert isinstance(err, p.DecodeError) and "client command" in err.reason
    err = p.decode_command([p.encode(p.Ping()), p.encode(p.Ping())])
    assert isinstance(err, p.DecodeError) and "exactly one frame" in err.reason
    assert isinstance(p.decode_command([]), p.DecodeError)


def test_long_names_are_refused_not_mis_encoded():
    """Defect 10: names over 255 bytes were silently mis-encoded by the original."""
    with pytest.raises(ValueError, match="at most 255"):
        p.encode(p.Input(b"x" * 256))
    assert p.encode(p.Input(b"x" * 255))[3] == 255
    with pytest.raises(ValueError):
        p.encode(p.Read(2**32, 0))
    with pytest.raises(ValueError):
        p.encode(p.Read(-1, 0))


def test_reason_text_fits_a_string_without_splitting_a_character():
    cut = p.reason_text("é" * 200)  # 400 bytes of UTF-8
    assert len(cut.encode()) <= 255 and cut == "é" * 127
    assert p.decode(p.encode(p.ReadFailed(cut))) == p.ReadFailed(cut)


def test_write_chunk_is_a_zero_copy_view():
    frame = bytearray(p.encode(p.Write(b"payload", 7)))
    msg = p.decode(frame)
    frame[7] = ord("P")
    assert bytes(msg.chunk) == b"Payload"


def test_helpers_build_the_same_frames():
    assert p.encode_read_ok([b"ab", memoryview(b"cd")]) == p.encode(p.ReadOk(b"abcd"))
    head, tail = p.encode_write_parts(b"abc", 1000)
    assert head + b"abc" + tail == p.encode(p.Write(b"abc", 1000))
    assert struct.unpack(">I", tail)[0] == 1000


def test_peer_detach_says_why_an_end_was_lost_and_stays_compatible():
    from zbroker.services.zpipes import peering

    assert peering.decode(peering.encode(peering.Detach(7))) == peering.Detach(7)
    lost = peering.Detach(7, "expired")
    assert peering.decode(peering.encode(lost)) == lost
    assert isinstance(peering.decode([b"DETACH", b"\0" * 8, b""]), peering.PeerDecodeError)
