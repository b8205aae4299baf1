"""ZMTP, ZeroMQ's wire protocol, on the server side of one connection: bytes in, events out.

Every ZMTP endpoint the broker serves (ZPIPES, and each pzq endpoint) speaks ZMTP with this,
on :mod:`zbroker.zmtp.server`, instead of through a libzmq socket. First for safety: libzmq
hands a multipart message over only once all of it has arrived, so a peer could make the broker
hold any number of bytes before it could refuse them. Here each frame is seen as it arrives; a
message past the limits is refused at once and the rest of it is skipped as it comes, never
kept. Then for cost: no I/O thread, no thread switches, large reads.

It speaks ZMTP 3.0 and 3.1 (libzmq 4) and ZMTP 2.0 (libzmq 3.2, the oldest the original pzq
works with), with the NULL mechanism, as a ROUTER (:class:`Connection`: its peers are DEALER,
REQ or ROUTER sockets) or a DEALER (:class:`DealerConnection`). The handshake follows
libzmq's, which keeps older peers talking: the 10-byte signature first, the major version once
the peer's signature is in, the rest once its revision is known (ZMTP 2.0: our socket type and
our empty identity; 3.x: minor version, mechanism, filler).

No I/O: feed :meth:`Connection.receive_data`, then take :meth:`Connection.next_events` and
:meth:`Connection.data_to_send`; :func:`encode_parts` and :func:`encode_message` make the bytes
of a message to send.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from zbroker.runtime.iovec import gather
from zpipes import zmtp_framing as framing
from zpipes.zmtp_framing import (
    COMMAND,
    LONG,
    MORE,
    SIGNATURE,
    command,
    error_reason,
    split_command,
)
from zpipes.zmtp_framing import (
    LARGE_FRAME as LARGE_FRAME,  # (the codec's, as the writers of frames read it)
)

MAJOR = 3
MINOR = 1
V2_REVISION = 1
MECHANISM = b"NULL"
#: socket type numbers of ZMTP 2.0 and names of ZMTP 3
V2_TYPES = {0: b"PAIR", 1: b"PUB", 2: b"SUB", 3: b"REQ", 4: b"REP", 5: b"DEALER", 6: b"ROUTER",
            7: b"PULL", 8: b"PUSH"}
ROUTER = b"ROUTER"
V2_ROUTER = 6
PEERS_OF_ROUTER = frozenset((b"DEALER", b"REQ", b"ROUTER"))
DEALER = b"DEALER"
V2_DEALER = 5
PEERS_OF_DEALER = frozenset((b"DEALER", b"REP", b"ROUTER"))
MAX_COMMAND = 1 << 16  # a READY with metadata is far smaller; a larger command is an attack
MAX_ROUTING_ID = 255

_LONG_SIZE = struct.Struct(">Q")
_PROPERTY_SIZE = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Ready:
    """The handshake is done: the peer's socket type (empty if its READY named none, as
    libzmtp's does) and the routing id it asked for."""

    socket_type: bytes
    routing_id: bytes


# not frozen: one is made for every message, and a frozen dataclass's __init__ costs 3x
@dataclass(slots=True)
class Message:
    frames: list[bytes]
    #: the bytes of its frames (known as they are read: the reader need not add them up)
    size: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Refused:
    """A message past the limits: its first frame (cut to ``keep_first`` bytes) and why. The
    rest of it is skipped as it arrives. ``size``: the length of the frame that passed the
    limits, when it is a frame's size that did (0 otherwise)."""

    first: bytes
    reason: str
    size: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Closed:
    """The peer broke the protocol (or said ERROR): send what is pending, then hang up."""

    reason: str


Event = Ready | Message | Refused | Closed


def ready_command(socket_type: bytes = ROUTER) -> bytes:
    return framing.ready_command(socket_type)


def parse_properties(data: bytes) -> dict[bytes, bytes] | None:
    """The metadata of a READY command (names lowercased), or None if it is malformed."""
    props: dict[bytes, bytes] = {}
    pos, end = 0, len(data)
    while pos < end:
        n = data[pos]
        name = data[pos + 1:pos + 1 + n]
        pos += 1 + n
        if pos + 4 > end:
            return None
        (size,) = _PROPERTY_SIZE.unpack_from(data, pos)
        pos += 4
        if pos + size > end:
            return None
        props[name.lower()] = data[pos:pos + size]
        pos += size
    return props


_HEAD_MORE = [bytes((MORE, n)) for n in range(256)]  # a short frame's header, more follow
_HEAD_LAST = [bytes((0, n)) for n in range(256)]  # ... the last frame's
_LONG_HEAD = struct.Struct(">BQ")


