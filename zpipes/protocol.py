"""The ZPIPES wire protocol: message types, encoding and decoding. No I/O.

Every ZPIPES message is exactly one ZeroMQ frame::

    0xAA 0xA0 | message id (1 byte) | fields...

Fields, in the order of the table below: a *string* is a 1-byte length and that many bytes
(so at most 255 bytes), a *number-4* is a big-endian unsigned 32-bit integer, a *chunk* is a
number-4 length and that many bytes.

Decoding never raises: a malformed frame gives a :class:`DecodeError` value that says what is
wrong, so a service can answer INVALID and carry on.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import IntEnum

TYPE_CHECKING = False  # (typing is not imported at run time: see zpipes/__init__.py)
if TYPE_CHECKING:
    from typing import Any

SIGNATURE = b"\xaa\xa0"
MAX_STRING = 255
MAX_NUMBER4 = 0xFFFFFFFF

_U32 = struct.Struct(">I")
_TWO_U32 = struct.Struct(">II")
_HEADER_CHUNK = struct.Struct(">2sBI")  # signature, id, chunk length


class MessageId(IntEnum):
    INPUT = 1
    INPUT_OK = 2
    INPUT_FAILED = 3
    OUTPUT = 4
    OUTPUT_OK = 5
    OUTPUT_FAILED = 6
    READ = 7
    READ_OK = 8
    READ_END = 9
    READ_TIMEOUT = 10
    READ_FAILED = 11
    WRITE = 12
    WRITE_OK = 13
    WRITE_TIMEOUT = 14
    WRITE_FAILED = 15
    CLOSE = 16
    CLOSE_OK = 17
    CLOSE_FAILED = 18
    PING = 19
    PING_OK = 20
    INVALID = 21


_set = object.__setattr__


class _Message:
    """What every message is: immutable, equal to another of its kind with equal fields,
    shown with its fields (as a frozen dataclass would be; written out, because importing
    dataclasses and building the classes with it was most of a client's start-up)."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of {type(self).__name__}")


# --- messages a client sends (commands) ------------------------------------------------------


class Input(_Message):
    """Open the pipe for reading."""

    __slots__ = ("pipename",)
    _fields = ("pipename",)
    pipename: bytes
    id = MessageId.INPUT

    def __init__(self, pipename: bytes) -> None:
        _set(self, "pipename", pipename)


class Output(_Message):
    """Open the pipe for writing."""

    __slots__ = ("pipename",)
    _fields = ("pipename",)
    pipename: bytes
    id = MessageId.OUTPUT

    def __init__(self, pipename: bytes) -> None:
        _set(self, "pipename", pipename)


class Read(_Message):
    """Read up to ``size`` bytes; ``timeout`` in ms, 0 = wait for ever."""

    __slots__ = ("size", "timeout")
    _fields = ("size", "timeout")
    size: int
    timeout: int
    id = MessageId.READ

    def __init__(self, size: int, timeout: int) -> None:
        _set(self, "size", size)
        _set(self, "timeout", timeout)


class Write(_Message):
    """Write one chunk; ``timeout`` in ms, 0 = wait for ever."""

    __slots__ = ("chunk", "timeout")
    _fields = ("chunk", "timeout")
    chunk: bytes
    timeout: int
    id = MessageId.WRITE

    def __init__(self, chunk: bytes, timeout: int) -> None:
        _set(self, "chunk", chunk)
        _set(self, "timeout", timeout)


class Withheld:
    """The chunk of a WRITE that the broker's transport let go as it arrived, being over the
    broker's limit (or for ``reason``: over its budget): only its ``size`` is known. It holds
    no bytes (its ``len`` is 0), and the server refuses it whenever it is tried."""

    __slots__ = ("size", "reason")

    def __init__(self, size: int, reason: str | None = None) -> None:
        self.size = size
        self.reason = reason

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"Withheld({self.size})"


class Close(_Message):
    __slots__ = ()
    id = MessageId.CLOSE


class Ping(_Message):
    __slots__ = ()
    id = MessageId.PING


# --- messages the broker sends (replies) -----------------------------------------------------


class InputOk(_Message):
    __slots__ = ()
    id = MessageId.INPUT_OK


class InputFailed(_Message):
    __slots__ = ("reason",)
    _fields = ("reason",)
    reason: str
    id = MessageId.INPUT_FAILED

    def __init__(self, reason: str) -> None:
        _set(self, "reason", reason)


class OutputOk(_Message):
    __slots__ = ()
    id = MessageId.OUTPUT_OK


class OutputFailed(_Message):
    __slots__ = ("reason",)
    _fields = ("reason",)
    reason: str
    id = MessageId.OUTPUT_FAILED

    def __init__(self, reason: str) -> None:
        _set(self, "reason", reason)


class ReadOk(_Message):
    __slots__ = ("chunk",)
    _fields = ("chunk",)
    chunk: bytes
    id = MessageId.READ_OK

    def __init__(self, chunk: bytes) -> None:
        _set(self, "chunk", chunk)


class ReadEnd(_Message):
    __slots__ = ()
    id = MessageId.READ_END


class ReadTimeout(_Message):
    __slots__ = ()
    id = MessageId.READ_TIMEOUT


class ReadFailed(_Message):
    __slots__ = ("reason",)
    _fields = ("reason",)
    reason: str
    id = MessageId.READ_FAILED

    def __init__(self, reason: str) -> None:
        _set(self, "reason", reason)


class WriteOk(_Message):
    __slots__ = ()
    id = MessageId.WRITE_OK


class WriteTimeout(_Message):
    __slots__ = ()
    id = MessageId.WRITE_TIMEOUT


class WriteFailed(_Message):
    __slots__ = ("reason",)
    _fields = ("reason",)
    reason: str
    id = MessageId.WRITE_FAILED

    def __init__(self, reason: str) -> None:
        _set(self, "reason", reason)


class CloseOk(_Message):
    __slots__ = ()
    id = MessageId.CLOSE_OK


class CloseFailed(_Message):
    __slots__ = ("reason",)
    _fields = ("reason",)
    reason: str
    id = MessageId.CLOSE_FAILED

    def __init__(self, reason: str) -> None:
        _set(self, "reason", reason)


class PingOk(_Message):
    __slots__ = ()
    id = MessageId.PING_OK


class Invalid(_Message):
    __slots__ = ()
    id = MessageId.INVALID


Command = Input | Output | Read | Write | Close | Ping
Reply = (
    InputOk | InputFailed | OutputOk | OutputFailed | ReadOk | ReadEnd | ReadTimeout | ReadFailed
    | WriteOk | WriteTimeout | WriteFailed | CloseOk | CloseFailed | PingOk | Invalid
)
Message = Command | Reply


class DecodeError(_Message):
    """A frame that is not a valid ZPIPES message (of the expected direction)."""

    __slots__ = ("reason",)
    _fields = ("reason",)
    reason: str

    def __init__(self, reason: str) -> None:
        _set(self, "reason", reason)


# Field layout of every message: "s" string, "4" number-4, "c" chunk.
# The order of the letters is the order of the fields and of the dataclass attributes.
LAYOUT: dict[MessageId, tuple[type, str]] = {
    MessageId.INPUT: (Input, "s"),
    MessageId.INPUT_OK: (InputOk, ""),
    MessageId.INPUT_FAILED: (InputFailed, "s"),
    MessageId.OUTPUT: (Output, "s"),
    MessageId.OUTPUT_OK: (OutputOk, ""),
    MessageId.OUTPUT_FAILED: (OutputFailed, "s"),
    MessageId.READ: (Read, "44"),
    MessageId.READ_OK: (ReadOk, "c"),
    MessageId.READ_END: (ReadEnd, ""),
    MessageId.READ_TIMEOUT: (ReadTimeout, ""),
    MessageId.READ_FAILED: (ReadFailed, "s"),
    MessageId.WRITE: (Write, "c4"),
    MessageId.WRITE_OK: (WriteOk, ""),
    MessageId.WRITE_TIMEOUT: (WriteTimeout, ""),
    MessageId.WRITE_FAILED: (WriteFailed, "s"),
    MessageId.CLOSE: (Close, ""),
    MessageId.CLOSE_OK: (CloseOk, ""),
    MessageId.CLOSE_FAILED: (CloseFailed, "s"),
    MessageId.PING: (Ping, ""),
    MessageId.PING_OK: (PingOk, ""),
    MessageId.INVALID: (Invalid, ""),
}

COMMAND_IDS = frozenset(
    {MessageId.INPUT, MessageId.OUTPUT, MessageId.READ, MessageId.WRITE, MessageId.CLOSE,
     MessageId.PING}
)
REPLY_IDS = frozenset(MessageId) - COMMAND_IDS
_MESSAGE_IDS = {int(m): m for m in MessageId}  # faster than MessageId(n)
# By class (a set of classes is faster to ask than one of enum members)
_COMMAND_TYPES = frozenset(LAYOUT[m][0] for m in COMMAND_IDS)
_REPLY_TYPES = frozenset(LAYOUT[m][0] for m in REPLY_IDS)
# The messages without fields, by id: each one value (they are immutable), decoded at once
_BARE: dict[int, Message] = {int(m): cls() for m, (cls, layout) in LAYOUT.items() if not layout}

# Which string fields carry text (str) rather than names (bytes).
_TEXT_FIELDS = frozenset({"reason"})


def reason_text(text: str) -> str:
    """Cut a human reason so that it fits a ZPIPES string (255 bytes of UTF-8)."""
    raw = text.encode("utf-8")
    if len(raw) <= MAX_STRING:
        return text
    return raw[:MAX_STRING].decode("utf-8", errors="ignore")


# --- encoding --------------------------------------------------------------------------------


def encode(msg: Message) -> bytes:
    """Encode one message as one frame. Raises ValueError for a value the wire cannot carry
    (a string over 255 bytes, a number outside 0..2**32-1); it never truncates silently."""
    cls, layout = LAYOUT[msg.id]
    parts = [SIGNATURE, bytes((msg.id,))]
    for letter, name in zip(layout, _field_names(cls), strict=True):
        value = getattr(msg, name)
        if letter == "s":
            raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            if len(raw) > MAX_STRING:
                raise ValueError(f"{cls.__name__}.{name} is {len(raw)} bytes; at most 255 fit")
            parts += (bytes((len(raw),)), raw)
        elif letter == "4":
            if not 0 <= value <= MAX_NUMBER4:
                raise ValueError(f"{cls.__name__}.{name}={value} is not a 32-bit unsigned number")
            parts.append(_U32.pack(value))
        else:
            if len(value) > MAX_NUMBER4:
                raise ValueError(f"{cls.__name__}.{name} is too long for a chunk")
            parts += (_U32.pack(len(value)), value)
    return b"".join(parts)


def encode_read_ok(chunks: Sequence[bytes | memoryview]) -> bytes | memoryview:
    """READ_OK whose chunk is the concatenation of ``chunks``, built with one copy; or with
    none when ``chunks`` is one whole chunk of a WRITE frame that we received into a writable
    buffer: that frame's header is then turned into READ_OK's in place (both are signature, id,
    chunk length) and the answer is a view of the frame without the WRITE's timeout."""
    if len(chunks) == 1:
        frame = write_frame_of(chunks[0])
        if frame is not None:
            frame[2] = MessageId.READ_OK
            return frame[: len(frame) - 4]
    size = sum(len(c) for c in chunks)
    return b"".join([_HEADER_CHUNK.pack(SIGNATURE, MessageId.READ_OK, size), *chunks])


def write_frame_of(chunk: bytes | memoryview) -> memoryview | None:
    """The whole WRITE frame (or one already turned into READ_OK) around ``chunk``, if
    ``chunk`` is the chunk view that :func:`decode` made of a writable frame (or that
    zbroker.services.zpipes.peering made of a peer's DATA that carried its WRITE frame).

    decode's chunk view of a WRITE of n bytes is the only view of n bytes over a frame of
    n + 11 bytes that says n in its header: what the pipes cut from it is shorter, and a
    peer's plain chunk is a frame of its own."""
    base = getattr(chunk, "obj", None)
    if base is None or type(base) is bytes:
        return None
    try:
        frame = memoryview(base)
    except TypeError:
        return None
    size = len(chunk)
    if (frame.readonly or len(frame) != size + 11 or frame.format != "B"
            or frame[0] != 0xAA or frame[1] != 0xA0
            or frame[2] not in (MessageId.WRITE, MessageId.READ_OK)
            or _U32.unpack_from(frame, 3)[0] != size):
        return None
    return frame


def encode_write_parts(chunk: bytes | memoryview, timeout: int) -> tuple[bytes, bytes]:
    """Header and trailer of a WRITE around ``chunk``, for callers that assemble the frame
    in a buffer of their own (no copy of the chunk here)."""
    if not 0 <= timeout <= MAX_NUMBER4:
        raise ValueError(f"Write.timeout={timeout} is not a 32-bit unsigned number")
    return _HEADER_CHUNK.pack(SIGNATURE, MessageId.WRITE, len(chunk)), _U32.pack(timeout)


# --- decoding --------------------------------------------------------------------------------


def decode(frame: bytes | memoryview) -> Message | DecodeError:
    """Decode one frame. Chunks are returned as zero-copy slices of ``frame``."""
    data = memoryview(frame)
    size = len(data)
    # The bulk of the traffic first and in few steps: READ and WRITE, their answers.
    if size >= 11 and data[0] == 0xAA and data[1] == 0xA0:
        mid = data[2]
        if mid == 12:  # WRITE
            length = _U32.unpack_from(data, 3)[0]
            if length == size - 11:
                return Write(data[7 : size - 4], _U32.unpack_from(data, size - 4)[0])
        elif mid == 8:  # READ_OK
            if _U32.unpack_from(data, 3)[0] == size - 7:
                return ReadOk(data[7:])
        elif mid == 7 and size == 11:  # READ
            return Read(*_TWO_U32.unpack_from(data, 3))
    elif size == 3 and data[0] == 0xAA and data[1] == 0xA0:
        bare = _BARE.get(data[2])
        if bare is not None:
            return bare
    elif size >= 7 and data[0] == 0xAA and data[1] == 0xA0 and data[2] == 8:  # short READ_OK
        if _U32.unpack_from(data, 3)[0] == size - 7:
            return ReadOk(data[7:])
    return _decode(data)


def _decode(data: memoryview) -> Message | DecodeError:
    if len(data) < 3:
        return DecodeError(f"frame of {len(data)} bytes is shorter than a header")
    if data[0:2] != SIGNATURE:
        return DecodeError(f"bad signature {bytes(data[0:2]).hex()}, expected aaa0")
    msg_id = _MESSAGE_IDS.get(data[2])
    if msg_id is None:
        return DecodeError(f"unknown message id {data[2]}")
    cls, layout = LAYOUT[msg_id]
    pos = 3
    values = []
    for letter, name in zip(layout, _field_names(cls), strict=True):
        if letter == "s":
            if pos + 1 > len(data):
                return DecodeError(f"{msg_id.name}: truncated {name}")
            size = data[pos]
            pos += 1
            if pos + size > len(data):
                return DecodeError(f"{msg_id.name}: {name} overruns the frame")
            raw = bytes(data[pos : pos + size])
            values.append(raw.decode("utf-8", errors="replace") if name in _TEXT_FIELDS else raw)
            pos += size
        elif letter == "4":
            if pos + 4 > len(data):
                return DecodeError(f"{msg_id.name}: truncated {name}")
            values.append(_U32.unpack_from(data, pos)[0])
            pos += 4
        else:
            if pos + 4 > len(data):
                return DecodeError(f"{msg_id.name}: truncated {name} length")
            size = _U32.unpack_from(data, pos)[0]
            pos += 4
            if pos + size > len(data):
                return DecodeError(f"{msg_id.name}: {name} of {size} bytes overruns the frame")
            values.append(data[pos : pos + size])
            pos += size
    if pos != len(data):
        return DecodeError(f"{msg_id.name}: {len(data) - pos} trailing bytes")
    return cls(*values)


def decode_command(frames: Sequence[bytes | memoryview]) -> Command | DecodeError:
    """What a broker accepts from a client: exactly one frame holding a command."""
    if len(frames) != 1:
        return DecodeError(f"{len(frames)} frames; a ZPIPES message is exactly one frame")
    msg = decode(frames[0])
    if type(msg) not in _COMMAND_TYPES and not isinstance(msg, DecodeError):
        return DecodeError(f"{msg.id.name} is a broker reply, not a client command")
    return msg


def decode_reply(frames: Sequence[bytes | memoryview]) -> Reply | DecodeError:
    """What a client accepts from a broker: exactly one frame holding a reply."""
    if len(frames) != 1:
        return DecodeError(f"{len(frames)} frames; a ZPIPES message is exactly one frame")
    msg = decode(frames[0])
    if type(msg) not in _REPLY_TYPES and not isinstance(msg, DecodeError):
        return DecodeError(f"{msg.id.name} is a client command, not a broker reply")
    return msg


def _field_names(cls: type) -> tuple[str, ...]:
    return cls._fields  # type: ignore[attr-defined, no-any-return]
