"""The pzq wire format: frames in, values out, frames back. No I/O.

Compatible with the original pzq (2014), as its clients see it::

    producer -> pzq   [msg id][0..N header frames][""][1..N body frames]
    pzq -> producer   [msg id]["1"][""]                 stored
                      [msg id]["1"][""][REPLICATION_FAILED]
                      [msg id]["0"][""][reason]         refused
    pzq -> consumer   [key][sent µs][ack timeout µs][""][body frames...]
    consumer -> pzq   [key]["1"]                        done: remove it
                      [key]["0"]                        failed: deliver it again now
    monitor           [...][""]["MONITOR"]  ->  [...][""]["name: value\\n" ...]

A stream queue (``mode: stream``) also answers requests on its stream endpoint (a ROUTER;
offsets are ASCII decimal, [a, b) ranges)::

    [envelope...][""]["HEAD"]                  -> [envelope...][""]["OK"][head][committed]
    [envelope...][""]["RANGE"][start][end]([max bytes]([max messages]))
        -> [envelope...][""]["OK"][head][committed][next][count]
           then count x [offset][key][sent µs][frame count][frames...]
    [envelope...][""]["COMMIT"][end]           -> [envelope...][""]["OK"][head][committed]
    anything else / bad arguments              -> [envelope...][""]["ERROR"][reason]

Each reader group has its own committed offset: a request naming a group starts with
``["GROUP"][name]`` and its answer has two more numbers after the ones above, the offsets
its group lost to the queue's retention limits since its last COMMIT (``[from][to]``, ``0
0``: none); a request without a group is the ``default`` group's, answered as above::

    [envelope...][""]["GROUP"][name]["HEAD" | "COMMIT" ...]
        -> ["OK"][head][committed][lost from][lost to]
    [envelope...][""]["GROUP"][name]["RANGE" ...]
        -> ["OK"][head][committed][next][count][lost from][lost to], then the entries
    [envelope...][""]["GROUP"][name]["DELETE"]  -> ["OK"]
    [envelope...][""]["GROUPS"]  -> ["OK"][head][count] then count x [name][committed]

The routing-id frames a ROUTER adds or strips are not part of these lists. Decoding never
raises: malformed input gives a :class:`WireError` value with the reason the original sent.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple, cast

from zpipes.zmtp_framing import LARGE_FRAME

OK = b"1"
FAILED = b"0"
MONITOR = b"MONITOR"
REPLICA_HEADER = b"REPLICA:"

MALFORMED = "Malformed message, no delimiter found or missing message parts"
EMPTY = "Trying to save empty message"
REPLICATION_FAILED = "REPLICATION_FAILED"

MAX_ID = 255  # bytes of a producer's message id; a longer one is refused
ID_TOO_LONG = f"message id longer than {MAX_ID} bytes"
#: what each frame a queue holds costs on top of its bytes, in the backlog and message size
#: limits (the bookkeeping of a frame in memory and on disk is about that much)
FRAME_COST = 16


def too_many_frames(limit: int) -> str:
    return f"more than {limit} frames in a message"


def too_large(size: int, limit: int, more: bool = False) -> str:
    return f"Message too large: {'more than ' if more else ''}{size} bytes, limit {limit}"


def cost(msg_id: bytes, body: Sequence[Frame]) -> int:
    """What a stored message counts for in the limits: its id and body bytes, and
    FRAME_COST for each of those frames (so empty frames and ids count too)."""
    return len(msg_id) + sum(map(len, body)) + FRAME_COST * (len(body) + 1)

Frame = bytes | bytearray | memoryview


# not frozen: one is made for every message, and a frozen dataclass's __init__ costs 3x
@dataclass(slots=True)
class Produce:
    """A message from a producer."""

    msg_id: bytes
    headers: tuple[bytes, ...]
    body: tuple[bytes, ...]

    @property
    def size(self) -> int:
        return sum(map(len, self.body))

    @property
    def is_replica(self) -> bool:
        return any(h.startswith(REPLICA_HEADER) for h in self.headers)


# not frozen: one is made for every message, and a frozen dataclass's __init__ costs 3x
@dataclass(slots=True)
class ConsumerAck:
    key: bytes
    ok: bool


@dataclass(frozen=True, slots=True)
class WireError:
    """Malformed input. ``msg_id`` is the id to answer to, if the input had one."""

    reason: str
    msg_id: bytes | None = None


def decode_produce(frames: Sequence[Frame]) -> Produce | WireError:
    """``[msg id][headers...][""][body...]`` (without the routing id)."""
    if len(frames) == 3 and not frames[1]:  # [id][""][body]: most messages
        first, last = frames[0], frames[2]
        if type(first) is bytes and type(last) is bytes:
            return Produce(first, (), (last,))
    if not frames:
        return WireError(MALFORMED)
    msg_id = bytes(frames[0])
    delimiter: int | None
    if len(frames) > 1 and not frames[1]:  # no headers (most messages)
        delimiter = 1
    else:
        delimiter = next((i for i in range(1, len(frames)) if len(frames[i]) == 0), None)
        if delimiter is None:
            return WireError(MALFORMED, msg_id)
    rest = frames[delimiter + 1:]
    if not rest:
        return WireError(EMPTY, msg_id)
    body: tuple[bytes, ...]
    if memoryview in map(type, rest):  # (kept as they are: not copied)
        # typed as bytes: a memoryview serves as one wherever a body goes (its length, the
        # log's writes, the ZMTP encoder take any buffer)
        body = cast("tuple[bytes, ...]",
                    tuple(f if type(f) is memoryview else bytes(f) for f in rest))
    else:
        body = tuple(map(bytes, rest))
    return Produce(msg_id, tuple(map(bytes, frames[1:delimiter])), body)


def producer_ack(msg_id: bytes, ok: bool = True, text: str | None = None) -> list[bytes]:
    """``[msg id]["1"|"0"][""]`` and the text, if any."""
    frames = [msg_id, OK if ok else FAILED, b""]
    if text:
        frames.append(text.encode())
    return frames


def delivery(key: bytes, sent_us: int, ack_timeout_us: int,
             body: Iterable[bytes]) -> list[bytes]:
    """``[key][sent][ack timeout][""][body...]``."""
    return [key, b"%d" % sent_us, b"%d" % ack_timeout_us, b"", *body]


READY = b"READY"
ACKED = b"ACKED"  # credit endpoint, [key][ACKED]: that ACK survives a crash of the queue
UNKNOWN = b"UNKNOWN"  # credit endpoint, [key][UNKNOWN]: an ACK for a key not in the queue
MAX_WINDOW = 100_000


def decode_ready(frames: Sequence[Frame]) -> int | WireError | None:
    """``["READY"][window]`` on the credit endpoint: the window (0..MAX_WINDOW; 0: nothing
    more, a consumer about to leave); None if the frames are not a READY (an ACK then); a
    WireError if it is a READY that is malformed."""
    if not frames or bytes(frames[0]) != READY:
        return None
    if len(frames) != 2:
        return WireError(MALFORMED)
    text = bytes(frames[1])
    if not text.isdigit() or len(text) > 6 or not 0 <= int(text) <= MAX_WINDOW:
        return WireError(f"window must be 0..{MAX_WINDOW}")
    return int(text)


def decode_consumer_ack(frames: Sequence[Frame]) -> ConsumerAck | WireError:
    """``[key]["1"|"0"]``. Frames after the status are ignored (room for future fields)."""
    if len(frames) < 2:
        return WireError("Malformed ACK, expected key and status",
                         bytes(frames[0]) if frames else None)
    status = bytes(frames[1])
    if status not in (OK, FAILED):
        return WireError(f"Malformed ACK, status must be 1 or 0, got {status[:16]!r}",
                         bytes(frames[0]))
    return ConsumerAck(bytes(frames[0]), status == OK)


def split_monitor_request(frames: Sequence[Frame]) -> list[bytes] | None:
    """The envelope to answer with (the frames before the request, plus the empty
    delimiter) if ``frames`` (after the routing id) is a MONITOR request, else None."""
    if not frames or bytes(frames[-1]) != MONITOR:
        return None
    envelope = [bytes(f) for f in frames[:-1]]
    if not envelope or envelope[-1] != b"":
        envelope.append(b"")
    return envelope


def monitor_text(counters: Mapping[str, int | float]) -> bytes:
    """One ``name: value`` line per counter."""
    return "".join(f"{name}: {value}\n" for name, value in counters.items()).encode()


def parse_monitor_text(text: bytes | str) -> dict[str, int]:
    """The counters of a monitor reply (for clients and tests)."""
    if isinstance(text, bytes):
        text = text.decode()
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            try:
                out[name.strip()] = int(value.strip())
            except ValueError:
                continue
    return out


# --- stream requests ---------------------------------------------------------------------

HEAD = b"HEAD"
RANGE = b"RANGE"
COMMIT = b"COMMIT"
GROUP = b"GROUP"  # the prefix of a request of a named reader group
GROUPS = b"GROUPS"
DELETE = b"DELETE"
DEFAULT_GROUP = "default"
MAX_GROUP = 255  # bytes of a group's name
GROUP_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
STREAM_OK = b"OK"
STREAM_ERROR = b"ERROR"
RANGE_MAX_BYTES = 1 << 20  # defaults of a RANGE without its limits
RANGE_MAX_MESSAGES = 10_000
RANGE_BYTES_CAP = 8 << 20  # what the queue serves at most in one RANGE answer (a reader
# that asks and never reads holds at most this and a write buffer of the broker)
RANGE_MESSAGES_CAP = 100_000
MAX_OFFSET = (1 << 63) - 1
_MAX_ENVELOPE = 16  # frames before the empty delimiter


@dataclass(frozen=True, slots=True)
class StreamRequest:
    command: bytes  # HEAD, RANGE, COMMIT, DELETE or GROUPS
    start: int = 0
    end: int = 0  # RANGE: the end of the range; COMMIT: the offset committed up to
    max_bytes: int = RANGE_MAX_BYTES
    max_messages: int = RANGE_MAX_MESSAGES
    group: str | None = None  # None: the default group, answered without the lost offsets
    batch: bool = False  # RANGE ... BATCH: the messages packed (range_batch)


def group_name_error(name: bytes) -> str | None:
    """Why ``name`` cannot be a group's name (1-255 of a-z A-Z 0-9 . _ -), or None."""
    if not name:
        return "a group's name must not be empty"
    if len(name) > MAX_GROUP:
        return f"a group's name is at most {MAX_GROUP} bytes, got {len(name)}"
    if not GROUP_CHARS.issuperset(name):
        return f"a group's name is made of a-z A-Z 0-9 . _ -, got {name[:40]!r}"
    return None


