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

The routing-id frames a ROUTER adds or strips are not part of these lists. Decoding never
raises: malformed input gives a :class:`WireError` value with the reason the original sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

OK = b"1"
FAILED = b"0"
MONITOR = b"MONITOR"
REPLICA_HEADER = b"REPLICA:"

MALFORMED = "Malformed message, no delimiter found or missing message parts"
EMPTY = "Trying to save empty message"
REPLICATION_FAILED = "REPLICATION_FAILED"

Frame = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class Produce:
    """A message from a producer."""

    msg_id: bytes
    headers: tuple[bytes, ...]
    body: tuple[bytes, ...]

    @property
    def size(self) -> int:
        return sum(len(f) for f in self.body)

    @property
    def is_replica(self) -> bool:
        return any(h.startswith(REPLICA_HEADER) for h in self.headers)


@dataclass(frozen=True, slots=True)
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
    if not frames:
        return WireError(MALFORMED)
    msg_id = bytes(frames[0])
    delimiter = next((i for i in range(1, len(frames)) if len(frames[i]) == 0), None)
    if delimiter is None:
        return WireError(MALFORMED, msg_id)
    body = tuple(bytes(f) for f in frames[delimiter + 1:])
    if not body:
        return WireError(EMPTY, msg_id)
    return Produce(msg_id, tuple(bytes(f) for f in frames[1:delimiter]), body)


def producer_ack(msg_id: bytes, ok: bool = True, text: str | None = None) -> list[bytes]:
    """``[msg id]["1"|"0"][""]`` and the text, if any."""
    frames = [msg_id, OK if ok else FAILED, b""]
    if text:
        frames.append(text.encode())
    return frames


def delivery(key: bytes, sent_us: int, ack_timeout_us: int,
             body: Iterable[bytes]) -> list[bytes]:
    """``[key][sent][ack timeout][""][body...]``."""
    return [key, str(sent_us).encode(), str(ack_timeout_us).encode(), b"", *body]


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


def make_key(time_us: int, uuid_text: str) -> bytes:
    """``<µs since epoch>|<uuid>``, the key consumers see."""
    return f"{time_us}|{uuid_text}".encode()
