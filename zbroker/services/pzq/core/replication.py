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
of the queue core and of the replica cores, in an order that can be carried out as it is. It
holds the parts, which return their actions and never call it: the holders of our copies
over the cluster (holders.py), the origins we hold copies for (origins.py), the taken lists
(taken.py) and the fence (fence.py); the lease, the clock and the cluster channel's
dispatch are its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pzq import wire
from zbroker.services.pzq.core import peering
from zbroker.services.pzq.core.actions import (
    Adopted,
    BatchResult,
    Log,
    Replicate,
    SendCluster,
    SendStatic,
    Unreplicate,
)
from zbroker.services.pzq.core.fence import Fence
from zbroker.services.pzq.core.holders import Holders
from zbroker.services.pzq.core.origins import (
    CLUSTER_PEER,
    NOT_CONFIGURED,
    Held,
    Origin,
    Origins,
    not_accepted,
)
from zbroker.services.pzq.core.peering import is_node
from zbroker.services.pzq.core.placement import Placement
from zbroker.services.pzq.core.queue import Budget, QueueCore
from zbroker.services.pzq.core.records import MessageRecord
from zbroker.services.pzq.core.taken import TAKEN_KEEP, TakenLists

__all__ = ["NOT_CONFIGURED", "ReplicationCore", "ReplicationSettings"]

TAKERS_WAIT = 3  # rejoin graces a queue waits at most for the TAKEN list of a taker
_NEVER = float("inf")


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