def split_stream_request(frames: Sequence[Frame]) -> tuple[list[bytes], list[bytes]]:
    """(envelope, request): the envelope is every frame up to and including the first empty
    one (a REQ socket's delimiter, or a DEALER's request id and delimiter), echoed in the
    reply. Without an empty frame (within 16 frames) the envelope is ``[""]``."""
    for i in range(min(len(frames), _MAX_ENVELOPE + 1)):
        if len(frames[i]) == 0:
            return [bytes(f) for f in frames[:i + 1]], [bytes(f) for f in frames[i + 1:]]
    return [b""], [bytes(f) for f in frames]


def _offset(frame: bytes, what: str) -> int | str:
    if not frame or len(frame) > 19 or not frame.isdigit():
        return f"{what} must be a decimal integer from 0 to {MAX_OFFSET}, got {frame[:24]!r}"
    n = int(frame)
    return n if n <= MAX_OFFSET else f"{what} must be at most {MAX_OFFSET}"


def decode_stream_request(request: Sequence[bytes]) -> StreamRequest | WireError:
    """The request frames after the envelope. Never raises."""
    if request and bytes(request[0]) == GROUP:
        if len(request) < 3:
            return WireError("GROUP takes a name and a request: [GROUP][name][HEAD|RANGE|"
                             "COMMIT|DELETE ...]")
        why = group_name_error(bytes(request[1]))
        if why is not None:
            return WireError(why)
        group = bytes(request[1]).decode()
        if bytes(request[2]) == DELETE:
            return (StreamRequest(DELETE, group=group) if len(request) == 3
                    else WireError("DELETE takes no argument"))
        r = decode_stream_request(request[2:])
        if isinstance(r, WireError):
            return r
        if r.group is not None or r.command == GROUPS:
            return WireError("GROUP is followed by HEAD, RANGE, COMMIT or DELETE")
        return StreamRequest(r.command, r.start, r.end, r.max_bytes, r.max_messages, group,
                             r.batch)
    if not request:
        return WireError("Empty request: expected HEAD, RANGE or COMMIT")
    command, args = bytes(request[0]), [bytes(f) for f in request[1:]]
    if command == GROUPS:
        return WireError("GROUPS takes no argument") if args else StreamRequest(GROUPS)
    if command == HEAD:
        return WireError("HEAD takes no argument") if args else StreamRequest(HEAD)
    if command == COMMIT:
        if len(args) != 1:
            return WireError("COMMIT takes one argument: [end]")
        end = _offset(args[0], "COMMIT end")
        return WireError(end) if isinstance(end, str) else StreamRequest(COMMIT, end=end)
    if command == RANGE:
        batch = bool(args) and args[-1] == BATCH
        if batch:
            del args[-1]
        if not 2 <= len(args) <= 4:
            return WireError("RANGE takes [start][end], then optionally [max bytes] and "
                             "[max messages], then optionally [BATCH]")
        names = ("RANGE start", "RANGE end", "RANGE max bytes", "RANGE max messages")
        values = []
        for frame, name in zip(args, names, strict=False):
            n = _offset(frame, name)
            if isinstance(n, str):
                return WireError(n)
            values.append(n)
        start, end = values[0], values[1]
        if start > end:
            return WireError(f"RANGE start {start} is past its end {end}")
        max_bytes = values[2] if len(values) > 2 else RANGE_MAX_BYTES
        max_messages = values[3] if len(values) > 3 else RANGE_MAX_MESSAGES
        if max_bytes < 1 or max_messages < 1:
            return WireError("RANGE max bytes and max messages must be at least 1")
        return StreamRequest(RANGE, start, end, min(max_bytes, RANGE_BYTES_CAP),
                             min(max_messages, RANGE_MESSAGES_CAP), batch=batch)
    shown = command[:32].decode("ascii", errors="replace")
    return WireError(f"Unknown command {shown!r}: expected HEAD, RANGE or COMMIT")


