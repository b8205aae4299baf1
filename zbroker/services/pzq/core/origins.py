"""The origins of a pzq queue: the other queues it holds copies for, as their holder. No I/O.

A queue holds copies only from the node ids listed in its ``replica_sources`` (static peers;
anything else with a ``REPLICA:<node>`` header is answered "0" and creates nothing) or from
the peers of its cluster, and from at most ``max_replica_origins`` origins; the copies count in
its ``max_backlog`` with its own messages (one Budget). The copies of each origin node are
kept in a log of their own (a replica core: a QueueCore whose log actions name the origin's
node id), answered to a static peer on the receive endpoint, to a cluster peer as CONFIRM.

When an origin is lost, its copies are taken over: :meth:`Origins.taking_over` gives them to
the replication core (replication.py), which has the queue adopt them; each leaves the
replica log once the queue has written it (:meth:`Origins.adopted`).

:class:`Origins` keeps the origins and their replica cores; it returns its actions, and
never calls the replication core.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from pzq import wire
from zbroker.services.pzq.core import peering
from zbroker.services.pzq.core.actions import Adopted, BatchResult, Log, OpenLog, Reply, SendCluster
from zbroker.services.pzq.core.fence import Fence
from zbroker.services.pzq.core.messages import Message
from zbroker.services.pzq.core.queue import QUEUE_FULL, Budget, Limits, QueueCore
from zbroker.services.pzq.core.records import MessageRecord

#: the routing id under which a cluster peer's copies enter a replica core (ZeroMQ never
#: makes routing ids that start with a zero byte followed by text)
CLUSTER_PEER = b"\x00peer:"
NOT_CONFIGURED = "replication is not configured on this queue"
COPIES_FULL = f"{QUEUE_FULL}: the copies held for peers count in max_backlog"
REFUSAL_LOG_INTERVAL = 60.0  # seconds between two log lines about refused replica traffic
#: leases after its loss in which a lost origin's copies may be taken over: until it has been
#: silent for a lease (what it sent before its loss is read first), and a tick more
TAKEOVER_WINDOW = 1.5
_NEVER = float("inf")
#: what a holder is sent: a static peer's copy, DELETE or PING, or a cluster peer's
Held: TypeAlias = peering.StaticMessage | peering.Copy | peering.Delete


def not_accepted(node_id: str) -> str:
    return f"replica node {node_id} is not accepted by this queue (replica_sources)"


def too_many_origins(limit: int) -> str:
    return f"too many replica origins: this queue holds copies of {limit} already " \
           f"(max_replica_origins)"


@dataclass
class Origin:
    node_id: str
    core: QueueCore
    last_seen: float
    taken_over: bool = False
    life: str | None = None  # the cluster peer life its copies came from (None: static peer)
    #: when that life ended: its copies may be taken over until a peer_timeout later
    lost_at: float | None = None
    #: its copies were taken over and the write failed: taken over again by the clock
    retry: bool = False
    #: the keys of the copies held when its present life began: its RELEASE (sent first
    #: in every life) drops them, unless it copies them again; lost before that RELEASE
    #: came, they are not taken over (the origin may have gone on with another holder)
    stale: set[bytes] = dataclasses.field(default_factory=set)

    def current(self) -> list[Any]:
        """The copies it sent in its present life (or sent again)."""
        stale = self.stale
        return [m for m in self.core.messages.values() if m.msg_id not in stale]

    def has_current(self) -> bool:
        """It sent copies in its present life (or sent them again): :meth:`current` is not
        empty, found without listing them."""
        stale = self.stale
        return any(m.msg_id not in stale for m in self.core.messages.values())


def holder_output(actions: list[Any], qname: bytes) -> Iterator[Any]:
    """A replica core's output: its log actions as they are; its answers to a static peer on
    the receive endpoint, to a cluster peer as CONFIRM."""
    confirms: dict[tuple[bytes, bytes], list[bytes]] = {}
    for a in actions:
        if type(a) is not Reply:
            yield a
        elif not a.peer.startswith(CLUSTER_PEER):
            yield a
        else:
            confirms.setdefault((a.peer, a.frames[1]), []).append(a.frames[0])
    for (peer, status), keys in confirms.items():
        life = peer[len(CLUSTER_PEER):].decode()
        for chunk in peering.key_chunks(keys):
            yield SendCluster(life, peering.Confirm(qname, status == wire.OK, chunk))


class Origins:
    def __init__(self, name: str, node_id: str, limits: Limits, budget: Budget,
                 sources: frozenset[str], cluster: bool, max_origins: int):
        """``limits``: the queue's (a replica core's follow them); ``budget``: the queue's,
        shared with the replica cores; ``sources``: the static peers accepted; ``cluster``:
        the queue holds copies of its cluster's peers too."""
        self.name = name
        self.node_id = node_id
        self._qname = name.encode()
        self.budget = budget
        self.sources = sources
        self.cluster = cluster
        self.max_origins = max_origins
        # the ids of a replica core are the keys of the copies it holds (dropped with them):
        # bounded by the backlog, never evicted while the copy is here
        self.replica_limits: Limits = dataclasses.replace(
            limits, replicas=0, idempotence_window=limits.max_messages,
            idempotence_bytes=1 << 62)
        self.origins: dict[str, Origin] = {}
        self.taken_over = 0  # copies taken over
        self.refused = 0  # replica messages refused (not accepted, too many origins)
        self._refusal_logged = -REFUSAL_LOG_INTERVAL

    def _log(self, level: str, event: str, **fields: Any) -> Log:
        return Log(level, event, {"queue": self.name, **fields})

    # --- start --------------------------------------------------------------------------------

    def restore(self, node_id: str, messages: list[MessageRecord], next_seq: int,
                now: float, taken: Sequence[bytes]) -> bool:
        """The log of ``node_id``'s copies, found at start (``taken``: the keys of them taken
        over before). False: it is empty and that node is not accepted any more (the caller
        removes it); its copies are held otherwise."""
        core = self._replica_core(node_id)
        core.recover(messages, next_seq)
        if not messages and not self.accepts(node_id):
            return False
        self.origins[node_id] = Origin(node_id, core, now)
        # copies taken over and written in our queue before a crash kept them here too
        for key in taken:
            if key in core.ids:
                core.remove_by_id(key)
        return True

    def accepts(self, node_id: str) -> bool:
        """Copies from ``node_id`` may be held here: it is a replica source, or this queue is
        in a cluster (whose peers are the cluster's to admit)."""
        return node_id in self.sources or self.cluster

    def _replica_core(self, node_id: str) -> QueueCore:
        return QueueCore(self.replica_limits, budget=self.budget, full_reason=COPIES_FULL,
                         log=node_id)

    # --- what origins send ------------------------------------------------------------------

    def hold(self, msg: Held, node_id: str, peer: bytes, key: bytes, body: Sequence[Any],
             now: float, now_us: int) -> list[Any]:
        """A copy of another queue's message (or its DELETE, or that queue's PING); the
        actions it takes."""
        out: list[Any] = []
        if node_id == self.node_id:
            return out  # our own copy came back (a peer list that names us)
        copy = type(msg) in (peering.ReplicaCopy, peering.Copy)
        origin = self.origins.get(node_id)
        if origin is None:
            if not copy:
                return out
            if len(self.origins) >= self.max_origins:
                return self.refuse(msg, peer, key, too_many_origins(self.max_origins), now)
            origin = self.origins[node_id] = Origin(node_id, self._replica_core(node_id), now)
            out.append(OpenLog(node_id))
        origin.last_seen = now
        if peer.startswith(CLUSTER_PEER):
            origin.life = peer[len(CLUSTER_PEER):].decode()
        if origin.taken_over:
            origin.taken_over = False  # it is back: a new life for its copies
            out.append(Log("info", "pzq replica origin is back", {"node": node_id}))
        if copy:
            origin.core.produce(peer, [key, b"", *body], now_us)
            if origin.stale:
                origin.stale.discard(key)
        elif type(msg) in (peering.ReplicaDelete, peering.Delete):
            origin.core.remove_by_id(key)
        return out

    def refuse(self, msg: Held, peer: bytes, key: bytes, reason: str, now: float
               ) -> list[Any]:
        """Replica traffic refused: a copy is answered "0" (as a producer); a log line now
        and then."""
        self.refused += 1
        out: list[Any] = []
        if type(msg) in (peering.ReplicaCopy, peering.Copy):
            answer = wire.producer_ack(bytes(key[:wire.MAX_ID]), False, reason)
            out += holder_output([Reply(peer, answer)], self._qname)
        if now - self._refusal_logged >= REFUSAL_LOG_INTERVAL:
            self._refusal_logged = now
            out.append(self._log("warning", "pzq replica traffic refused", reason=reason,
                                 refused=self.refused))
        return out

    def release(self, node_id: str) -> int:
        """Drop every copy held for ``node_id`` (its queue no longer counts on them)."""
        origin = self.origins.get(node_id)
        if origin is None:
            return 0
        ids = [m.msg_id for m in origin.core.messages.values()]
        for msg_id in ids:
            origin.core.remove_by_id(msg_id)
        origin.stale = set()
        return len(ids)

    def output(self) -> list[Any]:
        """What the replica cores did since the last call (their log actions, and their
        answers to the origins)."""
        out: list[Any] = []
        for origin in self.origins.values():
            if origin.core.out:
                out += holder_output(origin.core.take_output(), self._qname)
        return out

    def batch_done(self, node_id: str, result: BatchResult) -> None:
        origin = self.origins.get(node_id)
        if origin is not None:
            origin.core.batch_done(result)

    # --- an origin's lives --------------------------------------------------------------------

    def hosted(self, node_id: str, life: str, now: float) -> None:
        """A peer life hosts the queue of ``node_id``: from now on an origin's liveness is
        that life's, and the copies held from before are stale until its RELEASE."""
        origin = self.origins.get(node_id)
        if origin is not None:
            origin.life, origin.last_seen, origin.taken_over = life, now, False
            origin.lost_at = None
            origin.stale = {m.msg_id for m in origin.core.messages.values()}

    def life_ended(self, life: str, now: float, alive: bool = False) -> list[Log]:
        """A peer life left the cluster: the origins of that life are lost since ``now``.
        ``alive``: the peer was running as the life ended (the cluster's Left.alive: it had
        lost us and started afresh, so it took another holder, went on delivering and sent
        its DELETEs there; or it said why it ended the life): their copies are stale, never
        taken over, kept until it is back and releases them (its RELEASE). The log lines of
        those kept."""
        out: list[Log] = []
        for origin in self.origins.values():
            if origin.life == life and not origin.taken_over and origin.has_current():
                if not alive:
                    origin.lost_at = now
                    continue
                origin.lost_at = None
                out.append(self._log(
                    "warning", "pzq replica origin ended its life with us, its copies kept: "
                    "it had lost us and went on without us", node=origin.node_id,
                    copies=len(origin.core.messages)))
        return out

    def lost(self, now: float, lease: float, fence: Fence) -> list[Origin | Log]:
        """The origins whose life ended to take over now, in order with the log lines of
        those given up on: taken over once a quorum without the origin answers us and
        nothing came from it for a lease (a life also ends when the origin ended it: it was
        alive and heard us not, we were paused, or cut off, and what it sent before comes
        first). Not taken over within TAKEOVER_WINDOW leases of the loss, they wait for the
        origin's return (its RELEASE)."""
        out: list[Origin | Log] = []
        for origin in self.origins.values():
            lost = origin.lost_at
            if lost is None or origin.taken_over or not origin.has_current():
                origin.lost_at = None
                continue
            node_id = origin.node_id
            if now - lost > TAKEOVER_WINDOW * lease:
                # (a quorum found later is of a holder that was itself cut off or paused:
                # the origin went on meanwhile, maybe with another holder)
                origin.lost_at = None
                out.append(self._log(
                    "warning", "pzq replica origin lost, its copies kept: no quorum of the "
                    "queue's hosts answers us without it, or it was heard meanwhile",
                    node=node_id, copies=len(origin.core.messages),
                    **fence.counts(now, node_id)))
            elif fence.quorum_without(node_id, now) and fence.silent(node_id, now):
                origin.lost_at = None
                out.append(origin)
        return out

    def silent(self, now: float, node_timeout: float, fence: Fence) -> list[Origin]:
        """The static origins silent for ``node_timeout``, to take over now (and, in a
        cluster, those whose takeover failed to be written, once a quorum without them
        answers us). Copies of a cluster origin found at our start may be stale: it went on
        with another holder while we were away; they wait for its return and its
        RELEASE."""
        due = [o for o in self.origins.values()
               if o.life is None and not o.taken_over and o.core.messages
               and now - o.last_seen > node_timeout
               and (not self.cluster
                    or o.retry and fence.quorum_without(o.node_id, now))]
        for origin in due:
            origin.retry = False
        return due

    def taking_over(self, origin: Origin) -> list[Message]:
        """The copies of a lost origin to move into the queue (its present life's, in a
        cluster)."""
        origin.taken_over = True
        messages = origin.current() if self.cluster else list(origin.core.messages.values())
        self.taken_over += len(messages)
        return messages

    def adopted(self, a: Adopted) -> tuple[str, bytes] | None:
        """A copy taken over is written in our queue (or its write failed): only now may it
        leave the replica log. Returns (origin, key) if its origin is to be told it was taken
        (TAKEN: only now, since told any sooner, a crash before the write would make the
        origin drop a message that no log holds any more)."""
        node_id, key = a.token
        origin = self.origins.get(node_id)
        if origin is None:
            return None
        if not a.ok:  # still in the replica log: taken over again later (tick)
            origin.taken_over = False
            origin.life = None
            origin.last_seen = -_NEVER
            origin.retry = True
            return None
        origin.core.remove_by_id(key)
        if a.claim and self.cluster and b"\n" not in key:
            return node_id, key
        return None

    def counters(self) -> dict[str, int]:
        return {"replica_origins": len(self.origins),
                "replicas_held": sum(len(o.core.messages) for o in self.origins.values()),
                "replicas_taken_over": self.taken_over,
                "replicas_refused": self.refused}
