"""The ZMTP framing both ends share (zpipes.zmtp_framing): commands, short and long, read
back as they were written, and a DEALER's READY as the broker's codec reads it."""

from __future__ import annotations

import pytest

from zbroker.zmtp import codec
from zpipes import zmtp_framing as f


@pytest.mark.parametrize("size", [0, 1, 200, 253, 254, 300, 70_000])
def test_a_command_reads_back_as_its_name_and_data(size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frame = f.command(b"PING", data)
    assert frame[0] & f.COMMAND
    if len(frame) - 2 <= 255:
        head, body = frame[:2], frame[2:]
        assert head == bytes((f.COMMAND, len(body)))
    else:
        head, body = frame[:9], frame[9:]
        assert head[0] == f.COMMAND | f.LONG and int.from_bytes(head[1:], "big") == len(body)
    assert f.split_command(body) == (b"PING", data)


def test_an_error_gives_its_reason():
    name, data = f.split_command(f.command(b"ERROR", b"\x0bnot allowed")[2:])
    assert name == b"ERROR" and f.error_reason(data) == "not allowed"
    assert f.error_reason(b"") == "" and f.split_command(b"") == (b"", b"")


def test_a_dealers_ready_as_the_codec_reads_it():
    name, data = f.split_command(f.ready_command(b"DEALER", identity=b"")[2:])
    assert name == b"READY"
    assert codec.parse_properties(data) == {b"socket-type": b"DEALER", b"identity": b""}
    _, data = f.split_command(codec.ready_command()[2:])
    assert codec.parse_properties(data) == {b"socket-type": b"ROUTER"}


@pytest.mark.parametrize("size", [0, 255, 256, 1 << 20])
def test_a_frame_head_says_its_size(size):
    head = f.frame_head(size)
    if size < 256:
        assert head == bytes((0, size))
    else:
        assert head[0] == f.LONG and int.from_bytes(head[1:], "big") == size