def stream_ok(envelope: list[bytes], *values: int) -> list[bytes]:
    return [*envelope, STREAM_OK, *(b"%d" % v for v in values)]


def stream_error(envelope: list[bytes], reason: str) -> list[bytes]:
    return [*envelope, STREAM_ERROR, reason.encode()]


def range_entry(offset: int, key: bytes, frames: Sequence[bytes]) -> list[bytes]:
    """One message of a RANGE answer: ``[offset][key][sent µs][frame count][frames...]``."""
    return [b"%d" % offset, key, key_time(key), b"%d" % len(frames), *frames]


KEY_SEQ_MASK = 0xFFFFFFFFFFFF  # the key shows the low 48 bits of a message's seq
_KEY = b"%s%012x"  # a key: its key base, then the low bits of its seq in hex


def key_base(now_us: int, prefix: bytes) -> bytes:
    """What the keys of the messages a queue received at ``now_us`` start with: the time,
    "|", and the first 24 characters of a uuid (the queue's, made at its start)."""
    return b"%d|%s" % (now_us, prefix)


def message_key(base: bytes, seq: int) -> bytes:
    """A message's key: its key base and its seq as the uuid's last 12 hex digits."""
    return _KEY % (base, seq & KEY_SEQ_MASK)


#: what separates the first key a message had from the one a queue that took it over gave it
ADOPTED = b"~"


