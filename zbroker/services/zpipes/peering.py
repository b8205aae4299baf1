"""What brokers tell each other about pipes: the ZPIPES peer messages. No I/O.

Every message is a list of frames, the first naming it. End ids are the sender's own.

    ATTACH  role ("r"|"w"), end, pipe name    an end was opened on the sender
    DETACH  end [, why lost]                   it was closed (after its last DATA); with a
                                               reason when it ended without a close
    DATA    writer end, reader end, first, chunk   a chunk of the sender's writer for the
                                               receiver's reader; ``first`` starts the stream
    CREDIT  reader end, bytes                  the receiver's reader took that many more bytes
                                               of the sender's writers' data

Fan-out (between brokers whose HELLO says ``"fanout": true``): one DATA carries a chunk for
several readers of the receiver, named one after the other in its first frame (the chunk
crosses the link once, whatever the number of readers there), and one CREDIT carries the
credit of several readers, (reader end, bytes) one after the other. A broker of before is sent
one reader end per DATA and per CREDIT: the frames it knows.

Whole WRITE frames (between brokers whose HELLO says ``"write_frames": true``): a DATA whose
flags have ``FRAMED`` carries the chunk inside the client's WRITE frame it came in (header,
chunk, timeout: the chunk's length is in the header). Its sender sends that frame as it got it,
and its receiver can answer a READ that takes the whole chunk with that very buffer, its header
turned into READ_OK's (zpipes/protocol.py), instead of copying the chunk into a new one.

The pipe directory (brokers whose HELLO says ``"directory": true``, see directory.py)
adds three, between such brokers only; the four above are unchanged:

    REGISTER   (role, end, pipe, answer)...    ends of the sender, for the receiver (their
                                               pipes' home) to hold; ``answer``: say
                                               REGISTERED once they are introduced
    REGISTERED ends                            those ends are introduced to every match
    UNREGISTER ends                            ends of the sender the receiver no longer holds
    INTRODUCE  (pipe, member, theirs, yours)...   from a home: ``theirs`` (role, end) are ends
                                               of ``pipe`` on broker ``member``, matched with
                                               ``yours``, the receiver's own ends, of which
                                               ``member`` is told at the same time

Each is a batch of at most ``MAX_BATCH`` entries or groups.

Confirmation (to brokers whose HELLO says ``"confirm": true``; they number their messages, so
that nothing sent before a message can be missing once it arrived, see
zbroker/cluster/numbering.py):

    CONFIRM    end                             after a writer's DETACH, to the brokers of its
                                               stream's readers: say when it has arrived
    CONFIRMED  end                             the answer: that DETACH and all the stream's
                                               DATA before it are here
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

_END = struct.Struct(">Q")
_TWO = struct.Struct(">QQ")
_ROLE_END = struct.Struct(">cQ")
_WRITE_HEAD = struct.Struct(">2sBI")  # a WRITE frame's signature, id, chunk length
FIRST, FRAMED = 1, 2  # flags of a DATA: the stream starts; the chunk is in its WRITE frame
MAX_BATCH = 1024  # entries of a REGISTER or UNREGISTER, groups of an INTRODUCE; readers of a
# DATA or CREDIT
MAX_MEMBER = 64  # bytes of a broker id in an INTRODUCE


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
    reader_ends: tuple[int, ...]  # one, or (fan-out) several readers of the receiver
    first: bool
    chunk: bytes | memoryview
    #: (to send) the client's WRITE frame around ``chunk``, to be sent instead of it (FRAMED)
    frame: bytes | memoryview | None = None


@dataclass(frozen=True, slots=True)
class Credit:
    credits: tuple[tuple[int, int], ...]  # (reader end, bytes): one, or (fan-out) several


@dataclass(frozen=True, slots=True)
class PeerDecodeError:
    reason: str


@dataclass(frozen=True, slots=True)
class Register:
    entries: tuple[tuple[str, int, bytes, bool], ...]  # (role, end, pipe name, answer)


@dataclass(frozen=True, slots=True)
class Registered:
    ends: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Unregister:
    ends: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Group:
    """One introduction: ``theirs`` are ends of ``pipe`` on broker ``member``; ``yours`` are
    the receiver's ends they were matched with."""

    pipe: bytes
    member: str
    theirs: tuple[tuple[str, int], ...]  # (role, end)
    yours: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Introduce:
    groups: tuple[Group, ...]


