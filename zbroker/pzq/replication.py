"""Replication between pzq queues over statically configured peers.

A queue with ``replicas: N`` copies each message to the first N of its ``peers`` (their
receive endpoints) before the producer ACK, with the original's ``REPLICA:`` header; if the
copies are not confirmed within ``replication_timeout`` the ACK is "1" with the text
``REPLICATION_FAILED``. Frames, on the peer's receive socket::

    [key]["REPLICA:<node>"][""][body...]         hold a copy; answered [key]["1"|"0"][""]...
    [key]["REPLICA-ACK:<node>"][""]["-"]         its original was ACKed: drop the copy
    ["-"]["REPLICA-PING:<node>"][""]["-"]        <node> is alive (every node_timeout / 4)

``<node>`` is the sending queue's node id (kept in its data directory). A queue holds copies
only from the node ids listed in its ``replica_sources`` (anything else on its receive
endpoint with a ``REPLICA:<node>`` header is answered "0" and creates nothing), and from at
most ``max_replica_origins`` origins; the copies count in its ``max_backlog`` with its own
messages (one :class:`Budget`). A holder keeps the
copies of each origin node in its own log (``<data_dir>/replicas/<node>``); when an origin
has been silent for ``node_timeout``, the holder takes its copies over: they enter its own
queue and its consumers get them (at-least-once: if the origin was not really gone, both may
deliver). When the origin is heard again, it is treated as a new origin.

In a cluster (``replicas: N`` and no static ``peers``), the copies travel on the cluster's
service channel instead, addressed by queue name, to N peers that host a queue of the same
name (placement.py chooses them and replaces a lost one)::

    [QUEUES][json {queue: node}]         the queues a broker hosts (sent to every peer that joins)
    [COPY][queue][node]{[key][n][n body frames]}...   hold copies; answered with CONFIRM
    [CONFIRM][queue]["1"|"0"][key...]     the copies are durable ("1") or were refused
    [DELETE][queue][node][key...]         their originals were ACKed: drop the copies
    [TAKEN][queue][node][key...]          the holder delivered these in the origin's absence
    [RELEASE][queue][node]                drop every copy held for <node> (sent before any
                                          copy to a peer that joins: what it still holds from
                                          an earlier life of either side is stale)

Liveness comes from the cluster's heartbeats: when the peer that sent an origin's copies
leaves, the holder takes them over at once. It remembers the keys it took over
(``<data_dir>/replicas/<node>.taken``) and sends them in TAKEN when that origin's queue is
announced again, so that a restarted origin drops them instead of delivering them twice.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .queue import QUEUE_FULL, Budget, Limits, QueueCore
from .store import BatchResult, Store
from .wire import REPLICA_HEADER

# the kinds of message on the cluster's service channel (service "pzq"); CLUSTER_COPY and
# CLUSTER_DELETE are the cluster's counterparts of REPLICA_HEADER and REPLICA_ACK_HEADER
QUEUES, CLUSTER_COPY, CONFIRM, CLUSTER_DELETE = b"QUEUES", b"COPY", b"CONFIRM", b"DELETE"
TAKEN, RELEASE = b"TAKEN", b"RELEASE"
#: the routing id under which a cluster peer's copies enter a replica core (ZeroMQ never
#: makes routing ids that start with a zero byte followed by text)
CLUSTER_PEER = b"\x00peer:"

# the header (second frame) of replication traffic on a queue's receive endpoint, before the
# origin's node id: a copy to hold (wire.REPLICA_HEADER, "REPLICA:"), its original's ACK (drop
# the copy), the origin is alive
REPLICA_ACK_HEADER = b"REPLICA-ACK:"
REPLICA_PING_HEADER = b"REPLICA-PING:"
_NODE_RE = re.compile(r"[0-9a-f]{32}")

NOT_CONFIGURED = "replication is not configured on this queue"
COPIES_FULL = f"{QUEUE_FULL}: the copies held for peers count in max_backlog"


def not_accepted(node_id: str) -> str:
    return f"replica node {node_id} is not accepted by this queue (replica_sources)"


def too_many_origins(limit: int) -> str:
    return f"too many replica origins: this queue holds copies of {limit} already " \
           f"(max_replica_origins)"


def load_node_id(data_dir: Path) -> str:
    """This queue's node id: made once, kept in ``<data_dir>/node-id``."""
    path = data_dir / "node-id"
    try:
        text = path.read_text().strip()
        if _NODE_RE.fullmatch(text):
            return text
    except FileNotFoundError:
        pass
    text = uuid.uuid4().hex
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)
    return text


def copy_frames(key: bytes, node_id: str, body: tuple[bytes, ...]) -> list[bytes]:
    return [key, REPLICA_HEADER + node_id.encode(), b"", *body]


def delete_frames(key: bytes, node_id: str) -> list[bytes]:
    return [key, REPLICA_ACK_HEADER + node_id.encode(), b"", b"-"]


