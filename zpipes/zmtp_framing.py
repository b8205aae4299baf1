"""ZMTP's framing, as both ends of a connection write it: the signature, the flags of a frame,
a frame's head, commands (READY, PING/PONG, ERROR). No I/O, nothing else imported.

The ZPIPES client (:mod:`zpipes.zmtp`, a DEALER on a plain socket), pzq's client wire
(:mod:`pzq.wire`) and the broker's codec (:mod:`zbroker.zmtp.codec`, every endpoint's server
side) take these from here: one definition of the bytes, in a leaf module light enough for a
client's start.
"""

from __future__ import annotations

#: the first 10 bytes of every greeting, as libzmq writes them (the 1 before 0x7F is a ZMTP
#: 1.0 length: the padding is ignored)
SIGNATURE = b"\xff" + b"\x00" * 7 + b"\x01\x7f"
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
#: a frame this large is written as it is (a buffer of its own in a gathered write), not
#: copied into the framing
LARGE_FRAME = 1 << 14

_SHORT_HEADS = [bytes((0, n)) for n in range(256)]


def frame_head(size: int) -> bytes:
    """The head of a last (single) frame of ``size`` bytes."""
    return _SHORT_HEADS[size] if size < 256 else bytes((LONG,)) + size.to_bytes(8, "big")


def command(name: bytes, body: bytes = b"") -> bytes:
    """A command frame, whole: its head, its name, its body."""
    data = bytes((len(name),)) + name + body
    if len(data) < 256:
        return bytes((COMMAND, len(data))) + data
    return bytes((COMMAND | LONG,)) + len(data).to_bytes(8, "big") + data


def ready_command(socket_type: bytes, identity: bytes | None = None) -> bytes:
    """READY with our socket type, and an Identity property when ``identity`` is given (a
    DEALER's empty one: the ROUTER makes its routing id)."""
    props = _property(b"Socket-Type", socket_type)
    if identity is not None:
        props += _property(b"Identity", identity)
    return command(b"READY", props)


def _property(name: bytes, value: bytes) -> bytes:
    return bytes((len(name),)) + name + len(value).to_bytes(4, "big") + value


def split_command(body: bytes) -> tuple[bytes, bytes]:
    """A command frame's body as its name and its data."""
    if not body:
        return b"", b""
    n = body[0]
    return body[1 : 1 + n], body[1 + n :]


def greeting(as_server: bool = False) -> bytes:
    """A whole ZMTP 3.0 greeting with the NULL mechanism."""
    return (SIGNATURE + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
            + (b"\x01" if as_server else b"\x00") + b"\x00" * 31)


def error_command(reason: str) -> bytes:
    """ERROR with ``reason`` (at most 255 bytes of it)."""
    data = reason.encode("utf-8")[:255]
    return command(b"ERROR", bytes((len(data),)) + data)


def error_reason(data: bytes) -> str:
    """The reason an ERROR command's data gives."""
    return data[1 : 1 + data[0]].decode("utf-8", "replace") if data else ""
