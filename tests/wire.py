"""A ZPIPES client written from the original's byte table alone, independent of zpipes.protocol,
to show that a client speaking the original protocol works with our broker unchanged."""

from __future__ import annotations

import struct

import zmq

SIG = b"\xaa\xa0"
INPUT, INPUT_OK, INPUT_FAILED, OUTPUT, OUTPUT_OK, OUTPUT_FAILED = 1, 2, 3, 4, 5, 6
READ, READ_OK, READ_END, READ_TIMEOUT, READ_FAILED = 7, 8, 9, 10, 11
WRITE, WRITE_OK, WRITE_TIMEOUT, WRITE_FAILED = 12, 13, 14, 15
CLOSE, CLOSE_OK, CLOSE_FAILED, PING, PING_OK, INVALID = 16, 17, 18, 19, 20, 21


def string(s: bytes) -> bytes:
    return bytes([len(s)]) + s


def input_(name: bytes) -> bytes:
    return SIG + bytes([INPUT]) + string(name)


def output(name: bytes) -> bytes:
    return SIG + bytes([OUTPUT]) + string(name)


def read(size: int, timeout: int) -> bytes:
    return SIG + bytes([READ]) + struct.pack(">II", size, timeout)


def write(data: bytes, timeout: int) -> bytes:
    return SIG + bytes([WRITE]) + struct.pack(">I", len(data)) + data + struct.pack(">I", timeout)


def close() -> bytes:
    return SIG + bytes([CLOSE])


def ping() -> bytes:
    return SIG + bytes([PING])


def parse(frame: bytes) -> tuple[int, bytes | str | None]:
    """(id, payload): the chunk of READ_OK, the reason of *_FAILED, None otherwise."""
    assert frame[:2] == SIG, frame
    mid = frame[2]
    if mid == READ_OK:
        (size,) = struct.unpack(">I", frame[3:7])
        assert len(frame) == 7 + size
        return mid, frame[7:]
    if mid in (INPUT_FAILED, OUTPUT_FAILED, READ_FAILED, WRITE_FAILED, CLOSE_FAILED):
        assert len(frame) == 4 + frame[3]
        return mid, frame[4:].decode()
    assert len(frame) == 3, frame
    return mid, None


class RawClient:
    """One DEALER, like the original C client: send a frame, receive a frame."""

    def __init__(self, ctx: zmq.Context, endpoint: str, timeout_ms: int = 5000) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        self.sock.connect(endpoint)

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def recv(self) -> tuple[int, bytes | str | None]:
        return parse(self.sock.recv())

    def call(self, frame: bytes) -> tuple[int, bytes | str | None]:
        self.send(frame)
        return self.recv()

    def nothing_within(self, ms: int) -> bool:
        return not self.sock.poll(ms)

    def close(self) -> None:
        self.sock.close()