def ping_frames(node_id: str) -> list[bytes]:
    return [b"-", REPLICA_PING_HEADER + node_id.encode(), b"", b"-"]


BATCH_MESSAGES = 256  # messages (or keys) in one message of the cluster channel, at most
BATCH_BYTES = 1 << 20  # body bytes in one COPY, at most (a bigger message goes alone)


def copy_batches(queue: bytes, node_id: bytes,
                 items: Iterable[tuple[bytes, Sequence[bytes]]]) -> Iterator[list[bytes]]:
    """COPY messages for (key, body frames) pairs."""
    head = [CLUSTER_COPY, queue, node_id]
    frames, n, size = list(head), 0, 0
    for key, body in items:
        frames += [key, b"%d" % len(body), *body]
        n += 1
        size += sum(len(f) for f in body)
        if n >= BATCH_MESSAGES or size >= BATCH_BYTES:
            yield frames
            frames, n, size = list(head), 0, 0
    if n:
        yield frames


def key_batches(head: list[bytes], keys: Sequence[bytes]) -> Iterator[list[bytes]]:
    """``head`` + up to BATCH_MESSAGES keys, as many messages as it takes."""
    for i in range(0, len(keys), BATCH_MESSAGES):
        yield [*head, *keys[i:i + BATCH_MESSAGES]]


def parse_copies(frames: Sequence[Any]) -> list[tuple[bytes, list[Any]]] | None:
    """The (key, body frames) pairs of a COPY (``frames`` after its node); None if it is
    malformed."""
    out = []
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


def is_node(text: str) -> bool:
    return _NODE_RE.fullmatch(text) is not None


def classify(frames: list[bytes]) -> tuple[bytes, str] | None:
    """(kind, origin node) if ``frames`` (after the routing id) is replication traffic."""
    if len(frames) < 3:
        return None
    header = frames[1]
    for kind in (REPLICA_HEADER, REPLICA_ACK_HEADER, REPLICA_PING_HEADER):
        if header.startswith(kind):
            node_id = header[len(kind):].decode(errors="replace")
            return (kind, node_id) if _NODE_RE.fullmatch(node_id) else None
    return None


@dataclass
class Origin:
    node_id: str
    core: QueueCore
    store: Store
    last_seen: float
    taken_over: bool = False
    life: str | None = None  # the cluster peer life its copies came from (None: static peer)