def encode_parts(frames: Sequence[bytes | list[bytes]]) -> tuple[list[bytes], int]:
    """A message in ZMTP 2.0/3.x framing (the same bytes in both) as buffers to write in
    order: the framing and small frames joined, frames of LARGE_FRAME bytes or more as they
    are (no copy). A frame may be given as a list of its parts (one frame of their bytes
    one after the other: large parts are not copied either). Returns them and their size."""
    out: list[bytes] = []
    large = False
    size = 0
    last = len(frames) - 1
    for i, f in enumerate(frames):
        parted = type(f) is list
        n = sum(map(len, cast(list[bytes], f))) if parted else len(f)
        if n < 256:
            out.append(_HEAD_MORE[n] if i < last else _HEAD_LAST[n])
            size += 2 + n
        else:
            out.append(_LONG_HEAD.pack(LONG | (MORE if i < last else 0), n))
            size += 9 + n
            large = large or n >= LARGE_FRAME
        if parted:
            out.extend(cast(list[bytes], f))
        else:
            out.append(cast(bytes, f))
    if not large:
        return [b"".join(out)], size
    return gather(out, LARGE_FRAME)[0], size


def encode_message(frames: Sequence[bytes]) -> bytes:
    """One message in ZMTP 2.0/3.x framing, in one buffer."""
    return b"".join(encode_parts(frames)[0])


class RoutingIds:
    """The ids a ROUTER gives its peers: the one a peer asked for when no other peer has it
    (and it does not start with a zero byte, which marks ids made here), else a new one, as
    libzmq's ROUTER does. ``start``: where the made ones begin (random, so that a restarted
    server does not hand out the ids of before)."""

    def __init__(self, start: int) -> None:
        self._next = start & 0xFFFFFFFF

    def pick(self, asked: bytes, taken: Container[bytes]) -> bytes:
        if asked and asked[0] != 0 and asked not in taken:
            return asked
        while True:
            self._next = (self._next + 1) & 0xFFFFFFFF
            made = b"\0" + self._next.to_bytes(4, "big")
            if made not in taken:
                return made


