"""What pzq queues tell each other to replicate: typed messages, encode/decode pairs. No I/O.

Static peers, on a queue's receive endpoint (the original pzq's ``REPLICA:`` header), after
the routing id::

    ReplicaCopy    [key]["REPLICA:<node>"][""][body...]      hold a copy; answered as a
                                                            producer: [key]["1"|"0"][""]...
    ReplicaDelete  [key]["REPLICA-ACK:<node>"][""]["-"]     its original was ACKed: drop it
    ReplicaPing    ["-"]["REPLICA-PING:<node>"][""]["-"]    <node> is alive
    ReplicaAnswer  [key]["1"|"0"][""][reason]               what a holder answered a copy

The cluster's service channel (service "pzq"), addressed by queue name::

    Queues   [QUEUES][json {queue: node}]                the queues a broker hosts
    Copy     [COPY][queue][node]{[key][n][n body frames]}...   hold copies (CONFIRM answers)
    Confirm  [CONFIRM][queue]["1"|"0"][key...]            the copies are durable, or refused
    Delete   [DELETE][queue][node][key...]                their originals were ACKed
    Taken    [TAKEN][queue][node][key...]                 delivered by the holder meanwhile;
                                                          one without keys ends the list
    Release  [RELEASE][queue][node]                       drop every copy held for <node>
    Lease    [LEASE][queue][node][stamp]                  <node>'s queue of that name asks
                                                          to be heard (replication.py)
    Lease    [LEASED][queue][node][stamp]                 ... and is: the stamp comes back
    Took     [TOOK][queue][node]                          the sender took <node>'s copies over
    Takers   [TAKERS][queue][node][taker...]              who took <node>'s copies over: it
                                                          waits for their TAKEN lists

``<node>`` is a queue's node id: 32 lowercase hex digits. Decoding never raises: what is not
well-formed gives a :class:`DecodeError` (``decode_replica`` gives None for input that is not
replication traffic: an ordinary producer's message, answered as one).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pzq.wire import OK, REPLICA_HEADER, producer_ack

#: what the headers of static peers' messages begin with (REPLICA:, REPLICA-ACK:, REPLICA-PING:)
REPLICA_PREFIX = b"REPLICA"
REPLICA_ACK_HEADER = b"REPLICA-ACK:"
REPLICA_PING_HEADER = b"REPLICA-PING:"
QUEUES, COPY, CONFIRM, DELETE = b"QUEUES", b"COPY", b"CONFIRM", b"DELETE"
TAKEN, RELEASE, LEASE, LEASED = b"TAKEN", b"RELEASE", b"LEASE", b"LEASED"
TOOK, TAKERS = b"TOOK", b"TAKERS"
MAX_TAKERS = 64  # node ids in one TAKERS
BATCH_MESSAGES = 256  # messages (or keys) in one message of the cluster channel, at most
BATCH_BYTES = 1 << 20  # body bytes in one COPY, at most (a bigger message goes alone)
TAKEN_BATCH = 1000  # keys in one TAKEN
_NODE_RE = re.compile(r"[0-9a-f]{32}")


def is_node(text: str) -> bool:
    return _NODE_RE.fullmatch(text) is not None


@dataclass(frozen=True, slots=True)
class DecodeError:
    reason: str


# --- static peers -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaCopy:
    node_id: str
    key: bytes
    body: Sequence[Any]


@dataclass(frozen=True, slots=True)
class ReplicaDelete:
    node_id: str
    key: bytes


@dataclass(frozen=True, slots=True)
class ReplicaPing:
    node_id: str


@dataclass(frozen=True, slots=True)
class ReplicaAnswer:
    key: bytes
    ok: bool
    reason: str | None = None


StaticMessage = ReplicaCopy | ReplicaDelete | ReplicaPing
_STATIC_HEADERS = ((REPLICA_HEADER, ReplicaCopy), (REPLICA_ACK_HEADER, ReplicaDelete),
                   (REPLICA_PING_HEADER, ReplicaPing))


def encode_replica(msg: StaticMessage | ReplicaAnswer) -> list[Any]:
    """The frames (after the routing id) of a message to a static peer, or of an answer."""
    if isinstance(msg, ReplicaCopy):
        return [msg.key, REPLICA_HEADER + msg.node_id.encode(), b"", *msg.body]
    if isinstance(msg, ReplicaDelete):
        return [msg.key, REPLICA_ACK_HEADER + msg.node_id.encode(), b"", b"-"]
    if isinstance(msg, ReplicaPing):
        return [b"-", REPLICA_PING_HEADER + msg.node_id.encode(), b"", b"-"]
    return producer_ack(msg.key, msg.ok, msg.reason)


def decode_replica(frames: Sequence[Any]) -> StaticMessage | None:
    """Replication traffic on a receive endpoint (``frames`` after the routing id); None if
    it is none: no known REPLICA header with a node id, or no delimiter (an ordinary
    producer's message then, maybe malformed)."""
    if len(frames) < 3:
        return None
    header = bytes(frames[1])
    found = next(((p, k) for p, k in _STATIC_HEADERS if header.startswith(p)), None)
    if found is None:
        return None
    prefix, kind = found
    node_id = header[len(prefix):].decode(errors="replace")
    if not is_node(node_id):
        return None
    delimiter = next((i for i in range(1, len(frames)) if len(frames[i]) == 0), None)
    if delimiter is None:
        return None
    if kind is ReplicaCopy:
        return ReplicaCopy(node_id, bytes(frames[0]), list(frames[delimiter + 1:]))
    if kind is ReplicaDelete:
        return ReplicaDelete(node_id, bytes(frames[0]))
    return ReplicaPing(node_id)


def decode_answer(frames: Sequence[Any]) -> ReplicaAnswer | None:
    """A holder's answer to a copy (on the socket to a static peer); None if malformed."""
    if len(frames) < 2:
        return None
    reason = bytes(frames[3]).decode(errors="replace") if len(frames) > 3 else None
    return ReplicaAnswer(bytes(frames[0]), bytes(frames[1]) == OK, reason)


# --- the cluster channel ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Queues:
    hosted: dict[str, str]  # queue name -> its node id


@dataclass(frozen=True, slots=True)
class Copy:
    queue: bytes
    node_id: str
    items: list[tuple[bytes, Sequence[Any]]]  # (key, body frames)


@dataclass(frozen=True, slots=True)
class Confirm:
    queue: bytes
    ok: bool
    keys: list[bytes]


@dataclass(frozen=True, slots=True)
class Delete:
    queue: bytes
    node_id: str
    keys: list[bytes]


@dataclass(frozen=True, slots=True)
class Taken:
    queue: bytes
    node_id: str  # as sent: the receiver checks it is its own
    keys: list[bytes]


@dataclass(frozen=True, slots=True)
class Release:
    queue: bytes
    node_id: str


@dataclass(frozen=True, slots=True)
class Lease:
    queue: bytes
    node_id: str  # the sender's queue
    stamp: bytes  # the asker's clock, as it wrote it (its answer: the same)
    answer: bool = False


@dataclass(frozen=True, slots=True)
class Took:
    queue: bytes
    node_id: str  # the origin whose copies the sender took over


@dataclass(frozen=True, slots=True)
class Takers:
    queue: bytes
    node_id: str  # the origin
    takers: list[str]  # node ids of the queues that took its copies over


ClusterMessage = Queues | Copy | Confirm | Delete | Taken | Release | Lease | Took | Takers


def encode(msg: ClusterMessage) -> list[Any]:
    if isinstance(msg, Copy):
        frames = [COPY, msg.queue, msg.node_id.encode()]
        for key, body in msg.items:
            frames += [key, b"%d" % len(body), *body]
        return frames
    if isinstance(msg, Confirm):
        return [CONFIRM, msg.queue, OK if msg.ok else b"0", *msg.keys]
    if isinstance(msg, Delete):
        return [DELETE, msg.queue, msg.node_id.encode(), *msg.keys]
    if isinstance(msg, Taken):
        return [TAKEN, msg.queue, msg.node_id.encode(), *msg.keys]
    if isinstance(msg, Release):
        return [RELEASE, msg.queue, msg.node_id.encode()]
    if isinstance(msg, Lease):
        return [LEASED if msg.answer else LEASE, msg.queue, msg.node_id.encode(), msg.stamp]
    if isinstance(msg, Took):
        return [TOOK, msg.queue, msg.node_id.encode()]
    if isinstance(msg, Takers):
        return [TAKERS, msg.queue, msg.node_id.encode(), *(t.encode() for t in msg.takers)]
    return [QUEUES, json.dumps(msg.hosted).encode()]


def decode(frames: Sequence[Any]) -> ClusterMessage | DecodeError:
    """A message of the cluster channel (its kind first). Big COPY bodies may be memoryviews:
    they are kept as they are."""
    if not frames:
        return DecodeError("no frames")
    kind = bytes(frames[0])
    if kind == QUEUES:
        if len(frames) != 2:
            return DecodeError("QUEUES takes one frame")
        try:
            hosted = json.loads(bytes(frames[1]))
        except (ValueError, RecursionError):
            return DecodeError("QUEUES: not JSON")
        if not isinstance(hosted, dict):
            return DecodeError("QUEUES: not a JSON object")
        return Queues({k: v for k, v in hosted.items() if isinstance(v, str)})
    if len(frames) < 2:
        return DecodeError(f"{kind[:20]!r} without a queue")
    queue, rest = bytes(frames[1]), frames[2:]
    if kind in (COPY, DELETE):
        if len(rest) < 2:
            return DecodeError(f"{kind.decode()} without a node and a key")
        node_id = bytes(rest[0]).decode(errors="replace")
        if not is_node(node_id):
            return DecodeError(f"{kind.decode()}: not a node id")
        if kind == DELETE:
            return Delete(queue, node_id, [bytes(k) for k in rest[1:]])
        items = parse_copies(rest[1:])
        if items is None:
            return DecodeError("COPY: its frames do not add up")
        return Copy(queue, node_id, items)
    if kind == CONFIRM:
        if len(rest) < 2:
            return DecodeError("CONFIRM without a status and a key")
        return Confirm(queue, bytes(rest[0]) == OK, [bytes(k) for k in rest[1:]])
    if kind == RELEASE:
        node_id = bytes(rest[0]).decode(errors="replace") if len(rest) == 1 else ""
        if not is_node(node_id):
            return DecodeError("RELEASE takes a node id")
        return Release(queue, node_id)
    if kind in (TOOK, TAKERS):
        nodes = [bytes(f).decode(errors="replace") for f in rest[:MAX_TAKERS + 2]]
        if not nodes or not all(map(is_node, nodes)) or (kind == TOOK) != (len(rest) == 1) \
                or len(rest) > MAX_TAKERS + 1:
            return DecodeError(f"{kind.decode()} takes node ids")
        return Took(queue, nodes[0]) if kind == TOOK else Takers(queue, nodes[0], nodes[1:])
    if kind in (LEASE, LEASED):
        node_id = bytes(rest[0]).decode(errors="replace") if len(rest) == 2 else ""
        if not is_node(node_id) or len(rest[1]) > 32:
            return DecodeError(f"{kind.decode()} takes a node id and a stamp")
        return Lease(queue, node_id, bytes(rest[1]), answer=kind == LEASED)
    if kind == TAKEN:
        if not rest:
            return DecodeError("TAKEN without a node")
        return Taken(queue, bytes(rest[0]).decode(errors="replace"),
                     [bytes(k) for k in rest[1:]])
    return DecodeError(f"unknown kind {kind[:20]!r}")


def parse_copies(frames: Sequence[Any]) -> list[tuple[bytes, Sequence[Any]]] | None:
    """The (key, body frames) pairs of a COPY (``frames`` after its node); None if it is
    malformed."""
    out: list[tuple[bytes, Sequence[Any]]] = []  # (as Copy.items: a list is a Sequence)
    i, end = 0, len(frames)
    while i < end:
        if i + 2 >= end or not 0 < len(frames[i + 1]) <= 6 or not bytes(frames[i + 1]).isdigit():
            return None
        n = int(frames[i + 1])
        if n < 1 or i + 2 + n > end:
            return None
        out.append((bytes(frames[i]), list(frames[i + 2:i + 2 + n])))
        i += 2 + n
    return out


def copies(queue: bytes, node_id: str,
           items: Iterable[tuple[bytes, Sequence[Any]]]) -> Iterator[Copy]:
    """COPY messages for (key, body frames) pairs: at most BATCH_MESSAGES each, and
    BATCH_BYTES of bodies (a bigger message goes alone)."""
    batch: list[tuple[bytes, Sequence[Any]]] = []
    size = 0
    for key, body in items:
        batch.append((key, body))
        size += sum(len(f) for f in body)
        if len(batch) >= BATCH_MESSAGES or size >= BATCH_BYTES:
            yield Copy(queue, node_id, batch)
            batch, size = [], 0
    if batch:
        yield Copy(queue, node_id, batch)


def key_chunks(keys: Sequence[bytes], n: int = BATCH_MESSAGES) -> Iterator[list[bytes]]:
    for i in range(0, len(keys), n):
        yield list(keys[i:i + n])