@dataclass(frozen=True, slots=True)
class Confirm:
    end: int  # a writer end of the sender, just detached


@dataclass(frozen=True, slots=True)
class Confirmed:
    end: int  # the sender's writer end that a CONFIRM named


PeerMessage = (Attach | Detach | Data | Credit | Register | Registered | Unregister
               | Introduce | Confirm | Confirmed)

_FLAGS = [bytes((i,)) for i in range(4)]
_ROLE_CODE = {"reader": b"r", "writer": b"w"}
_CODE_ROLE = {v: k for k, v in _ROLE_CODE.items()}


def encode(msg: PeerMessage) -> list[bytes | memoryview]:
    if isinstance(msg, Register):
        return [b"REGISTER", *((_ROLE_CODE[role].upper() if answer else _ROLE_CODE[role])
                               + _END.pack(end) + pipe
                               for role, end, pipe, answer in msg.entries)]
    if isinstance(msg, (Unregister, Registered)):
        kind = b"UNREGISTER" if isinstance(msg, Unregister) else b"REGISTERED"
        return [kind, b"".join(_END.pack(end) for end in msg.ends)]
    if isinstance(msg, Introduce):
        frames: list[bytes | memoryview] = [b"INTRODUCE"]
        for g in msg.groups:
            frames += [g.pipe, g.member.encode("utf-8"),
                       b"".join(_ROLE_END.pack(_ROLE_CODE[role], end) for role, end in g.theirs),
                       b"".join(_END.pack(end) for end in g.yours)]
        return frames
    if isinstance(msg, Data):
        ends = msg.reader_ends
        head = (_TWO.pack(msg.writer_end, ends[0]) if len(ends) == 1
                else struct.pack(f">{1 + len(ends)}Q", msg.writer_end, *ends))
        if msg.frame is not None:
            return [b"DATA", head, _FLAGS[FRAMED | msg.first], msg.frame]
        return [b"DATA", head, _FLAGS[msg.first], msg.chunk]
    if isinstance(msg, Credit):
        return [b"CREDIT", b"".join(_TWO.pack(end, size) for end, size in msg.credits)]
    if isinstance(msg, (Confirm, Confirmed)):
        return [b"CONFIRM" if isinstance(msg, Confirm) else b"CONFIRMED", _END.pack(msg.end)]
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
    if kind == b"DATA" and len(sizes) == 3 and sizes[1] == 1:
        return _data(frames[1:], sizes)
    if kind == b"CREDIT" and len(sizes) == 1 and sizes[0] and sizes[0] % 16 == 0 \
            and sizes[0] <= 16 * MAX_BATCH:
        return Credit(tuple(_TWO.iter_unpack(frames[1])))
    if kind == b"ATTACH" and len(sizes) == 3 and sizes[1] == 8 and 1 <= sizes[2] <= 255:
        role = _CODE_ROLE.get(bytes(frames[1]))
        if role is not None:
            return Attach(role, _END.unpack(frames[2])[0], bytes(frames[3]))
    if kind == b"DETACH" and (sizes == [8] or (len(sizes) == 2 and sizes[0] == 8
                                               and 1 <= sizes[1] <= 255)):
        lost = bytes(frames[2]).decode("utf-8", "replace") if len(sizes) == 2 else None
        return Detach(_END.unpack(frames[1])[0], lost)
    if kind in (b"CONFIRM", b"CONFIRMED") and sizes == [8]:
        end = _END.unpack(frames[1])[0]
        return Confirm(end) if kind == b"CONFIRM" else Confirmed(end)
    if kind == b"REGISTER":
        return _register(frames[1:])
    if kind in (b"UNREGISTER", b"REGISTERED") and len(sizes) == 1 and sizes[0] \
            and sizes[0] % 8 == 0 and sizes[0] <= 8 * MAX_BATCH:
        ends = tuple(e for (e,) in _END.iter_unpack(bytes(frames[1])))
        return Unregister(ends) if kind == b"UNREGISTER" else Registered(ends)
    if kind == b"INTRODUCE":
        return _introduce(frames[1:])
    return PeerDecodeError(f"malformed peer message {kind[:20]!r} with frame sizes {sizes[:8]}")