class Connection:
    """The server side of one ZMTP connection.

    ``max_frames``/``max_bytes``: a message with more frames, or whose frames with
    ``frame_cost`` each come to more bytes, is refused (:class:`Refused`) as soon as it passes
    the limit. ``buffered`` is what the connection holds of unfinished input. Frames are
    ``bytes``, or ``bytearray`` with ``writable`` (for a user that edits a frame in place).

    With ``writable`` and ``direct_min``, a frame of at least ``direct_min`` bytes that has
    begun to arrive gets a buffer of its own: :meth:`frame_buffer` says where the rest of it
    goes, so that the caller can read it there (then :meth:`frame_filled`) instead of
    handing it to :meth:`receive_data`, which copies it there. That buffer is made (and
    counted in :attr:`buffered`) whole as the frame's head arrives, so ``admit``, if set, is
    asked first: given the frame's size, it returns why it cannot be held (the message is
    then refused, and let go as it arrives) or None."""

    def __init__(self, max_frames: int, max_bytes: int, frame_cost: int = 0,
                 keep_first: int = 256, writable: bool = False, direct_min: int = 0):
        #: what a frame is made as: bytes, or bytearray (the user edits frames in place)
        self._frame_type: Callable[[Any], Any] = bytearray if writable else bytes
        self.direct_min = direct_min if writable else 0
        self._direct: bytearray | None = None  # the large frame being received
        self._direct_have = 0  # its bytes here
        self._direct_more = False  # whether more frames of its message follow
        self.admit: Callable[[int], str | None] | None = None
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.frame_cost = frame_cost
        self.keep_first = keep_first
        self.version: int | None = None  # 2 or 3 once the peer's revision is known
        self.ready = False
        self.closed = False
        self._in = bytearray()
        self._out = bytearray(SIGNATURE)
        self._events: list[Event] = []
        self._stage = self._signature  # the handshake step waiting for the peer's bytes
        self._frames: list[Any] = []  # the message being received (bytes or bytearray)
        self._size = 0  # its bytes with frame_cost each
        self._skipping = False  # the rest of a refused message is being let go
        self._skip = 0  # bytes still to let go of the frame being skipped
        self._skip_more = False  # ... and whether more frames of its message follow

    #: our socket type (ZMTP 3 name, ZMTP 2.0 number) and the peers it talks to
    socket_type = ROUTER
    v2_socket_type = V2_ROUTER
    peer_types = PEERS_OF_ROUTER

    @property
    def receiving_large(self) -> bool:
        """A large frame is arriving in its own buffer (its whole size was admitted at its
        head)."""
        return self._direct is not None

    @property
    def buffered(self) -> int:
        """Bytes held of unfinished input: frames of the message being received, and what
        has arrived of the next frame (a large frame's own buffer: all of it)."""
        return len(self._in) + self._size + (len(self._direct) if self._direct is not None
                                             else 0)

    def release(self) -> None:
        """The connection is gone: let go of the unfinished input at once (a connection's
        objects may wait in a reference cycle for the garbage collector, and the buffers of
        thousands of half-sent messages with them)."""
        self._in = bytearray()
        self._direct, self._direct_have = None, 0
        self._frames, self._size = [], 0
        self._events = []
        self.closed = True

    def frame_buffer(self) -> memoryview | None:
        """Where the rest of the large frame being received goes, or None."""
        if self._direct is None:
            return None
        return memoryview(self._direct)[self._direct_have:]

    def frame_filled(self, nbytes: int) -> None:
        """``nbytes`` more of the large frame were written at :meth:`frame_buffer`."""
        self._direct_have += nbytes
        frame = self._direct
        if frame is not None and self._direct_have == len(frame):
            self._finish_direct(frame)

    def _finish_direct(self, frame: bytearray) -> None:
        self._direct, self._direct_have = None, 0
        self._frames.append(frame)
        self._size += len(frame) + self.frame_cost
        if not self._direct_more:
            frames = self._frames
            self._events.append(Message(frames, self._size - self.frame_cost * len(frames)))
            self._frames, self._size = [], 0

    def data_to_send(self) -> bytes:
        if not self._out:  # (almost always, once the handshake is done)
            return b""
        out, self._out = bytes(self._out), bytearray()
        return out

    def next_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def receive_data(self, data: bytes | memoryview) -> None:
        if self.closed:
            return
        if not self.ready:
            self._in += data
            while not self.ready and not self.closed and self._stage():
                pass
            if self.closed:
                self._in.clear()
            if not self.ready:
                return
            if self._in:  # what came after the handshake
                self._read_input()
            return
        while data and not self.closed:
            if self._skip:  # the rest of a frame of a refused message: let go
                n = min(self._skip, len(data))
                self._skip -= n
                data = data[n:]
                if not self._skip and not self._skip_more:
                    self._skipping = False
            elif self._direct is not None:  # a large frame under way: the rest goes there
                frame = self._direct
                n = min(len(frame) - self._direct_have, len(data))
                frame[self._direct_have:self._direct_have + n] = data[:n]
                self.frame_filled(n)
                data = data[n:]
            elif self._in:  # a frame begun before: only what completes it goes after it
                n = max(1, self._wanted())
                self._in += data[:n]
                data = data[n:]
                self._read_input()
            else:  # read where it lies; only a frame cut at its end is kept for later
                used = self._read_frames(data)
                if used < len(data) and not self.closed:
                    self._in += data[used:]
                break

    def _wanted(self) -> int:
        """Bytes still to come of the frame begun in the input (or of its header, when
        that is not all here)."""
        head = self._frame_head(0)
        if head is None:
            return (9 if self._in[0] & LONG else 2) - len(self._in)
        return head[2] + head[1] - len(self._in)

    def _read_input(self) -> None:
        with memoryview(self._in) as mv:
            used = self._read_frames(mv)
        if self.closed:
            self._in.clear()
        else:
            del self._in[:used]

    def refuse_current(self, reason: str) -> bool:
        """Refuse the message being received: what has come of it is let go at once and the
        rest as it arrives. False if no message is under way. When the frame under way is
        the message's first, the Refused event has its length (``size``)."""
        if not self.ready or self.closed or self._skipping:
            return False
        if self._direct is not None:  # the large frame under way is let go
            size = 0 if self._frames else len(self._direct)
            first = self._frames[0] if self._frames else bytes(self._direct[:self.keep_first])
            self._skip = len(self._direct) - self._direct_have
            self._skip_more = self._direct_more
            self._direct, self._direct_have = None, 0
            self._refuse(first[:self.keep_first], reason, size)
            return True
        head = self._frame_head(0)
        if head is not None and head[0] & COMMAND and self.version == 3:
            head = None  # a command is no part of a message
        if not self._frames and head is None:
            return False
        first = self._frames[0] if self._frames else b""
        size = 0
        if head is not None:
            flags, n, at = head
            have = len(self._in) - at
            if not self._frames:
                first, size = bytes(self._in[at:at + min(n, self.keep_first)]), n
            if have < n:  # the frame under way is let go too
                self._skip, self._skip_more = n - have, bool(flags & MORE)
                self._in.clear()
        self._refuse(first[:self.keep_first], reason, size)
        if not self._skip:
            self._read_input()  # whole frames of this message that are here already
        return True

    # --- the handshake: each step returns True once done -----------------------------------

    def _signature(self) -> bool:
        buf = self._in
        if buf and buf[0] != 0xFF or len(buf) >= 10 and not buf[9] & 0x01:
            self._close("not a ZMTP 2.0 or 3.x peer (libzmq 3.2 or newer is needed)")
            return False
        if len(buf) < 10:
            return False
        self._out.append(MAJOR)
        self._stage = self._revision
        return True

    def _revision(self) -> bool:
        buf = self._in
        if len(buf) < 11:
            return False
        revision = buf[10]
        if revision == V2_REVISION:
            self.version = 2
            # ZMTP 2.0's greeting ends with each side's identity: a message that libzmq 3.2
            # and 4 send first and take the first message of their peer for (a DEALER drops
            # it); ours is empty, as a bound socket's is
            self._out += bytes([self.v2_socket_type, 0, 0])
            self._stage = self._v2_socket_type
        elif revision >= 3:
            self.version = 3
            self._out += bytes([MINOR]) + MECHANISM.ljust(20, b"\x00") + b"\x00" * 32
            self._stage = self._v3_greeting
        else:
            self._close(f"ZMTP revision {revision} is not supported")
            return False
        return True

    def _v2_socket_type(self) -> bool:
        buf = self._in
        if len(buf) < 12:
            return False
        self._peer_type = V2_TYPES.get(buf[11], b"")
        if self._peer_type not in self.peer_types:
            self._close(f"a {_name(self._peer_type, buf[11])} socket cannot talk to a "
                        f"{self.socket_type.decode()}")
            return False
        del buf[:12]
        self._stage = self._v2_identity
        return True

    def _v2_identity(self) -> bool:
        head = self._frame_head(0)
        if head is None:
            return False
        flags, n, size = head
        if flags & (MORE | COMMAND) or n > MAX_ROUTING_ID:
            self._close("malformed ZMTP 2.0 identity")
            return False
        if len(self._in) < size + n:
            return False
        identity = bytes(self._in[size:size + n])
        del self._in[:size + n]
        self._become_ready(self._peer_type, identity)
        return True

    def _v3_greeting(self) -> bool:
        buf = self._in
        if len(buf) < 64:
            return False
        mechanism = bytes(buf[12:32]).rstrip(b"\x00")
        if mechanism != MECHANISM:
            self._close(f"security mechanism {mechanism.decode(errors='replace')!r} is not "
                        f"offered here (NULL only)")
            return False
        del buf[:64]
        self._out += ready_command(self.socket_type)
        self._stage = self._v3_ready
        return True

    def _v3_ready(self) -> bool:
        head = self._frame_head(0)
        if head is None:
            return False
        flags, n, size = head
        if not flags & COMMAND:
            self._close("a message before the handshake was done")
            return False
        if n > MAX_COMMAND:
            self._close(f"a command of {n} bytes")
            return False
        if len(self._in) < size + n:
            return False
        name, data = split_command(bytes(self._in[size:size + n]))
        del self._in[:size + n]
        if name == b"ERROR":
            self._close(f"the peer said ERROR: {error_reason(data)}")
            return False
        if name != b"READY":
            self._close(f"{name.decode(errors='replace')!r} before READY")
            return False
        props = parse_properties(data)
        if props is None:
            self._close("malformed READY metadata")
            return False
        # libzmq checks the peer's socket type only when the READY names one: libzmtp (the
        # original C clients' library) sends a READY with no properties at all
        peer = props.get(b"socket-type")
        if peer is not None and peer not in self.peer_types:
            self._out += command(b"ERROR", _error_body("Invalid socket type"))
            self._close(f"a {_name(peer, None)} socket cannot talk to a "
                        f"{self.socket_type.decode()}")
            return False
        self._become_ready(peer or b"", props.get(b"identity", b""))
        return True

    def _become_ready(self, socket_type: bytes, routing_id: bytes) -> None:
        self.ready = True
        self._events.append(Ready(socket_type, routing_id))

    # --- frames ---------------------------------------------------------------------------

    def _frame_head(self, pos: int) -> tuple[int, int, int] | None:
        """(flags, body size, header size) of the frame at ``pos`` of the input, if its
        header is all there."""
        buf = self._in
        if len(buf) - pos < 2:
            return None
        flags = buf[pos]
        if flags & LONG:
            if len(buf) - pos < 9:
                return None
            return flags, _LONG_SIZE.unpack_from(buf, pos + 1)[0], 9
        return flags, buf[pos + 1], 2

    def _read_frames(self, buf: bytes | memoryview) -> int:
        """Take the frames that are whole in ``buf``; returns how many bytes of it were
        used. (The message under way is kept in locals while frames come; they are written
        back before anything that changes it.)"""
        pos, end = 0, len(buf)
        v3 = self.version == 3
        frames, size = self._frames, self._size
        cost, frame_type, events = self.frame_cost, self._frame_type, self._events
        max_frames, max_bytes = self.max_frames, self.max_bytes
        while not self.closed:
            if end - pos < 2:
                break
            flags = buf[pos]
            if flags < LONG:  # a short data frame (MORE or not): most are
                n, head = buf[pos + 1], pos + 2
                if (end - head >= n and len(frames) < max_frames
                        and size + n + cost <= max_bytes and not self._skipping):
                    frames.append(frame_type(buf[head:head + n]))  # whole and allowed
                    size += n + cost
                    pos = head + n
                    if not flags:
                        events.append(Message(frames, size - cost * len(frames)))
                        frames, size = [], 0
                    continue
            elif flags & LONG:
                if end - pos < 9:
                    break
                (n,) = _LONG_SIZE.unpack_from(buf, pos + 1)
                head = pos + 9
            else:
                n, head = buf[pos + 1], pos + 2
            if v3 and flags & COMMAND:
                if n > MAX_COMMAND:
                    self._close(f"a command of {n} bytes")
                    frames, size = self._frames, self._size
                    break
                if end - head < n:
                    break
                self._command(bytes(buf[head:head + n]))
                frames, size = self._frames, self._size
                pos = head + n
                continue
            problem = None  # why the message of this frame is refused, if it is
            if not self._skipping:
                if len(frames) >= self.max_frames:
                    problem, refused = f"more than {self.max_frames} frames in a message", 0
                elif size + n + cost > self.max_bytes:
                    problem, refused = (f"Message too large: more than {self.max_bytes} "
                                        f"bytes with its id and headers"), n
                elif (self.admit is not None and self.direct_min and n >= self.direct_min
                      and end - head < n):
                    problem, refused = self.admit(n), n  # before its buffer is made
            if problem is not None:
                first = (frames[0] if frames
                         else bytes(buf[head:min(end, head + self.keep_first, head + n)]))
                self._refuse(first[:self.keep_first], problem, refused)
                frames, size = self._frames, self._size
            if self._skipping:  # let the frame go, as much of it as is here
                have = min(n, end - head)
                pos = head + have
                if have < n:
                    self._skip, self._skip_more = n - have, bool(flags & MORE)
                    break
                if not flags & MORE:
                    self._skipping = False
                continue
            if end - head < n:
                if self.direct_min and n >= self.direct_min:  # the rest goes to its own
                    self._direct = frame = bytearray(n)
                    self._direct_have = end - head
                    self._direct_more = bool(flags & MORE)
                    frame[:end - head] = buf[head:end]
                    pos = end
                break
            frames.append(frame_type(buf[head:head + n]))
            size += n + cost
            pos = head + n
            if not flags & MORE:
                events.append(Message(frames, size - cost * len(frames)))
                frames, size = [], 0
        self._frames, self._size = frames, size
        return pos

    def _refuse(self, first: bytes, reason: str, size: int = 0) -> None:
        self._events.append(Refused(first, reason, size))
        self._frames, self._size = [], 0
        self._skipping = True

    def _command(self, body: bytes) -> None:
        name, data = split_command(body)
        if name == b"PING":  # ZMTP 3.1 heartbeat: [TTL, 2 bytes][context]
            self._out += command(b"PONG", data[2:18])
        elif name == b"ERROR":
            self._close(f"the peer said ERROR: {error_reason(data)}")
        # PONG, SUBSCRIBE, CANCEL and commands of later versions: nothing to do for a ROUTER

    def _close(self, reason: str) -> None:
        self.closed = True
        self._frames, self._size = [], 0
        self._direct, self._direct_have = None, 0
        self._events.append(Closed(reason))


class DealerConnection(Connection):
    """The server side of a connection to a bound DEALER: its peers are DEALER, ROUTER or
    REP sockets; messages go to them without a routing id."""

    socket_type = DEALER
    v2_socket_type = V2_DEALER
    peer_types = PEERS_OF_DEALER


def _error_body(reason: str) -> bytes:
    data = reason.encode()[:255]
    return bytes([len(data)]) + data


def _name(peer: bytes | None, number: int | None) -> str:
    if peer:
        return peer.decode(errors="replace")
    return f"type {number}" if number is not None else "unnamed"
