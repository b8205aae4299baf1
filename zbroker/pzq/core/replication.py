"""Replication between pzq queues: the copies a queue makes and the copies it holds. No I/O.

A queue with ``replicas: N`` copies each message to N peers before the producer ACK; if the
copies are not confirmed within ``replication_timeout`` the ACK is "1" with the text
``REPLICATION_FAILED`` (queue.py keeps that count). The peers are either the first N of its
static ``peers`` (their receive endpoints, with the original's ``REPLICA:`` header), or, in a
cluster (``replicas: N`` and no static ``peers``), N peers of the cluster that host a queue of
the same name (placement.py chooses them and replaces a lost one). peering.py has the messages.

A queue holds copies only from the node ids listed in its ``replica_sources`` (static peers;
anything else with a ``REPLICA:<node>`` header is answered "0" and creates nothing) or from
the peers of its cluster, and from at most ``max_replica_origins`` origins; the copies count in
its ``max_backlog`` with its own messages (one :class:`Budget`). A holder keeps the copies of
each origin node in a log of their own (a replica core: a QueueCore whose log actions name the
origin's node id). When a static origin has been silent for ``node_timeout`` (it sends a PING
every node_timeout / 4), or the cluster peer that sent a cluster origin's copies leaves, the
holder takes its copies over: they enter its own queue, and each is dropped from the replica
log once the queue has written it (at-least-once: if the origin was not really gone, both may
deliver). The keys taken over from a cluster origin are remembered (RememberTaken) and sent in
TAKEN when that origin's queue is announced again, so that it drops them instead of
delivering them twice. A queue that replicates over the cluster holds the messages it recovers
at start for ``rejoin_grace`` seconds, long enough for those TAKEN lists to arrive.

:class:`ReplicationCore` takes events (messages from peers, cluster changes, the clock, what
the logs wrote) and records actions (actions.py); its ``take_output`` also returns the output
of the queue core and of the replica cores, in an order that can be carried out as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from zbroker.pzq.core import peering, wire
from zbroker.pzq.core.actions import (
    Adopted,
    BatchResult,
    ForgetTaken,
    Log,
    OpenLog,
    RememberTaken,
    Replicate,
    Reply,
    SendCluster,
    SendStatic,
    Unreplicate,
)
from zbroker.pzq.core.fence import Fence
from zbroker.pzq.core.peering import is_node
from zbroker.pzq.core.placement import Placement
from zbroker.pzq.core.queue import QUEUE_FULL, Budget, Limits, QueueCore
from zbroker.pzq.core.records import MessageRecord

#: the routing id under which a cluster peer's copies enter a replica core (ZeroMQ never
#: makes routing ids that start with a zero byte followed by text)
CLUSTER_PEER = b"\x00peer:"
NOT_CONFIGURED = "replication is not configured on this queue"
COPIES_FULL = f"{QUEUE_FULL}: the copies held for peers count in max_backlog"
REFUSAL_LOG_INTERVAL = 60.0  # seconds between two log lines about refused replica traffic
TAKEN_KEEP = 5  # rejoin graces a list of keys taken over is kept once told (taken_told)
TAKERS_WAIT = 3  # rejoin graces a queue waits at most for the TAKEN list of a taker
#: leases after its loss in which a lost origin's copies may be taken over: until it has been
#: silent for a lease (what it sent before its loss is read first), and a tick more
TAKEOVER_WINDOW = 1.5
_NEVER = float("inf")


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


@dataclass(frozen=True)
class ReplicationSettings:
    name: str  # the queue's
    node_id: str  # the queue's node id
    replicas: int = 0
    static_peers: int = 0  # static peers copies go to (the first ``replicas`` of ``peers``)
    cluster: bool = False  # the queue is in a cluster (its peers may hold copies here)
    sources: frozenset[str] = frozenset()  # node ids whose copies are held (static peers)
    node_timeout: float = 5.0
    max_origins: int = 16
    rejoin_grace: float = 0.0
    #: in a cluster: how long an answered LEASE (asked every lease / 4) counts. An origin
    #: delivers only while a quorum of the queue's hosts has answered one it asked within
    #: the lease; a holder takes a lost origin's copies over only if such a quorum without
    #: the origin has, when it loses it. Shorter than the cluster's peer_timeout (0: no
    #: fencing)
    lease: float = 0.0


_PREFIX = len(peering.REPLICA_PREFIX)
#: what a holder is sent: a static peer's copy, DELETE or PING, or a cluster peer's
Held: TypeAlias = peering.StaticMessage | peering.Copy | peering.Delete


class ReplicationCore:
    def __init__(self, queue: QueueCore, settings: ReplicationSettings,
                 taken: dict[str, list[bytes]] | None = None):
        """``queue``: the queue's core (its budget is shared with the replica cores);
        ``taken``: the keys taken over from each origin, as kept from before a restart."""
        s = self.settings = settings
        self.queue = queue
        self.node_id = s.node_id
        self._qname = s.name.encode()
        self.placement = (Placement(s.node_id, s.replicas)
                          if s.replicas and not s.static_peers else None)
        if self.placement is not None:
            queue.replica_targets = 0  # until peers of the cluster host this queue
        limits = queue.limits
        # the ids of a replica core are the keys of the copies it holds (dropped with them):
        # bounded by the backlog, never evicted while the copy is here
        self.replica_limits: Limits = dataclasses.replace(
            limits, replicas=0, idempotence_window=limits.max_messages,
            idempotence_bytes=1 << 62)
        self.origins: dict[str, Origin] = {}
        #: the keys whose copies were taken over from each origin and are written in our
        #: queue (told to that origin when it is back: TAKEN)
        self.taken: dict[str, list[bytes]] = dict(taken or {})
        #: when each origin was last told its whole list: kept (and told again at each of
        #: its returns) for TAKEN_KEEP rejoin graces more, since its drops are not on its
        #: disk at once, and a crash meanwhile brings them back
        self.taken_told: dict[str, float] = {}
        #: the fence (cluster only: fence.py); who took whose copies over, as the takers
        #: said (TOOK): origin node id -> {taker node id: when}, told to the origin when it
        #: is back (TAKERS), kept as taken lists are
        self.fence = Fence(s.lease if s.cluster else 0.0, TAKERS_WAIT * s.rejoin_grace)
        self.takers: dict[str, dict[str, float]] = {}
        self._recopy_owed = False  # the backlog was not re-copied to a new holder (waiting)
        self._next_lease = _NEVER
        self.out: list[Any] = []
        self.taken_over = 0
        self.refused = 0  # replica messages refused (not accepted, too many origins)
        self._refusal_logged = -REFUSAL_LOG_INTERVAL
        self._next_housekeeping = _NEVER
        self._release_at = _NEVER
        self._last_reap = 0.0  # when the queue's ACK timeouts were last looked at

    @property
    def budget(self) -> Budget:
        return self.queue.budget

    # --- start ------------------------------------------------------------------------------

    def restore(self, node_id: str, messages: list[MessageRecord], next_seq: int,
                now: float) -> bool:
        """The log of ``node_id``'s copies, found at start. False: it is empty and that node
        is not accepted any more (the caller removes it); its copies are held otherwise."""
        core = self._replica_core(node_id)
        core.recover(messages, next_seq)
        if not messages and not self.accepts(node_id):
            return False
        self.origins[node_id] = Origin(node_id, core, now)
        # copies taken over and written in our queue before a crash kept them here too
        for key in self.taken.get(node_id, ()):
            if key in core.ids:
                core.remove_by_id(key)
        return True

    def started(self, now: float) -> None:
        """The queue serves from ``now`` (after ``restore`` of every replica log)."""
        if self.settings.static_peers or self.origins:
            self._next_housekeeping = now
        if self.settings.lease and self.settings.cluster:
            self._next_lease = now
        if self.queue.held:
            self._release_at = now + self.settings.rejoin_grace

    def accepts(self, node_id: str) -> bool:
        """Copies from ``node_id`` may be held here: it is a replica source, or this queue is
        in a cluster (whose peers are the cluster's to admit)."""
        return node_id in self.settings.sources or self.settings.cluster

    def log_core(self, log: str | None) -> QueueCore | None:
        """The core whose log is ``log`` (None: the queue's)."""
        if log is None:
            return self.queue
        origin = self.origins.get(log)
        return origin.core if origin is not None else None

    # --- output -----------------------------------------------------------------------------

    def take_output(self) -> list[Any]:
        """Every action recorded since the last call: this core's, then the replica cores',
        then the queue core's (a replica log is opened before it is written to)."""
        queue = self.queue
        if queue.replication_out:
            self._from_queue()
        if not self.out and not self.origins:
            return queue.take_output()
        out, self.out = self.out, []
        for origin in self.origins.values():
            if origin.core.out:
                self._holder_output(origin.core.take_output(), out)
        out += queue.take_output()
        return out

    def _from_queue(self) -> None:
        """What the queue core asked of replication: copies and deletes for the peers, and
        the copies it has taken over and written."""
        sends: list[Replicate | Unreplicate] = []
        taken: dict[str, list[bytes]] = {}
        for a in self.queue.take_replication():
            if type(a) is Adopted:
                self._adopted(a, taken)
            else:
                sends.append(a)
        for node_id, keys in taken.items():
            # remembered before the copies leave the replica log (the actions run in order)
            self.taken.setdefault(node_id, []).extend(keys)
            self.taken_told.pop(node_id, None)  # (not all told now)
            self.out.append(RememberTaken(node_id, keys))
        if not sends:
            return
        placement = self.placement
        if placement is not None:
            self._send_to_holders(placement, sends)
        elif self.settings.static_peers:
            node_id = self.node_id
            for a in sends:
                self.out.append(SendStatic(
                    peering.ReplicaCopy(node_id, a.key, a.body) if type(a) is Replicate
                    else peering.ReplicaDelete(node_id, a.key)))

    def _adopted(self, a: Adopted, taken: dict[str, list[bytes]]) -> None:
        """A copy taken over is written in our queue (or its write failed): only now may it
        leave the replica log, and only now is its key told to its origin as taken (TAKEN),
        so that the origin drops it. Remembered any sooner, a crash before the write would
        make the origin drop a message that no log holds any more."""
        node_id, key = a.token
        origin = self.origins.get(node_id)
        if origin is None:
            return
        if not a.ok:  # still in the replica log: taken over again later (tick)
            origin.taken_over = False
            origin.life = None
            origin.last_seen = -_NEVER
            origin.retry = True
            return
        origin.core.remove_by_id(key)
        if a.claim and self.settings.cluster and b"\n" not in key:
            taken.setdefault(node_id, []).append(key)

    def _holder_output(self, actions: list[Any], out: list[Any]) -> None:
        """A replica core's output: its log actions as they are; its answers to a static
        peer on the receive endpoint, to a cluster peer as CONFIRM."""
        confirms: dict[tuple[bytes, bytes], list[bytes]] = {}
        for a in actions:
            if type(a) is not Reply:
                out.append(a)
            elif not a.peer.startswith(CLUSTER_PEER):
                out.append(a)
            else:
                confirms.setdefault((a.peer, a.frames[1]), []).append(a.frames[0])
        for (peer, status), keys in confirms.items():
            life = peer[len(CLUSTER_PEER):].decode()
            for chunk in peering.key_chunks(keys):
                out.append(SendCluster(life, peering.Confirm(self._qname, status == wire.OK,
                                                             chunk)))

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self.out.append(Log(level, event, {"queue": self.settings.name, **fields}))

    # --- the origin side ----------------------------------------------------------------------

    def answer(self, frames: Sequence[Any]) -> None:
        """A static peer's answer to a copy."""
        a = peering.decode_answer(frames)
        if a is not None:
            self.queue.replica_confirmed(a.key, a.ok)

    def _send_to_holders(self, placement: Placement,
                         sends: list[Replicate | Unreplicate]) -> None:
        copies = [(a.key, a.body) for a in sends if type(a) is Replicate]
        deleted = [a.key for a in sends if type(a) is Unreplicate]
        # copies first: a key copied and ACKed within one turn is then deleted after its copy
        messages: list[Any] = [*peering.copies(self._qname, self.node_id, copies)]
        messages += [peering.Delete(self._qname, self.node_id, chunk)
                     for chunk in peering.key_chunks(deleted)]
        for key in deleted:
            placement.forget(key)
        for life in placement.holders:
            for msg in messages:
                self.out.append(SendCluster(life, msg))
        if placement.recopies:
            self._pump_recopies(placement)

    def _pump_recopies(self, placement: Placement) -> None:
        """Send the next part of each new holder's re-copy (a window at a time)."""
        queue = self.queue
        for life, r in list(placement.recopies.items()):
            while True:
                keys = r.next_keys()
                if not keys:
                    break
                items = []
                for key in keys:
                    seq = queue.keys.get(key)
                    m = queue.messages.get(seq) if seq is not None else None
                    if m is None:  # ACKed meanwhile
                        r.confirmed(key)
                    else:
                        items.append((key, m.frames))
                for msg in peering.copies(self._qname, self.node_id, items):
                    self.out.append(SendCluster(life, msg, recopy=True))
            if r.done:
                placement.recopies.pop(life, None)

    def peer_unreachable(self, life: str) -> None:
        """A message of a re-copy could not be sent to ``life``: it is lost (peer_gone
        replaces it); nothing more goes to it."""
        if self.placement is not None:
            self.placement.recopies.pop(life, None)

    def _holders_added(self, placement: Placement, added: list[str]) -> None:
        self.queue.replica_targets = len(placement)
        for life in added:
            r = placement.recopies.get(life)
            self._log("info", "pzq replica holder chosen", peer=life, holders=len(placement),
                      recopy=len(r.todo) if r else 0)
        if added:
            self._pump_recopies(placement)

    def _backlog_keys(self) -> list[bytes]:
        """What a new holder is to get a copy of: the messages not yet ACKed, none while a
        peer that may have taken them over has not said which (a second holder would hold
        copies of messages the first delivers, and take them over in turn); they go once
        it has (_recopy_owed)."""
        if self.fence.awaiting or self.fence.waiting_takers:
            self._recopy_owed = True
            return []
        return [m.key for m in self.queue.messages.values()]

    # --- the cluster --------------------------------------------------------------------------

    def peer_hosts(self, life: str, node_id: str, now: float) -> None:
        """A peer of the cluster (one life) hosts a queue of this name, whose node id is
        ``node_id``: a candidate holder of our copies, maybe an origin of copies we hold."""
        if not is_node(node_id) or node_id == self.node_id:
            return
        origin = self.origins.get(node_id)
        if origin is not None:  # from now on its liveness is that life's
            origin.life, origin.last_seen, origin.taken_over = life, now, False
            origin.lost_at = None
            origin.stale = {m.msg_id for m in origin.core.messages.values()}
        if self.settings.cluster:
            self._told_taken(life, node_id, now)
            # first: copies it holds from before are stale
            self.out.append(SendCluster(life, peering.Release(self._qname, self.node_id)))
            self.fence.joined(life, node_id, now)  # its TAKEN list (maybe empty) is owed
            if self.settings.lease:
                self.out.append(SendCluster(life, self._lease(now)))
                self._fence(now)
        placement = self.placement
        if placement is not None:
            self._from_queue()  # what is pending goes to the holders of before
            self._holders_added(placement, placement.available(life, node_id,
                                                               self._backlog_keys()))

    def _told_taken(self, life: str, node_id: str, now: float) -> None:
        """Tell a queue that is back which of its messages we took over (TAKEN), then that
        the list is over (a TAKEN without keys): it delivers nothing before that."""
        taken = self.taken.get(node_id)
        if taken:
            for chunk in peering.key_chunks(taken, peering.TAKEN_BATCH):
                self.out.append(SendCluster(life, peering.Taken(self._qname, node_id, chunk)))
            if self.settings.lease:
                self.taken_told[node_id] = now
            else:
                self._forget_taken(node_id)
            self._log("info", "pzq told a returning queue what was delivered in its absence",
                      node=node_id, messages=len(taken))
        takers = self.takers.get(node_id)
        if takers:
            names = list(takers)[-peering.MAX_TAKERS:]
            self.out.append(SendCluster(life, peering.Takers(self._qname, node_id, names)))
        self.out.append(SendCluster(life, peering.Taken(self._qname, node_id, [])))

    def _forget_taken(self, node_id: str) -> None:
        self.taken.pop(node_id, None)
        self.taken_told.pop(node_id, None)
        self.out.append(ForgetTaken(node_id))

    # --- the fence ----------------------------------------------------------------------------

    def _lease(self, now: float) -> peering.Lease:
        return peering.Lease(self._qname, self.node_id, repr(now).encode())

    def _fence(self, now: float) -> None:
        """Until when our queue may deliver (fence.py), said to the queue core; what the
        fence owes us when it is lifted (the backlog's copies)."""
        if not self.settings.lease or not self.settings.cluster:
            return
        fence = self.fence
        until = fence.quorum_until(now)
        quorum = until > now
        if quorum != fence.quorum:
            fence.quorum = quorum
            if not quorum and self.placement is not None:
                fence.fenced(self.placement.holders, now)
            if quorum:
                self._log("info", "pzq queue delivers again: a quorum of its hosts answers",
                          **fence.counts(now))
            else:
                self._log("warning", "pzq queue fenced: no quorum of its hosts answers within "
                          "the lease, its copies may be taken over", lease=fence.lease,
                          **fence.counts(now))
        if fence.waiting(now):
            until = now  # a TAKEN list first
        self.queue.deliver_until = until
        if self._recopy_owed and not fence.awaiting and not fence.waiting_takers \
                and self.placement is not None:
            self._recopy_owed = False
            backlog = self._backlog_keys()
            if self.placement.recopy_to_holders(backlog) and backlog:
                self._log("info", "pzq backlog copied to the holders: the peers that took "
                          "messages over have said which", messages=len(backlog))
                self._pump_recopies(self.placement)

    def peer_gone(self, life: str, now: float, now_us: int) -> None:
        """A peer of the cluster left (or was lost): replace it as a holder of our copies;
        deliver the copies we hold for it if a quorum without it answers our LEASEs (else it
        may still deliver them; they wait for its return, and its RELEASE)."""
        self.fence.left(life)
        self._fence(now)
        placement = self.placement
        if placement is not None:
            was = life in placement.holders
            self._from_queue()
            self._holders_added(placement, placement.gone(life, self._backlog_keys()))
            if was:
                self._log("warning", "pzq replica holder lost", peer=life,
                          holders=len(placement))
        for origin in self.origins.values():
            if origin.life == life and not origin.taken_over and origin.current():
                origin.lost_at = now
        self._take_over_lost(now, now_us)

    def _take_over_lost(self, now: float, now_us: int) -> None:
        """Take over the copies of the origins whose life ended, once a quorum without the
        origin answers us and nothing came from it for a lease: a life also ends when the
        origin ended it (it was alive and heard us not: we were paused, or cut off), and
        what it sent before comes first. Not taken over within TAKEOVER_WINDOW leases of the
        loss, they wait for the origin's return (its RELEASE)."""
        lease = self.settings.lease
        fence = self.fence
        for origin in self.origins.values():
            lost = origin.lost_at
            if lost is None or origin.taken_over or not origin.current():
                origin.lost_at = None
                continue
            node_id = origin.node_id
            if now - lost > TAKEOVER_WINDOW * lease:
                # (a quorum found later is of a holder that was itself cut off or paused:
                # the origin went on meanwhile, maybe with another holder)
                origin.lost_at = None
                self._log("warning", "pzq replica origin lost, its copies kept: no quorum "
                          "of the queue's hosts answers us without it, or it was heard "
                          "meanwhile", node=node_id, copies=len(origin.core.messages),
                          **fence.counts(now, node_id))
            elif fence.quorum_without(node_id, now) and fence.silent(node_id, now):
                origin.lost_at = None
                self._take_over(origin, now_us)

    def cluster_message(self, life: str, frames: Sequence[Any], now: float,
                        now_us: int) -> bool:
        """A message of the cluster channel for this queue (its kind and queue name first).
        False if it is malformed, or not meant for this queue."""
        msg = peering.decode(frames)
        peer = CLUSTER_PEER + life.encode()
        self.fence.heard(life, now)
        # (type() again in each test, not once in a name: mypy narrows only the former;
        # COPY, the common one, is tested first)
        if type(msg) is peering.Copy:
            for key, body in msg.items:
                self._hold(msg, msg.node_id, peer, key, body, now, now_us)
        elif type(msg) is peering.Delete:
            for key in msg.keys:
                self._hold(msg, msg.node_id, peer, key, (), now, now_us)
        elif type(msg) is peering.Confirm:
            placement = self.placement
            for key in msg.keys:
                self.queue.replica_confirmed(key, msg.ok)
                if placement is not None:
                    placement.confirmed(life, key)
            if placement is not None and placement.recopies:
                self._pump_recopies(placement)
        elif type(msg) is peering.Release:
            dropped = self._release(msg.node_id)
            if dropped:
                self._log("info", "pzq stale copies dropped", node=msg.node_id, copies=dropped)
        elif type(msg) is peering.Taken:
            if msg.node_id != self.node_id:
                return False
            if not msg.keys:  # the list is over
                self.fence.list_ended(life)
                self._fence(now)
                return True
            dropped = sum(self.queue.taken_back(key) for key in msg.keys)
            self._log("info", "pzq messages delivered by a peer in our absence dropped",
                      peer=life, dropped=dropped, listed=len(msg.keys))
        elif type(msg) is peering.Took:
            taker = self.fence.hosts.get(life)
            if taker is None or msg.node_id == taker:
                return True
            self.takers.setdefault(msg.node_id, {})[taker] = now
            origin_life = next((k for k, v in self.fence.hosts.items() if v == msg.node_id),
                               None)
            if origin_life is not None:  # it is alive to us: it stops delivering at once
                self.out.append(SendCluster(origin_life, peering.Takers(
                    self._qname, msg.node_id, [taker])))
        elif type(msg) is peering.Takers:
            if msg.node_id != self.node_id:
                return False
            self.fence.told_takers(msg.takers, self.node_id, now)
            self._log("warning", "pzq queue waits for the peers that took its copies over",
                      takers=msg.takers, waiting=len(self.fence.waiting_takers))
            self._fence(now)
        elif type(msg) is peering.Lease:
            if life not in self.fence.hosts:
                return True  # (before its QUEUES, or after its life)
            if not msg.answer:
                self.out.append(SendCluster(life, dataclasses.replace(
                    msg, node_id=self.node_id, answer=True)))
                return True
            try:
                asked = float(msg.stamp)
            except ValueError:
                return False
            self.fence.answer(life, asked, now)
            self._fence(now)
        else:
            return False
        return True

    # --- the holder side ----------------------------------------------------------------------

    def received(self, items: Iterable[tuple[bytes, list[Any], str | None]], now: float,
                 now_us: int) -> None:
        """What came on the receive endpoint, in order: (routing id, frames, why it was
        refused or None). Producers' messages and batches go to the queue, static peers'
        (a REPLICA header) to :meth:`receive`."""
        queue = self.queue
        for peer, frames, refused in items:
            if refused is not None:
                queue.refuse(peer, frames[0][:wire.MAX_ID], refused)
            elif len(frames) > 1 and frames[1] == wire.BATCH_HEADER:
                queue.produce_batch(peer, frames, now_us, now)
            elif len(frames) > 2 and frames[1][:_PREFIX] == peering.REPLICA_PREFIX:
                self.receive(peer, frames, now, now_us)
            else:
                queue.produce(peer, frames, now_us, now)

    def receive(self, peer: bytes, frames: list[Any], now: float, now_us: int) -> None:
        """A message on the receive endpoint whose header starts with REPLICA (``frames``
        after the routing id): a static peer's, or else an ordinary producer's."""
        msg = peering.decode_replica(frames)
        if msg is None:  # a REPLICA header we do not know, or no delimiter: a producer's
            self.queue.produce(peer, frames, now_us, now)
            return
        node_id = msg.node_id
        if node_id == self.node_id:
            return  # our own copy came back (a peer list that names us)
        sources = self.settings.sources
        if node_id not in sources:  # creates nothing; only a copy is answered (as a producer)
            self._refuse(msg, peer, frames[0],
                         NOT_CONFIGURED if not sources else not_accepted(node_id), now)
            return
        body = msg.body if type(msg) is peering.ReplicaCopy else ()
        self._hold(msg, node_id, peer, bytes(frames[0]), body, now, now_us)

    def _hold(self, msg: Held, node_id: str, peer: bytes, key: bytes, body: Sequence[Any],
              now: float, now_us: int) -> None:
        """A copy of another queue's message (or its DELETE, or that queue's PING)."""
        if node_id == self.node_id:
            return  # our own copy came back (a peer list that names us)
        copy = type(msg) in (peering.ReplicaCopy, peering.Copy)
        origin = self.origins.get(node_id)
        if origin is None:
            if not copy:
                return
            if len(self.origins) >= self.settings.max_origins:
                self._refuse(msg, peer, key, too_many_origins(self.settings.max_origins), now)
                return
            origin = self.origins[node_id] = Origin(node_id, self._replica_core(node_id), now)
            self.out.append(OpenLog(node_id))
            if self._next_housekeeping == _NEVER:  # watch origins
                self._next_housekeeping = now + self.settings.node_timeout / 4
        origin.last_seen = now
        if peer.startswith(CLUSTER_PEER):
            origin.life = peer[len(CLUSTER_PEER):].decode()
        if origin.taken_over:
            origin.taken_over = False  # it is back: a new life for its copies
            self.out.append(Log("info", "pzq replica origin is back", {"node": node_id}))
        if copy:
            origin.core.produce(peer, [key, b"", *body], now_us)
            if origin.stale:
                origin.stale.discard(key)
        elif type(msg) in (peering.ReplicaDelete, peering.Delete):
            origin.core.remove_by_id(key)

    def _refuse(self, msg: Held, peer: bytes, key: bytes, reason: str, now: float) -> None:
        self.refused += 1
        if type(msg) in (peering.ReplicaCopy, peering.Copy):
            answer = wire.producer_ack(bytes(key[:wire.MAX_ID]), False, reason)
            self._holder_output([Reply(peer, answer)], self.out)
        if now - self._refusal_logged >= REFUSAL_LOG_INTERVAL:
            self._refusal_logged = now
            self._log("warning", "pzq replica traffic refused", reason=reason,
                      refused=self.refused)

    def _replica_core(self, node_id: str) -> QueueCore:
        return QueueCore(self.replica_limits, budget=self.queue.budget,
                         full_reason=COPIES_FULL, log=node_id)

    def replica_batch_done(self, node_id: str, result: BatchResult) -> None:
        origin = self.origins.get(node_id)
        if origin is not None:
            origin.core.batch_done(result)

    def _release(self, node_id: str) -> int:
        """Drop every copy held for ``node_id`` (its queue no longer counts on them)."""
        origin = self.origins.get(node_id)
        if origin is None:
            return 0
        ids = [m.msg_id for m in origin.core.messages.values()]
        for msg_id in ids:
            origin.core.remove_by_id(msg_id)
        origin.stale = set()
        return len(ids)

    def _take_over(self, origin: Origin, now_us: int) -> None:
        """Move the copies of a lost origin into the queue; each copy is dropped from the
        replica log once the queue has written it (Adopted)."""
        origin.taken_over = True
        messages = origin.current() if self.settings.cluster else list(
            origin.core.messages.values())
        for m in messages:
            self.queue.adopt(b"replica:" + m.msg_id, m.frames, now_us,
                             (origin.node_id, m.msg_id), copy_key=m.msg_id)
        self.taken_over += len(messages)
        if self.settings.cluster:  # so that the origin, told on its return, waits for us
            took = peering.Took(self._qname, origin.node_id)
            for life, node_id in self.fence.hosts.items():
                if node_id != origin.node_id:
                    self.out.append(SendCluster(life, took))
        self._log("warning", "pzq replica origin lost: its messages taken over",
                  node=origin.node_id, messages=len(messages), taken_over=self.taken_over,
                  collapse=False)

    # --- the clock --------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        at = min(self._next_housekeeping, self._release_at, self._next_lease)
        replication = self.queue.next_replication_deadline()
        if replication is not None:
            at = min(at, replication)
        return None if at == _NEVER else at

    def next_wakeup(self, reaper_frequency: float) -> float | None:
        """When the clock is next needed (:meth:`wakeup`): the first of this core's deadlines
        and the queue's ACK timeouts, those looked at every ``reaper_frequency`` at most."""
        at = self.next_deadline()
        due = self.queue.next_deadline()
        if due is not None:
            due = max(due, self._last_reap + reaper_frequency)
            at = due if at is None else min(at, due)
        return at

    def wakeup(self, now: float, now_us: int) -> list[int]:
        """The clock: :meth:`tick`, and the queue's ACK timeouts; the seqs that timed out."""
        due = self.queue.next_deadline()
        if due is not None and due <= now:
            self._last_reap = now
        self.tick(now, now_us)
        return self.queue.tick(now)

    def tick(self, now: float, now_us: int) -> None:
        """Every node_timeout / 4: tell static peers we are alive, take over the copies of
        static origins silent for node_timeout. Release the recovered messages held at start
        when the rejoin grace is over."""
        if now >= self._release_at:
            self._release_at = _NEVER
            n = self.queue.release_held()
            self._log("info", "pzq recovered messages released to consumers", messages=n,
                      taken_back=self.queue.counters["taken_back"])
        if now >= self._next_lease:
            self._next_lease = now + self.settings.lease / 4
            lease = self._lease(now)
            for life in self.fence.hosts:
                self.out.append(SendCluster(life, lease))
            self._fence(now)
            self._take_over_lost(now, now_us)
            keep = TAKEN_KEEP * max(self.settings.rejoin_grace, self.settings.lease)
            for node_id in [n for n, t in self.taken_told.items() if now - t > keep]:
                self._forget_taken(node_id)
            for node_id, takers in list(self.takers.items()):
                for taker in [n for n, t in takers.items() if now - t > keep]:
                    del takers[taker]
                if not takers:
                    del self.takers[node_id]
        if now < self._next_housekeeping:
            return
        s = self.settings
        self._next_housekeeping = now + s.node_timeout / 4
        if s.static_peers:
            self.out.append(SendStatic(peering.ReplicaPing(self.node_id)))
        # (copies of a cluster origin found at our start may be stale: it went on with
        # another holder while we were away; they wait for its return and its RELEASE)
        for origin in [o for o in self.origins.values()
                       if o.life is None and not o.taken_over and o.core.messages
                       and now - o.last_seen > s.node_timeout
                       and (not s.cluster
                            or o.retry and self.fence.quorum_without(o.node_id, now))]:
            origin.retry = False
            self._take_over(origin, now_us)

    def counters(self) -> dict[str, int]:
        out = {"replica_origins": len(self.origins),
               "replicas_held": sum(len(o.core.messages) for o in self.origins.values()),
               "replicas_taken_over": self.taken_over,
               "replicas_refused": self.refused}
        placement = self.placement
        if placement is not None:
            out.update(replica_holders=len(placement), held_recovered=len(self.queue.held),
                       # ^ recovered messages not delivered yet: peers may still say they did
                       recopy_backlog=sum(len(r.todo) + len(r.sent)
                                          for r in placement.recopies.values()))
        return out