def _data(frames: Sequence[bytes | memoryview], sizes: list[int]) -> Data | PeerDecodeError:
    head, flags, chunk = sizes[0], frames[1][0], frames[2]
    if head == 16:
        writer_end, reader_end = _TWO.unpack(frames[0])
        readers: tuple[int, ...] = (reader_end,)
    elif head > 16 and head % 8 == 0 and head <= 8 * (1 + MAX_BATCH):
        writer_end, *ends = struct.unpack(f">{head // 8}Q", frames[0])
        readers = tuple(dict.fromkeys(ends))  # a reader named twice takes the chunk once
    else:
        return PeerDecodeError(f"DATA with a head of {head} bytes")
    if flags & ~(FIRST | FRAMED):
        return PeerDecodeError(f"DATA with unknown flags {flags:#x}")
    if flags & FRAMED:  # the chunk is in its WRITE frame: header (7), chunk, timeout (4)
        size = sizes[2] - 11
        if size < 0 or _WRITE_HEAD.unpack_from(chunk)[2] != size \
                or bytes(chunk[:2]) != b"\xaa\xa0":
            return PeerDecodeError("DATA with a malformed WRITE frame")
        chunk = memoryview(chunk)[7:7 + size]
    return Data(writer_end, readers, bool(flags & FIRST), chunk)


def _register(frames: Sequence[bytes | memoryview]) -> Register | PeerDecodeError:
    if not 1 <= len(frames) <= MAX_BATCH:
        return PeerDecodeError(f"REGISTER of {len(frames)} entries (1 to {MAX_BATCH})")
    entries = []
    for frame in frames:
        data = bytes(frame)
        role = _CODE_ROLE.get(data[:1].lower())
        if role is None or not 10 <= len(data) <= 9 + 255:
            return PeerDecodeError(f"malformed REGISTER entry of {len(data)} bytes")
        entries.append((role, _END.unpack_from(data, 1)[0], data[9:], data[:1].isupper()))
    return Register(tuple(entries))


def _introduce(frames: Sequence[bytes | memoryview]) -> Introduce | PeerDecodeError:
    if not frames or len(frames) % 4 or len(frames) > 4 * MAX_BATCH:
        return PeerDecodeError(f"INTRODUCE of {len(frames)} frames (groups of 4, at most "
                               f"{MAX_BATCH})")
    groups = []
    for i in range(0, len(frames), 4):
        pipe, member, theirs, yours = (bytes(f) for f in frames[i:i + 4])
        if not (1 <= len(pipe) <= 255 and 1 <= len(member) <= MAX_MEMBER
                and len(theirs) % 9 == 0 and len(yours) % 8 == 0
                and len(theirs) <= 9 * MAX_BATCH and len(yours) <= 8 * MAX_BATCH):
            return PeerDecodeError("malformed INTRODUCE group")
        try:
            name = member.decode("utf-8")
        except UnicodeDecodeError:
            return PeerDecodeError("INTRODUCE names a broker id that is not UTF-8")
        ends = []
        for code, end in _ROLE_END.iter_unpack(theirs):
            role = _CODE_ROLE.get(code)
            if role is None:
                return PeerDecodeError("INTRODUCE with an unknown role")
            ends.append((role, end))
        groups.append(Group(pipe, name, tuple(ends),
                            tuple(e for (e,) in _END.iter_unpack(yours))))
    return Introduce(tuple(groups))