def root_key(key: bytes) -> bytes:
    """The first key the message of ``key`` had (at the queue its producer sent it to)."""
    return key.partition(ADOPTED)[0]


def adopted_key(copy_key: bytes, new_key: bytes) -> bytes:
    """The key a queue gives a copy it takes over (``copy_key``: its key at its origin):
    the message's first key, then the queue's own. One level, however often it is taken
    over, so that any queue knows the message again."""
    return root_key(copy_key) + ADOPTED + new_key


def message_keys(base: bytes, first: int, n: int) -> list[bytes]:
    """The keys of ``n`` messages with the seqs from ``first`` on (:func:`message_key`)."""
    return [_KEY % (base, seq & KEY_SEQ_MASK) for seq in range(first, first + n)]


def key_time(key: bytes) -> bytes:
    """The µs since the epoch at which the queue received the message (the key's prefix)."""
    return key.partition(b"|")[0]


class RangeEntry(NamedTuple):
    """One message of a RANGE answer (a named tuple: one is made for each)."""

    offset: int
    key: bytes
    sent_us: int
    frames: tuple[bytes, ...]


def decode_stream_reply(reply: Sequence[bytes], grouped: bool = False
                        ) -> tuple[list[int], list[RangeEntry]]:
    """(the integers after "OK", the messages of a RANGE answer) from a reply without its
    envelope (``grouped``: the answer to a request naming a group, with the lost offsets).
    Raises ValueError for an ERROR reply (its reason) or a malformed one."""
    if not reply:
        raise ValueError("empty reply")
    status = bytes(reply[0])
    if status == STREAM_ERROR:
        raise ValueError(bytes(reply[1]).decode(errors="replace") if len(reply) > 1
                         else "error")
    if status != STREAM_OK or len(reply) < 3:
        raise ValueError(f"malformed reply: {[bytes(f)[:32] for f in reply[:4]]!r}")
    short = 5 if grouped else 3
    if len(reply) == short:
        return [int(f) for f in reply[1:short]], []
    fixed = 7 if grouped else 5
    values = [int(f) for f in reply[1:fixed]]
    count = values[3]
    if len(reply) > fixed and bytes(reply[fixed]) == BATCH:
        return values, _range_batch_entries(reply[fixed + 1:], count)
    entries = []
    pos = fixed
    for _ in range(count):
        offset, key, sent, count_frame = reply[pos:pos + 4]
        n = int(count_frame)
        frames = tuple(bytes(f) for f in reply[pos + 4:pos + 4 + n])
        if len(frames) != n:
            raise ValueError("malformed RANGE reply: cut short")
        sent_us = int(sent) if bytes(sent).isdigit() else 0
        entries.append(RangeEntry(int(offset), bytes(key), sent_us, frames))
        pos += 4 + n
    if pos != len(reply):
        raise ValueError("malformed RANGE reply: trailing frames")
    return values, entries