class ReplicationCore:
    def __init__(self, queue: QueueCore, settings: ReplicationSettings,
                 taken: dict[str, list[bytes]] | None = None):
        """``queue``: the queue's core (its budget is shared with the replica cores);
        ``taken``: the keys taken over from each origin, as kept from before a restart."""
        s = self.settings = settings
        self.queue = queue
        self.node_id = s.node_id
        self._qname = s.name.encode()
        # the parts
        self.holders = (Holders(s.name, s.node_id, s.replicas, queue.messages, queue.keys)
                        if s.replicas and not s.static_peers else None)
        if self.holders is not None:
            queue.replica_targets = 0  # until peers of the cluster host this queue
        self.holding = Origins(s.name, s.node_id, queue.limits, queue.budget, s.sources,
                               s.cluster, s.max_origins)
        self.taken_lists = TakenLists(s.name, bool(s.lease), taken)
        #: the fence (cluster only: fence.py)
        self.fence = Fence(s.lease if s.cluster else 0.0, TAKERS_WAIT * s.rejoin_grace)
        self._next_lease = _NEVER
        self.out: list[Any] = []
        self._next_housekeeping = _NEVER
        self._release_at = _NEVER
        self._last_reap = 0.0  # when the queue's ACK timeouts were last looked at

    # what tests and the monitor read of the parts
    @property
    def budget(self) -> Budget:
        return self.queue.budget

    @property
    def placement(self) -> Placement | None:
        return self.holders.placement if self.holders is not None else None

    @property
    def origins(self) -> dict[str, Origin]:
        return self.holding.origins

    @property
    def taken_over(self) -> int:
        return self.holding.taken_over

    @property
    def refused(self) -> int:
        return self.holding.refused

    @property
    def taken(self) -> dict[str, list[bytes]]:
        return self.taken_lists.taken

    @property
    def takers(self) -> dict[str, dict[str, float]]:
        return self.taken_lists.takers

    # --- start ------------------------------------------------------------------------------

    def restore(self, node_id: str, messages: list[MessageRecord], next_seq: int,
                now: float) -> bool:
        """The log of ``node_id``'s copies, found at start. False: it is empty and that node
        is not accepted any more (the caller removes it); its copies are held otherwise."""
        return self.holding.restore(node_id, messages, next_seq, now,
                                    self.taken_lists.taken.get(node_id, ()))

    def started(self, now: float) -> None:
        """The queue serves from ``now`` (after ``restore`` of every replica log)."""
        if self.settings.static_peers or self.holding.origins:
            self._next_housekeeping = now
        if self.settings.lease and self.settings.cluster:
            self._next_lease = now
        if self.queue.held:
            self._release_at = now + self.settings.rejoin_grace

    def accepts(self, node_id: str) -> bool:
        """Copies from ``node_id`` may be held here (Origins.accepts)."""
        return self.holding.accepts(node_id)

    def log_core(self, log: str | None) -> QueueCore | None:
        """The core whose log is ``log`` (None: the queue's)."""
        if log is None:
            return self.queue
        origin = self.holding.origins.get(log)
        return origin.core if origin is not None else None

    # --- output -----------------------------------------------------------------------------

    def take_output(self) -> list[Any]:
        """Every action recorded since the last call: this core's, then the replica cores',
        then the queue core's (a replica log is opened before it is written to)."""
        queue = self.queue
        if queue.replication_out:
            self._from_queue()
        if not self.out and not self.holding.origins:
            return queue.take_output()
        out, self.out = self.out, []
        out += self.holding.output()
        out += queue.take_output()
        return out

    def _from_queue(self) -> None:
        """What the queue core asked of replication: copies and deletes for the peers, and
        the copies it has taken over and written."""
        sends: list[Replicate | Unreplicate] = []
        taken: dict[str, list[bytes]] = {}
        for a in self.queue.take_replication():
            if type(a) is Adopted:
                claimed = self.holding.adopted(a)
                if claimed is not None:
                    taken.setdefault(claimed[0], []).append(claimed[1])
            else:
                sends.append(a)
        # remembered before the copies leave the replica log (the actions run in order)
        self.out += self.taken_lists.remember(taken)
        for node_id, keys in taken.items():
            # its queue is back already (a new life), and was told its list without these
            life = self.fence.life_of(node_id)
            if life is not None:
                self.out += self.taken_lists.tell_written(life, node_id, keys)
        if not sends:
            return
        if self.holders is not None:
            self.out += self.holders.send(sends)
        elif self.settings.static_peers:
            node_id = self.node_id
            for a in sends:
                self.out.append(SendStatic(
                    peering.ReplicaCopy(node_id, a.key, a.body) if type(a) is Replicate
                    else peering.ReplicaDelete(node_id, a.key)))

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self.out.append(Log(level, event, {"queue": self.settings.name, **fields}))

    # --- the origin side ----------------------------------------------------------------------

    def answer(self, frames: Sequence[Any]) -> None:
        """A static peer's answer to a copy."""
        a = peering.decode_answer(frames)
        if a is not None:
            self.queue.replica_confirmed(a.key, a.ok)

    def peer_unreachable(self, life: str) -> None:
        """A message of a re-copy could not be sent to ``life``: it is lost (peer_gone
        replaces it); nothing more goes to it."""
        if self.holders is not None:
            self.holders.unreachable(life)

    # --- the cluster --------------------------------------------------------------------------

    def peer_hosts(self, life: str, node_id: str, now: float) -> None:
        """A peer of the cluster (one life) hosts a queue of this name, whose node id is
        ``node_id``: a candidate holder of our copies, maybe an origin of copies we hold."""
        if not is_node(node_id) or node_id == self.node_id:
            return
        self.holding.hosted(node_id, life, now)
        if self.settings.cluster:
            self.out += self.taken_lists.tell(life, node_id, now)
            # first: copies it holds from before are stale
            self.out.append(SendCluster(life, peering.Release(self._qname, self.node_id)))
            self.fence.joined(life, node_id, now)  # its TAKEN list (maybe empty) is owed
            if self.settings.lease:
                self.out.append(SendCluster(life, self._lease(now)))
                self._fence(now)
        holders = self.holders
        if holders is not None:
            self._from_queue()  # what is pending goes to the holders of before
            self.out += holders.available(life, node_id, self.fence)
            self.queue.replica_targets = len(holders)

    def peer_gone(self, life: str, now: float, now_us: int, alive: bool = False) -> None:
        """A peer of the cluster left (or was lost): replace it as a holder of our copies;
        deliver the copies we hold for it if a quorum without it answers our LEASEs (else it
        may still deliver them; they wait for its return, and its RELEASE). ``alive``: the
        peer ended the life itself and runs on (the cluster's Left.alive): it had lost us,
        and the copies we hold for it are stale; they wait for its RELEASE."""
        node_id = self.fence.hosts.get(life)
        self.fence.left(life)
        # (a quorum found lost now was lost with this life at the latest: if it held our
        # copies, it is one of the holders that may take them over)
        self._fence(now, gone=(life, node_id) if node_id is not None else None)
        holders = self.holders
        if holders is not None:
            self._from_queue()
            self.out += holders.gone(life, self.fence)
            self.queue.replica_targets = len(holders)
        self.out += self.holding.life_ended(life, now, alive)
        self._take_over_lost(now, now_us)

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
            for key in msg.keys:
                self.queue.replica_confirmed(key, msg.ok)
            if self.holders is not None:
                self.out += self.holders.confirmed(life, msg.keys)
        elif type(msg) is peering.Release:
            dropped = self.holding.release(msg.node_id)
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
            self._took(life, msg.node_id, now)
        elif type(msg) is peering.Takers:
            if msg.node_id != self.node_id:
                return False
            self.fence.told_takers(msg.takers, self.node_id, now)
            self._log("warning", "pzq queue waits for the peers that took its copies over",
                      takers=msg.takers, waiting=len(self.fence.waiting_takers))
            self._fence(now)
        elif type(msg) is peering.Lease:
            return self._leased(life, msg, now)
        else:
            return False
        return True

    def _took(self, life: str, origin: str, now: float) -> None:
        """``life`` took ``origin``'s copies over (TOOK): if the origin is alive to us, it
        stops delivering at once (TAKERS)."""
        taker = self.fence.hosts.get(life)
        if taker is None or origin == taker:
            return
        self.taken_lists.took(origin, taker, now)
        origin_life = self.fence.life_of(origin)
        if origin_life is not None:
            self.out.append(SendCluster(origin_life, peering.Takers(
                self._qname, origin, [taker])))

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
            self.out += self.holding.refuse(
                msg, peer, frames[0], NOT_CONFIGURED if not sources else not_accepted(node_id),
                now)
            return
        body = msg.body if type(msg) is peering.ReplicaCopy else ()
        self._hold(msg, node_id, peer, bytes(frames[0]), body, now, now_us)

    def _hold(self, msg: Held, node_id: str, peer: bytes, key: bytes, body: Sequence[Any],
              now: float, now_us: int) -> None:
        """A copy of another queue's message (or its DELETE, or that queue's PING)."""
        origins = len(self.holding.origins)
        self.out += self.holding.hold(msg, node_id, peer, key, body, now, now_us)
        if len(self.holding.origins) > origins and self._next_housekeeping == _NEVER:
            self._next_housekeeping = now + self.settings.node_timeout / 4  # watch origins

    def replica_batch_done(self, node_id: str, result: BatchResult) -> None:
        self.holding.batch_done(node_id, result)

    def _take_over(self, origin: Origin, now_us: int) -> None:
        """Move the copies of a lost origin into the queue; each copy is dropped from the
        replica log once the queue has written it (Adopted)."""
        messages = self.holding.taking_over(origin)
        for m in messages:
            self.queue.adopt(b"replica:" + m.msg_id, m.frames, now_us,
                             (origin.node_id, m.msg_id), copy_key=m.msg_id)
        if self.settings.cluster:  # so that the origin, told on its return, waits for us
            took = peering.Took(self._qname, origin.node_id)
            for life, node_id in self.fence.hosts.items():
                if node_id != origin.node_id:
                    self.out.append(SendCluster(life, took))
        self._log("warning", "pzq replica origin lost: its messages taken over",
                  node=origin.node_id, messages=len(messages),
                  taken_over=self.holding.taken_over, collapse=False)

    def _take_over_lost(self, now: float, now_us: int) -> None:
        """Take over the copies of the origins whose life ended, once the fence allows it
        (Origins.lost)."""
        for due in self.holding.lost(now, self.settings.lease, self.fence):
            if isinstance(due, Origin):
                self._take_over(due, now_us)
            else:
                self.out.append(due)

    # --- the fence ----------------------------------------------------------------------------

    def _lease(self, now: float) -> peering.Lease:
        return peering.Lease(self._qname, self.node_id, repr(now).encode())

    def _leased(self, life: str, msg: peering.Lease, now: float) -> bool:
        """A LEASE asked by a host (answered at once), or the answer to ours."""
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
        return True

    def _fence(self, now: float, gone: tuple[str, str] | None = None) -> None:
        """Until when our queue may deliver (fence.py), said to the queue core; what the
        fence owes us when it is lifted (the backlog's copies). ``gone``: the peer life (and
        its node id) that has just ended, if that is why we look."""
        if not self.settings.lease or not self.settings.cluster:
            return
        fence = self.fence
        until = fence.quorum_until(now)
        quorum = until > now
        if quorum != fence.quorum:
            fence.quorum = quorum
            if not quorum and self.holders is not None:
                fence.fenced(self.holders.placement.holders, now, gone)
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
        if self.holders is not None:
            self.out += self.holders.fence_lifted(fence)

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
        s = self.settings
        if now >= self._next_lease:
            self._next_lease = now + s.lease / 4
            lease = self._lease(now)
            for life in self.fence.hosts:
                self.out.append(SendCluster(life, lease))
            self._fence(now)
            self._take_over_lost(now, now_us)
            self.out += self.taken_lists.expire(now, TAKEN_KEEP * max(s.rejoin_grace, s.lease))
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + s.node_timeout / 4
        if s.static_peers:
            self.out.append(SendStatic(peering.ReplicaPing(self.node_id)))
        for origin in self.holding.silent(now, s.node_timeout, self.fence):
            self._take_over(origin, now_us)

    def counters(self) -> dict[str, int]:
        out = self.holding.counters()
        if self.holders is not None:
            out.update(replica_holders=len(self.holders), held_recovered=len(self.queue.held),
                       # ^ recovered messages not delivered yet: peers may still say they did
                       recopy_backlog=self.holders.recopy_backlog())
        return out