class ReplicaHolder:
    """The copies this queue holds for other nodes, one log per origin node."""

    def __init__(self, base: Path, limits: Limits, store_options: dict[str, Any],
                 notify: Callable[[Origin, BatchResult], None], log: Any,
                 budget: Budget | None = None, max_origins: int = 16):
        self.base = base
        # the ids of a replica core are the keys of the copies it holds (dropped with them):
        # bounded by the backlog, never evicted while the copy is here
        self.limits = dataclasses.replace(limits, replicas=0,
                                          idempotence_window=limits.max_messages,
                                          idempotence_bytes=1 << 62)
        self.store_options = store_options
        self.notify = notify
        self.log = log
        self.budget = budget if budget is not None else Budget()
        self.max_origins = max_origins
        self.origins: dict[str, Origin] = {}
        self.taken_over = 0
        self.refused = 0  # replica messages refused (not accepted, too many origins)

    def open_existing(self, now: float, accepted: Callable[[str], bool]) -> None:
        """Open the logs of the origins found on disk (blocking: before serving), at most
        ``max_origins``. An empty log of a node that is not ``accepted`` is removed; one that
        holds copies is kept and opened (its copies are delivered if the node stays silent)."""
        if not self.base.is_dir():
            return
        removed, skipped = 0, []
        for d in sorted(self.base.iterdir()):
            if not (d.is_dir() and _NODE_RE.fullmatch(d.name)):
                continue
            if len(self.origins) >= self.max_origins:
                skipped.append(d.name)
                continue
            origin = self._open(d.name, now)
            if not origin.core.messages and not accepted(d.name):
                del self.origins[d.name]
                origin.store.close()
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
        if removed:
            self.log.info("pzq empty replica logs of nodes not accepted removed",
                          removed=removed)
        if skipped:
            self.log.warning("pzq replica logs not opened: more origins than "
                             "max_replica_origins", limit=self.max_origins,
                             skipped=len(skipped), first=skipped[0])

    def _open(self, node_id: str, now: float) -> Origin:
        store = Store(self.base / node_id, log=self.log, **self.store_options)
        recovered = store.open()
        core = QueueCore(self.limits, budget=self.budget, full_reason=COPIES_FULL, log=node_id)
        core.recover(recovered.messages, recovered.next_seq)
        origin = Origin(node_id, core, store, now)
        store.start(lambda result: self.notify(origin, result))
        self.origins[node_id] = origin
        return origin

    def refusal(self, kind: bytes, node_id: str) -> str | None:
        """Why a COPY from ``node_id`` cannot be held (a new origin past ``max_origins``);
        None if it can."""
        if (kind == REPLICA_HEADER and node_id not in self.origins
                and len(self.origins) >= self.max_origins):
            return too_many_origins(self.max_origins)
        return None

    def handle(self, kind: bytes, node_id: str, peer: bytes, key: bytes, body: Sequence[Any],
               now: float, now_us: int) -> QueueCore | None:
        """Replication traffic from ``node_id`` (COPY with the message's body, DELETE, PING)
        that came from ``peer``; returns the core that may have replies."""
        origin = self.origins.get(node_id)
        if origin is None:
            if kind != REPLICA_HEADER:
                return None
            origin = self._open(node_id, now)
        origin.last_seen = now
        if peer.startswith(CLUSTER_PEER):
            origin.life = peer[len(CLUSTER_PEER):].decode()
        if origin.taken_over:
            origin.taken_over = False  # it is back: a new life for its copies
            self.log.info("pzq replica origin is back", node=node_id)
        if kind == REPLICA_HEADER:
            origin.core.produce(peer, [key, b"", *body], now_us)
        elif kind == REPLICA_ACK_HEADER:
            origin.core.remove_by_id(key)
        return origin.core

    def announced(self, life: str, node_id: str, now: float) -> None:
        """A cluster peer life hosts the queue of origin ``node_id``: from now on its liveness
        is that life's (copies found on disk at start are watched by silence until then)."""
        origin = self.origins.get(node_id)
        if origin is not None:
            origin.life = life
            origin.last_seen = now
            origin.taken_over = False

    def release(self, node_id: str) -> int:
        """Drop every copy held for ``node_id`` (its queue no longer counts on them)."""
        origin = self.origins.get(node_id)
        if origin is None:
            return 0
        ids = [m.msg_id for m in origin.core.messages.values()]
        for msg_id in ids:
            origin.core.remove_by_id(msg_id)
        return len(ids)

    def lost(self, now: float, timeout: float) -> list[Origin]:
        """Origins on static peers silent for ``timeout`` whose copies have not been taken
        over yet (the liveness of cluster origins is the cluster's: see ``left``)."""
        return [o for o in self.origins.values()
                if o.life is None and not o.taken_over and o.core.messages
                and now - o.last_seen > timeout]

    def left(self, life: str) -> list[Origin]:
        """Origins whose copies came from the cluster peer life that just left."""
        return [o for o in self.origins.values()
                if o.life == life and not o.taken_over and o.core.messages]

    def take_over(self, origin: Origin, into: QueueCore, now_us: int) -> int:
        """Move the copies of a lost origin into queue ``into``; each copy is dropped from
        the replica log once ``into`` has written it."""
        origin.taken_over = True
        moved = 0
        if origin.life is not None:
            self._remember_taken(origin.node_id, [m.msg_id for m in origin.core.messages.values()])
        for m in list(origin.core.messages.values()):
            # once ``into`` has written it: Adopted((node id, msg id), ok), see adopted()
            into.adopt(b"replica:" + m.msg_id, m.frames, now_us, (origin.node_id, m.msg_id))
            moved += 1
        self.taken_over += moved
        return moved

    def adopted(self, token: tuple[str, bytes], ok: bool) -> None:
        """A copy taken over is written in the queue that took it: drop it here."""
        origin = self.origins.get(token[0])
        if ok and origin is not None:
            origin.core.remove_by_id(token[1])

    def _taken_path(self, node_id: str) -> Path:
        return self.base / f"{node_id}.taken"

    def _remember_taken(self, node_id: str, keys: list[bytes]) -> None:
        """Append the keys taken over from ``node_id`` (one per line; keys hold no newline)."""
        try:
            self.base.mkdir(parents=True, exist_ok=True)
            with open(self._taken_path(node_id), "ab") as f:
                f.write(b"".join(k + b"\n" for k in keys if b"\n" not in k))
        except OSError as exc:  # only costs duplicates if the origin comes back
            self.log.warning("pzq cannot record taken-over keys", node=node_id, error=str(exc))

    def taken(self, node_id: str) -> list[bytes]:
        """The keys of ``node_id``'s messages this queue delivered in its absence."""
        try:
            return [k for k in self._taken_path(node_id).read_bytes().split(b"\n") if k]
        except OSError:
            return []

    def forget_taken(self, node_id: str) -> None:
        self._taken_path(node_id).unlink(missing_ok=True)

    def close(self) -> None:
        for o in self.origins.values():
            o.store.close()

    def counters(self) -> dict[str, int]:
        return {"replica_origins": len(self.origins),
                "replicas_held": sum(len(o.core.messages) for o in self.origins.values()),
                "replicas_taken_over": self.taken_over,
                "replicas_refused": self.refused}