def _range_batch_entries(frames: Sequence[bytes], count: int) -> list[RangeEntry]:
    """The messages of a RANGE ... BATCH answer: [offsets][packed keys and bodies]."""
    if len(frames) != 2 or len(frames[0]) != 8 * count:
        raise ValueError("malformed RANGE BATCH reply: expected [offsets][messages]")
    got = unpack(frames[1])
    if isinstance(got, str):
        raise ValueError(f"malformed RANGE BATCH reply: {got}")
    if len(got[0]) != count:
        raise ValueError("malformed RANGE BATCH reply: its messages are not its count")
    offsets = struct.unpack(f"<{count}Q", frames[0])
    keys, bodies = got
    # (tuple.__new__ makes each entry without a Python call)
    return list(map(tuple.__new__, repeat(RangeEntry),
                    zip(offsets, keys, map(sent_us_of, keys), zip(bodies), strict=True)))


def sent_us_of(key: bytes) -> int:
    """The µs since the epoch at which the queue received the message of ``key`` (its
    prefix, see :func:`key_time`); 0 if the key has none."""
    when = key_time(key)
    return int(when) if when.isdigit() else 0


def decode_groups_reply(reply: Sequence[bytes]) -> tuple[int, dict[str, int]]:
    """(head, {group: committed offset}) of a GROUPS answer (without its envelope)."""
    head, count = int(reply[1]), int(reply[2])
    names, offsets = reply[3::2], reply[4::2]
    if len(names) != count or len(offsets) != count:
        raise ValueError("malformed GROUPS reply")
    return head, {bytes(n).decode(): int(o) for n, o in zip(names, offsets, strict=True)}


