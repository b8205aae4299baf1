"""What brokers tell each other about pipes: the ZPIPES peer messages. No I/O.

Every message is a list of frames, the first naming it. End ids are the sender's own.

    ATTACH  role ("r"|"w"), end, pipe name    an end was opened on the sender
    DETACH  end [, why lost]                   it was closed (after its last DATA); with a
                                               reason when it ended without a close
    DATA    writer end, reader end, first, chunk   a chunk of the sender's writer for the
                                               receiver's reader; ``first`` starts the stream
    CREDIT  reader end, bytes                  the receiver's reader took that many more bytes
                                               of the sender's writers' data
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

_END = struct.Struct(">Q")
_TWO = struct.Struct(">QQ")


@dataclass(frozen=True, slots=True)
class Attach:
    role: str  # "reader" or "writer"
    end: int
    pipe: bytes


@dataclass(frozen=True, slots=True)
class Detach:
    end: int
    lost: str | None = None  # why it ended without a close (its stream broke), if it did


@dataclass(frozen=True, slots=True)
class Data:
    writer_end: int
    reader_end: int
    first: bool
    chunk: bytes | memoryview


@dataclass(frozen=True, slots=True)
class Credit:
    reader_end: int
    size: int


@dataclass(frozen=True, slots=True)
class PeerDecodeError:
    reason: str


PeerMessage = Attach | Detach | Data | Credit

_ROLE_CODE = {"reader": b"r", "writer": b"w"}
_CODE_ROLE = {v: k for k, v in _ROLE_CODE.items()}


def encode(msg: PeerMessage) -> list[bytes | memoryview]:
    if isinstance(msg, Data):
        return [b"DATA", _TWO.pack(msg.writer_end, msg.reader_end),
                b"\x01" if msg.first else b"\x00", msg.chunk]
    if isinstance(msg, Credit):
        return [b"CREDIT", _TWO.pack(msg.reader_end, msg.size)]
    if isinstance(msg, Attach):
        return [b"ATTACH", _ROLE_CODE[msg.role], _END.pack(msg.end), msg.pipe]
    if msg.lost is None:
        return [b"DETACH", _END.pack(msg.end)]
    return [b"DETACH", _END.pack(msg.end), msg.lost.encode("utf-8", "replace")[:255]]


def decode(frames: Sequence[bytes | memoryview]) -> PeerMessage | PeerDecodeError:
    if not frames:
        return PeerDecodeError("no frames")
    kind = bytes(frames[0])
    sizes = [len(f) for f in frames[1:]]
    if kind == b"DATA" and sizes[:2] == [16, 1] and len(sizes) == 3:
        writer_end, reader_end = _TWO.unpack(frames[1])
        return Data(writer_end, reader_end, bytes(frames[2]) == b"\x01", frames[3])
    if kind == b"CREDIT" and sizes == [16]:
        return Credit(*_TWO.unpack(frames[1]))
    if kind == b"ATTACH" and len(sizes) == 3 and sizes[1] == 8 and 1 <= sizes[2] <= 255:
        role = _CODE_ROLE.get(bytes(frames[1]))
        if role is not None:
            return Attach(role, _END.unpack(frames[2])[0], bytes(frames[3]))
    if kind == b"DETACH" and (sizes == [8] or (len(sizes) == 2 and sizes[0] == 8
                                               and 1 <= sizes[1] <= 255)):
        lost = bytes(frames[2]).decode("utf-8", "replace") if len(sizes) == 2 else None
        return Detach(_END.unpack(frames[1])[0], lost)
    return PeerDecodeError(f"malformed peer message {kind[:20]!r} with frame sizes {sizes[:8]}")