# --- batches -------------------------------------------------------------------------------
#
# Our own clients may move many messages in one ZeroMQ message (a frame kind no original
# client sends; the original wire above is unchanged). Messages of a batch are packed in one
# frame, the same way in every direction and in the log:
#
#     count u32 LE, count x name length u8, count x body length u32 LE, names, bodies
#
# (a name is a producer's message id, or a key; ACKs pack keys alone: no body lengths).
#
#     producer -> pzq   [batch id]["BATCH:1"][""][packed ids and bodies]
#     pzq -> producer   [batch id]["1"][""]  every message of it stored (or stored before:
#                       ids are idempotent as one by one), ([REPLICATION_FAILED] if fewer
#                       copies than replicas); [batch id]["0"][""][reason]: none of it stored
#     consumer -> pzq   ["READY"][window messages][window bytes]   (credit endpoint): batches
#     pzq -> consumer   ["BATCH"][sent µs][ack timeout µs][packed keys and bodies]
#                       (a message of several body frames comes alone, as on the original wire)
#     consumer -> pzq   ["ACK"][ack id][packed keys]  done with these: one message for many
#     pzq -> consumer   [ack id]["ACKED"]  once none of them can come back after a crash

BATCH_HEADER = b"BATCH:1"
BATCH = b"BATCH"
ACK = b"ACK"
MAX_BATCH = 65_536  # messages in one batch
MAX_ACK_ID = 255
_COUNT = struct.Struct("<I")


def pack(names: Sequence[bytes], bodies: Sequence[bytes] | None = None) -> bytes:
    """Names (at most 255 bytes each) and bodies, packed in one frame (bodies None: names
    alone, as an ACK packs its keys)."""
    return b"".join(packed_parts(names, bodies))


def packed_parts(names: Sequence[bytes], bodies: Sequence[bytes] | None = None
                 ) -> list[bytes]:
    """:func:`pack`'s frame as the parts that make it, in order, nothing joined."""
    n = len(names)
    parts = [_COUNT.pack(n), bytes(map(len, names))]
    if bodies is not None:
        parts.append(struct.pack(f"<{n}I", *map(len, bodies)))
    parts.extend(names)
    if bodies is not None:
        parts.extend(bodies)
    return parts


def unpack(frame: Frame, with_bodies: bool = True, max_count: int = MAX_BATCH
           ) -> tuple[list[bytes], list[bytes]] | str:
    """(names, bodies) of a packed frame (bodies empty when ``with_bodies`` is False), or
    the reason it is malformed. Never raises. A memoryview is not copied whole: each name
    and body is copied out of it."""
    view = type(frame) is memoryview
    data = frame if view else bytes(frame)
    size = len(data)
    if size < 4:
        return "malformed batch: shorter than its count"
    (n,) = _COUNT.unpack_from(data, 0)
    if n == 0:
        return "empty batch"
    if n > max_count:
        return f"more than {max_count} messages in a batch ({n})"
    names_at = 4 + n * (5 if with_bodies else 1)
    if size < names_at:
        return "malformed batch: cut short in its lengths"
    name_lens = data[4:4 + n]
    body_lens = struct.unpack_from(f"<{n}I", data, 4 + n) if with_bodies else ()
    if names_at + sum(name_lens) + sum(body_lens) != size:
        return "malformed batch: its lengths do not add up to its size"
    names: list[Frame] = []
    pos = names_at
    for k in name_lens:
        names.append(data[pos:pos + k])
        pos += k
    bodies: list[Frame] = []
    for k in body_lens:
        bodies.append(data[pos:pos + k])
        pos += k
    if view:
        return list(map(bytes, names)), list(map(bytes, bodies))
    # not a view: data is bytes, and so are its slices
    return cast("list[bytes]", names), cast("list[bytes]", bodies)


# not frozen: one is made for every message, and a frozen dataclass's __init__ costs 3x
@dataclass(slots=True)
class ProduceBatch:
    """A batch from a producer: its id (for the answer) and its messages."""

    batch_id: bytes
    ids: list[bytes]
    bodies: list[bytes]
    packed: bytes  # the frame as it came: written to the log as it is


def decode_produce_batch(frames: Sequence[Frame]) -> ProduceBatch | WireError:
    """``[batch id]["BATCH:1"][""][packed]`` (without the routing id). Never raises."""
    batch_id = bytes(frames[0][:MAX_ID]) if frames else None
    if len(frames) != 4 or len(frames[2]) != 0:
        return WireError("malformed batch: expected [batch id][BATCH:1][][messages]",
                         batch_id)
    packed = bytes(frames[3])
    got = unpack(packed)
    if isinstance(got, str):
        return WireError(got, batch_id)
    ids, bodies = got
    return ProduceBatch(bytes(frames[0]), ids, bodies, packed)


def decode_ready_batch(frames: Sequence[Frame]) -> tuple[int, int] | WireError | None:
    """``["READY"][window][window bytes]``: (window, bytes) of a batch consumer; None if the
    frames are not that."""
    if len(frames) != 3 or bytes(frames[0]) != READY:
        return None
    window = decode_ready(frames[:2])
    if not isinstance(window, int):  # a WireError (not None: frames[0] is READY)
        return window
    text = bytes(frames[2])
    if not text.isdigit() or len(text) > 10 or int(text) < 1:
        return WireError("window bytes must be a decimal number >= 1")
    return window, int(text)


def decode_ack_batch(frames: Sequence[Frame]) -> tuple[bytes, list[bytes]] | WireError | None:
    """``["ACK"][ack id][packed keys]``: (ack id, keys); None if the frames are not that."""
    if not frames or bytes(frames[0]) != ACK:
        return None
    if len(frames) != 3 or len(frames[1]) > MAX_ACK_ID:
        return WireError("malformed ACK batch: expected [ACK][ack id][keys]")
    got = unpack(frames[2], with_bodies=False)
    if isinstance(got, str):
        return WireError(got)
    return bytes(frames[1]), got[0]


def batch_delivery(sent_us: int, ack_timeout_us: int, keys: Sequence[bytes],
                   bodies: Sequence[bytes]) -> list[bytes | list[bytes]]:
    """A batch's frames."""
    return [BATCH, b"%d" % sent_us, b"%d" % ack_timeout_us, _packed(keys, bodies)]


def range_batch(offsets: Sequence[int], keys: Sequence[bytes], bodies: Sequence[bytes]
                ) -> list[bytes | list[bytes]]:
    """The messages of a RANGE ... BATCH answer (after its numbers): ``["BATCH"][offsets,
    u64 LE each][packed keys and bodies]``; the time each was received is its key's prefix."""
    return [BATCH, struct.pack(f"<{len(offsets)}Q", *offsets), _packed(keys, bodies)]


def _packed(keys: Sequence[bytes], bodies: Sequence[bytes]) -> bytes | list[bytes]:
    """Keys and bodies packed in one frame. With a body that the writer sends as it is
    (zmtp.LARGE_FRAME bytes or more) the frame is given as its parts (a list:
    zmtp.encode_parts writes them one after the other, large bodies not copied); else as one
    buffer (cheaper for small ones than gathering them)."""
    if max(map(len, bodies)) >= LARGE_FRAME:
        return packed_parts(keys, bodies)
    return pack(keys, bodies)
