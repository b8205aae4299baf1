"""One pzq queue without its sockets: producers' messages in, deliveries and replies out.

The core decides; the server (server.py) moves frames, runs the clock and the log. The core
never calls the log: what to write, ACK or move there, and what to answer, it records as
typed actions (actions.py) that the caller takes with :meth:`QueueCore.take_output` and
carries out in order; what the log did comes back as a :class:`BatchResult` (``batch_done``:
the seqs it placed or failed). The core has a dispatcher (dispatcher.py) and keeps:

- the unACKed messages (``messages``, by seq) and their keys (what consumers ACK with),
- the idempotence window (id_window.py): the last ``idempotence_window`` producer message
  ids (and at most ``idempotence_bytes`` of them), so that a retried id is answered, not
  stored twice,
- the producers waiting for their message to be written (the producer ACK goes out when
  the log reports its seq written and synced, or when a consumer ACKed the message first,
  whatever the log is doing with it; refused input is answered at once).

With ``replicas``, each new message is also handed to the replication core (replication.py)
through :meth:`QueueCore.take_replication`, and its ACK waits for the copies' confirmations.

Deliveries are the one output that is pulled, not recorded as actions: the I/O calls
:meth:`QueueCore.next_delivery` while the consumers' sockets take what it sends; a delivery
that a full connection could not take it gives back with :meth:`QueueCore.unsent` and pauses
that consumer in the dispatcher, so that the very next pick of the same round goes to another
consumer (none is picked once all are full). Each send's outcome decides the next pick. Returned as
actions, deliveries would be picked and encoded before any of them was sent: with a full
socket, a whole round of them would come back as "unsent" events and be dispatched again in
another round, which is more code and more work on the hot path, not less. h11 splits it the
same way: what a connection must send is computed when the caller asks for it (``send()``),
that is, when the caller can write.

A stream queue (``stream=True``) pushes nothing to consumers: its messages are read by offset
(their seq) with :meth:`QueueCore.range` and dropped in order with :meth:`QueueCore.commit_below`
(stream.py serves the requests). ``head`` is the offset just past the last durable message.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypeAlias, cast, final

from zbroker.pzq.core import wire
from zbroker.pzq.core.actions import (
    AckMany,
    Adopted,
    Append,
    AppendBatch,
    BatchResult,
    Confirm,
    Move,
    Replicate,
    Reply,
    Unreplicate,
)
from zbroker.pzq.core.dispatcher import Deliveries, Delivery, Dispatcher
from zbroker.pzq.core.id_window import IdWindow
from zbroker.pzq.core.records import MessageRecord
from zbroker.runtime.stats import Buckets

QUEUE_FULL = "Queue full"
#: why producers get "0" ACKs, for metrics (QueueCore.refusals): the queue is full, the
#: message over max_message_size, invalid (malformed, id too long, too many frames), the
#: receiver holding too much (busy), or its write failed
REFUSAL_KINDS = ("full", "too_large", "invalid", "busy", "store_failed")
ID_TOO_LONG = wire.ID_TOO_LONG
MAX_ID = wire.MAX_ID
#: how a queue's consumers get its messages: push (sent to them, ACKed one by one) or stream
#: (read by offset, committed; stream.py)
MODES = ("push", "stream")
CONSUMERS = "*"  # the one consumer id when consumers are not told apart (a DEALER socket)
MAX_CREDIT_CONSUMERS = 10_000  # consumers known by their credit (READY) at once
MAX_DELIVERY_BATCH = 1024  # messages in one batch to a batch consumer
MAX_DONE_ROOTS = 16_384  # delivered replicated messages known again if taken over later


@dataclass(frozen=True)
class Limits:
    """A queue's limits. The defaults here are the queue's defaults: the broker's config
    (zbroker.pzq.config.PzqQueueConfig) refers to them."""

    ack_timeout: float = 5.0
    max_message_size: int = 16 << 20
    max_backlog: int = 256 << 20  # what unACKed messages cost (wire.cost), copies included
    max_messages: int = 1_000_000
    idempotence_window: int = 100_000
    idempotence_bytes: int = 16 << 20  # bytes of ids the idempotence window keeps at most
    max_frames: int = 1024  # frames of a producer's message (id, headers, delimiter, body)
    inflight_window: int = 32  # per consumer
    inflight_size: int = 30 << 20  # bytes in flight, all consumers together
    replicas: int = 0  # copies on peers before the producer ACK
    replication_timeout: float = 0.1


class Budget:
    """What the unACKed messages of a queue cost together: its own and the copies it holds
    for peers share one ``max_backlog`` (and ``max_messages``), so that copies taken over
    never push the queue past its limits."""

    __slots__ = ("bytes", "messages")

    def __init__(self) -> None:
        self.bytes = 0
        self.messages = 0


class Message:
    """An unACKed message; durable once its seq is below the queue's ``head``."""

    __slots__ = ("seq", "key", "msg_id", "frames", "size")

    def __init__(self, seq: int, key: bytes, msg_id: bytes, frames: tuple[bytes, ...],
                 size: int):
        self.seq = seq
        self.key = key
        self.msg_id = msg_id
        self.frames = frames
        self.size = size


class Replicating:
    """A message being copied to peers: its producer ACK waits for ``need`` confirmations
    (and its own batch), or for the replication timeout (then "1" REPLICATION_FAILED)."""

    __slots__ = ("need", "got", "local", "failed", "waiters")

    def __init__(self, need: int):
        self.need = need
        self.got = 0
        self.local = False  # its batch is written
        self.failed = False  # the timeout passed first
        self.waiters: list[tuple[Producer, bytes]] = []  # (peer, msg id)


@final  # (so that mypy narrows ``type(x) is BatchWaiter`` in both branches)
class BatchWaiter:
    """A producer's batch (wire.ProduceBatch) waiting for its parts: its record in the log,
    and the messages of other batches it repeats (ids stored before, not yet durable) or,
    with replicas, the copies of each of its messages. Answered once, when every part is
    done: "0" with the first failure's reason, else "1" (REPLICATION_FAILED if a part
    said so)."""

    __slots__ = ("peer", "batch_id", "pending", "error", "replication_failed")

    def __init__(self, peer: bytes, batch_id: bytes):
        self.peer = peer
        self.batch_id = batch_id
        self.pending = 0
        self.error: str | None = None
        self.replication_failed = False

    def part_done(self, ok: bool, text: str | None) -> bool:
        """One part is done; True when it was the last."""
        self.pending -= 1
        if not ok and self.error is None:
            self.error = text or "store failed"
        elif text == wire.REPLICATION_FAILED:
            self.replication_failed = True
        return self.pending == 0


@final  # (so that mypy narrows ``type(x) is AckGroup`` in both branches)
class AckGroup:
    """A batch consumer's ACK of many keys: confirmed (ACKED) once all are durable."""

    __slots__ = ("consumer", "ack_id", "pending")

    def __init__(self, consumer: Hashable, ack_id: bytes):
        self.consumer = consumer
        self.ack_id = ack_id
        self.pending = 0


#: whom a producer ACK goes to: a producer (its routing id), or a batch waiting for its parts
Producer: TypeAlias = bytes | BatchWaiter
#: a producer waiting for a message to be written: (peer, msg id, key), or a batch's record,
#: (its BatchWaiter, b"", None)
Waiting: TypeAlias = tuple[Producer, bytes, bytes | None]
#: a credit consumer waiting for its ACK to be durable: (consumer, key), or a batch's ACK
AckWaiter: TypeAlias = tuple[Hashable, bytes] | AckGroup


class QueueCore:
    def __init__(self, limits: Limits = Limits(), stream: bool = False,
                 budget: Budget | None = None, full_reason: str = QUEUE_FULL,
                 log: str | None = None):
        """``log``: the name its log actions carry (None: the queue's own log)."""
        self.log_name = log
        self.limits = limits
        self.stream = stream
        self.budget = budget if budget is not None else Budget()
        self.full_reason = full_reason
        self.dispatcher = Dispatcher(limits.ack_timeout, limits.inflight_size)
        self.messages: dict[int, Message] = {}
        self.keys: dict[bytes, int] = {}
        self.ids = IdWindow(limits.idempotence_window, limits.idempotence_bytes)
        #: seq -> the producers waiting for it to be written: (peer, msg id, key); a
        #: batch's record is (its BatchWaiter, b"", None)
        self.waiting: dict[int, list[Waiting]] = {}
        #: seq -> the tokens of the copies it takes over (adopt), each with its Adopted's
        #: claim: Adopted once that seq is written
        self.adopting: dict[int, list[tuple[Any, bool]]] = {}
        #: the first key of each message taken over (wire.root_key) -> its seq here, to know
        #: it when it comes back under another key (entries of messages gone are let go)
        self.roots: dict[bytes, int] = {}
        #: the first keys of the last MAX_DONE_ROOTS replicated messages that left the queue
        #: delivered, oldest first (not kept across a restart)
        self.done_roots: dict[bytes, None] = {}
        #: the monotonic time from which nothing is delivered (replication.py's lease: peers
        #: may have taken our messages over since); inf: no lease to keep
        self.deliver_until = float("inf")
        self.out: list[Any] = []  # actions for the I/O (take_output)
        #: the AckMany of ``out`` that the next consumer ACK joins while ``out`` still ends
        #: where it did after it and its producers' answers: (that AckMany, that length)
        self._open_ack: tuple[AckMany, int] | None = None
        #: for the replication core: Replicate, Unreplicate, Adopted (take_replication)
        self.replication_out: list[Any] = []
        self.replicating: dict[bytes, Replicating] = {}
        #: how many peers copies go to now; below ``replicas`` a new message's ACK says
        #: REPLICATION_FAILED as soon as it is written here, without waiting for the timeout
        self.replica_targets = limits.replicas
        self._replica_deadlines: deque[tuple[float, bytes]] = deque()
        self.held: list[int] = []  # recovered seqs not given to the dispatcher yet
        #: seqs of the messages of several body frames (or none): each goes alone to a batch
        #: consumer. Seqs are never reused, so those of messages gone since may stay a while
        self.alone: set[int] = set()
        self.credit_consumers = 0  # consumers of the credit endpoint (known by their id)
        #: seq -> (consumer, key), or the AckGroup of a batch consumer's ACK
        self.ack_waiters: dict[int, AckWaiter] = {}
        #: consumers of the credit endpoint that take batches: id -> most bytes in a batch
        self.batch_consumers: dict[Hashable, int] = {}
        self.next_seq = 0
        self.head = 0  # every message below this seq is durable (or was dropped)
        self.backlog_bytes = 0
        #: for metrics: producer ACK latency (seconds from arrival to the ACK of a stored
        #: message), and "0" ACKs by kind (REFUSAL_KINDS)
        self.ack_latency = Buckets()
        self.refusals = dict.fromkeys(REFUSAL_KINDS, 0)
        #: the wall clock in microseconds (the time keys start with), for the ACK latency;
        #: None: not measured (the I/O side gives it)
        self.clock_us: Callable[[], int] | None = None
        self._prefix = str(uuid.uuid4())[:24].encode()  # "xxxxxxxx-xxxx-4xxx-yxxx-"
        self.counters = dict.fromkeys((
            "produced", "stored", "producer_acks", "producer_failures", "duplicates",
            "malformed", "consumer_acks", "consumer_nacks", "unknown_acks", "delivered",
            "recovered", "replicated", "replication_failed", "committed_messages",
            "taken_back", "batches"), 0)

    def take_output(self) -> list[Any]:
        """The actions recorded since the last call, in order (actions.py)."""
        out, self.out = self.out, []
        self._open_ack = None
        return out

    def take_replication(self) -> list[Any]:
        """Replicate / Unreplicate / Adopted, for the replication core, in order."""
        out, self.replication_out = self.replication_out, []
        return out

    # --- start ------------------------------------------------------------------------------

    def recover(self, messages: list[MessageRecord], next_seq: int, hold: bool = False) -> None:
        """Take over what the store found on disk (durable, not yet ACKed). With ``hold``,
        the messages are not delivered until :meth:`release_held` (peers may say meanwhile
        that they delivered some of them: :meth:`taken_back`)."""
        for r in messages:
            size = wire.cost(r.msg_id, r.frames)
            self.messages[r.seq] = Message(r.seq, r.key, r.msg_id, r.frames, size)
            if len(r.frames) != 1:
                self._goes_alone(r.seq)
            self.keys[r.key] = r.seq
            if wire.ADOPTED in r.key:
                self.roots[wire.root_key(r.key)] = r.seq
            self.ids.add(r.msg_id, r.seq)
            self._count(size, 1)
            if self.stream:
                continue
            if hold:
                self.held.append(r.seq)
            else:
                self.dispatcher.add(r.seq, size)
        self.next_seq = max(self.next_seq, next_seq)
        self.head = max(self.head, self.next_seq)
        self.counters["recovered"] += len(messages)

    # --- producers --------------------------------------------------------------------------

    def produce(self, peer: bytes, frames: list[bytes], now_us: int, now: float = 0.0) -> None:
        """A message from a producer (frames after its routing id). ``now``: the monotonic
        clock, for the replication timeout."""
        if len(frames) > self.limits.max_frames:
            self.counters["malformed"] += 1
            return self._refuse(peer, bytes(frames[0][:MAX_ID]),
                                wire.too_many_frames(self.limits.max_frames))
        p = wire.decode_produce(frames)
        if isinstance(p, wire.WireError):
            self.counters["malformed"] += 1
            if p.msg_id is not None:
                self._refuse(peer, p.msg_id[:MAX_ID], p.reason)
            return
        self.counters["produced"] += 1
        msg_id = p.msg_id
        if len(msg_id) > MAX_ID:
            return self._refuse(peer, msg_id[:MAX_ID], ID_TOO_LONG)
        if p.size > self.limits.max_message_size:
            return self._refuse(peer, msg_id, wire.too_large(p.size,
                                                             self.limits.max_message_size))
        size = wire.cost(msg_id, p.body)
        prior = self.ids.get(msg_id)
        if prior is not None:
            self.counters["duplicates"] += 1
            m = self.messages.get(prior)
            st = self.replicating.get(m.key) if m is not None else None
            if m is not None and prior >= self.head:  # not durable yet: wait for it
                self.waiting.setdefault(prior, []).append((peer, msg_id, m.key))
            elif st is not None:
                st.waiters.append((peer, msg_id))
            else:
                self._reply(peer, wire.producer_ack(msg_id))
            return
        budget = self.budget
        if (budget.bytes + size > self.limits.max_backlog
                or budget.messages >= self.limits.max_messages):
            return self._refuse(peer, msg_id, self.full_reason)
        seq = self.next_seq
        self.next_seq += 1
        key = wire.message_key(wire.key_base(now_us, self._prefix), seq)
        self._add(seq, key, msg_id, p.body, size)
        self.waiting[seq] = [(peer, msg_id, key)]
        if self.limits.replicas:
            st = self.replicating[key] = Replicating(self.limits.replicas)
            st.failed = self.replica_targets < self.limits.replicas
            self._replica_deadlines.append((now + self.limits.replication_timeout, key))
            self.replication_out.append(Replicate(key, p.body))

    def produce_batch(self, peer: bytes, frames: list[bytes], now_us: int,
                      now: float = 0.0) -> None:
        """A producer's batch (wire.ProduceBatch, frames after its routing id): its new
        messages go to the log as one record (all of them or none after a crash); one
        answer when every message of it is durable (or was before: ids are idempotent as
        one by one), or "0" and why for all of it."""
        b = wire.decode_produce_batch(frames)
        if isinstance(b, wire.WireError):
            self.counters["malformed"] += 1
            if b.msg_id is not None:
                self._refuse(peer, b.msg_id[:MAX_ID], b.reason)
            return
        limits, counters = self.limits, self.counters
        ids, bodies, n = b.ids, b.bodies, len(b.ids)
        counters["produced"] += n
        counters["batches"] += 1
        batch_id = b.batch_id[:MAX_ID]
        if len(b.packed) > limits.max_message_size:
            return self._refuse(peer, batch_id, f"Batch too large: {len(b.packed)} bytes, "
                                                f"limit {limits.max_message_size}")
        if not all(bodies):
            return self._refuse(peer, batch_id, wire.EMPTY)
        frame_cost = 2 * wire.FRAME_COST
        cost = len(b.packed) + (frame_cost - 5) * n - 4  # ids and bodies, FRAME_COST each
        budget = self.budget
        if (budget.bytes + cost > limits.max_backlog
                or budget.messages + n > limits.max_messages):
            return self._refuse(peer, batch_id, self.full_reason)
        w = BatchWaiter(peer, batch_id)
        if self.ids.any_known(ids) or len(set(ids)) < n:
            return self._produce_batch_repeating(w, ids, bodies, now_us, now)
        first = self.next_seq
        self.next_seq = first + n
        base = wire.key_base(now_us, self._prefix)
        self.out.append(AppendBatch(first, n, base, b.packed, self.log_name))
        self._add_batch(w, first, base, ids, bodies, now)

    def _produce_batch_repeating(self, w: BatchWaiter, ids: list[bytes],
                                 bodies: list[bytes], now_us: int, now: float) -> None:
        """A batch some of whose ids were stored before (a batch sent again), or that
        repeats an id: the new messages are written, the others waited for."""
        new_ids: list[bytes] = []
        new_bodies: list[bytes] = []
        first = self.next_seq
        for msg_id, body in zip(ids, bodies, strict=True):
            prior = self.ids.get(msg_id)
            if prior is None and msg_id not in new_ids:
                new_ids.append(msg_id)
                new_bodies.append(body)
                continue
            self.counters["duplicates"] += 1
            m = self.messages.get(prior) if prior is not None else None
            st = self.replicating.get(m.key) if m is not None else None
            if m is not None and m.seq >= self.head:  # not durable yet: wait for it
                self.waiting.setdefault(m.seq, []).append((w, msg_id, m.key))
                w.pending += 1
            elif st is not None:
                st.waiters.append((w, msg_id))
                w.pending += 1
        if new_ids:
            n = len(new_ids)
            self.next_seq = first + n
            base = wire.key_base(now_us, self._prefix)
            self.out.append(AppendBatch(first, n, base, wire.pack(new_ids, new_bodies),
                                        self.log_name))
            self._add_batch(w, first, base, new_ids, new_bodies, now)
        elif w.pending == 0:
            self._answer_batch(w)  # every message of it was stored before

    def _add_batch(self, w: BatchWaiter, first: int, base: bytes, ids: list[bytes],
                   bodies: list[bytes], now: float) -> None:
        """Take the messages of a batch record with seqs from ``first`` on."""
        messages, keys = self.messages, self.keys
        replicas = self.limits.replicas
        frame_cost = 2 * wire.FRAME_COST
        seqs = range(first, first + len(ids))
        batch_keys = wire.message_keys(base, first, len(ids))
        sizes = [len(msg_id) + len(body) + frame_cost
                 for msg_id, body in zip(ids, bodies, strict=True)]
        for seq, key, msg_id, body, size in zip(seqs, batch_keys, ids, bodies, sizes,
                                                    strict=True):
            messages[seq] = Message(seq, key, msg_id, (body,), size)
            if replicas:  # each message's copies are a part of the batch's answer
                self.waiting[seq] = [(w, msg_id, key)]
                w.pending += 1
                st = self.replicating[key] = Replicating(replicas)
                st.failed = self.replica_targets < replicas
                self._replica_deadlines.append((now + self.limits.replication_timeout, key))
                self.replication_out.append(Replicate(key, (body,)))
        keys.update(zip(batch_keys, seqs, strict=True))
        self.ids.add_many(ids, first)  # (new and distinct: both callers made sure)
        if not self.stream:
            self.dispatcher.add_many(seqs, sizes)
        self._count(sum(sizes), len(ids))
        if not replicas:
            self.waiting[first] = [(w, b"", None)]  # the record: one part
            w.pending += 1

    def adopt(self, msg_id: bytes, frames: tuple[bytes, ...], now_us: int, token: Any,
              copy_key: bytes | None = None) -> None:
        """Take a message over with no producer waiting (a replica whose owner is lost);
        ``Adopted(token, ok, claim)`` goes to the replication core once the log has written
        it. ``copy_key``: its key at its origin; its new key here starts with the first key
        the message had (wire.adopted_key), so that it is known when it comes back under
        another key: our own message, or one taken over here before (no claim then)."""
        prior, claim = self.ids.get(msg_id), True
        if prior is None and copy_key is not None:
            root = wire.root_key(copy_key)
            if root in self.done_roots:  # delivered here before: its origin may drop it
                self.replication_out.append(Adopted(token, True))
                return
            prior, claim = self.keys.get(root), False
            if prior is None and (seq := self.roots.get(root)) is not None:
                m = self.messages.get(seq)
                if m is not None and wire.root_key(m.key) == root:
                    prior = seq
        if prior is not None:  # held before: Adopted once that one is written
            if prior in self.adopting or (prior in self.messages and prior >= self.head):
                self.adopting.setdefault(prior, []).append((token, claim))
            else:
                self.replication_out.append(Adopted(token, True, claim))
            return
        seq = self.next_seq
        self.next_seq += 1
        key = wire.message_key(wire.key_base(now_us, self._prefix), seq)
        if copy_key is not None:
            key = wire.adopted_key(copy_key, key)
            self._keep_root(wire.root_key(key), seq)
        # not checked against max_backlog: a copy held here was counted there already
        self._add(seq, key, msg_id, frames, wire.cost(msg_id, frames))
        self.adopting[seq] = [(token, True)]

    def _keep_root(self, root: bytes, seq: int) -> None:
        roots = self.roots
        roots[root] = seq
        if len(roots) > 64 and len(roots) > 2 * len(self.messages):
            self.roots = {r: s for r, s in roots.items() if s in self.messages}

    def remove_by_id(self, msg_id: bytes) -> bool:
        """Drop the message a producer sent with ``msg_id``, as if a consumer ACKed it
        (a replica whose original was ACKed). False if there is none."""
        seq = self.ids.forget(msg_id)
        m = self.messages.get(seq) if seq is not None else None
        if m is None:
            return False
        self.consumer_ack([m.key, wire.OK])
        return True

    def release_held(self) -> int:
        """Deliver the held recovered messages that are still here; returns how many."""
        held, self.held = self.held, []
        n = 0
        for seq in held:
            m = self.messages.get(seq)
            if m is not None:
                self.dispatcher.add(seq, m.size)
                n += 1
        return n

    def taken_back(self, key: bytes) -> bool:
        """A peer delivered the message ``key`` while this queue was gone: drop it here, as
        if a consumer ACKed it. False if it is not here (ACKed meanwhile)."""
        seq = self.keys.get(key)
        if seq is None or self.stream:
            return False
        self.counters["taken_back"] += 1
        self.dispatcher.ack(seq)
        self._drop(seq)
        return True

    def _add(self, seq: int, key: bytes, msg_id: bytes, body: tuple[bytes, ...],
             size: int) -> None:
        self.out.append(Append(seq, key, msg_id, body, self.log_name))
        self.messages[seq] = Message(seq, key, msg_id, body, size)
        if len(body) != 1:
            self._goes_alone(seq)
        self.keys[key] = seq
        self.ids.add(msg_id, seq)
        self._count(size, 1)
        if not self.stream:
            self.dispatcher.add(seq, size)

    def batch_done(self, result: BatchResult) -> None:
        """The log wrote (or failed to write) some messages and ACKs: answer the producers of
        the messages, and the credit consumers whose ACKs it made durable. Every message seq
        appended is in one result, in ``placed``, ``failed`` or (ACKed before it was written,
        so never written) ``acked``."""
        if self.ack_waiters:
            self._acks_durable(result.acked)
        if result.error is not None:
            for seq in result.failed:
                m = self.messages.pop(seq, None)
                if m is not None:
                    self.keys.pop(m.key, None)
                    if self.ids.get(m.msg_id) == seq:
                        self.ids.forget(m.msg_id)  # a retry is stored, not deduplicated
                    self._count(-m.size, -1)
                    self.dispatcher.drop(seq)
        elif result.placed:
            # one writer, in seq order: every message below is written, or failed (and
            # gone): a message is durable once its seq is below the head
            self.head = max(self.head, max(result.placed) + 1)
        ok = result.error is None
        waiting, adopting = self.waiting, self.adopting
        now_us = self.clock_us() if self.clock_us is not None and result.placed else 0
        for seqs in (result.placed, result.failed, result.acked):
            if adopting:
                for seq in seqs:
                    for token, claim in adopting.pop(seq, ()):
                        self.replication_out.append(Adopted(token, ok, claim))
            for w in filter(None, map(waiting.pop, seqs, repeat(None))):
                self._written(w, ok, result.error, now_us)
        if ok:
            self.counters["stored"] += len(result.placed)

    def unwritten(self, seqs: Sequence[int]) -> None:
        """The log let go of these messages' record before writing it: their consumers
        ACKed them first (write avoidance), so nothing of them is left to make durable.
        Their producers, and the credit consumers that wait for those ACKs, are answered
        now, not when the batch they were in completes (which reports them again, in
        ``acked``: answered once)."""
        now_us = self.clock_us() if self.clock_us is not None else 0
        for w in filter(None, map(self.waiting.pop, seqs, repeat(None))):
            self._written(w, True, None, now_us)
        if self.ack_waiters:
            self._acks_durable(seqs)

    def _written(self, w: list[Waiting], ok: bool,
                 error: str | None, now_us: int) -> None:
        """Answer the producers ``w`` that waited for one message's write (or failure)."""
        for peer, msg_id, key in w:
            st = self.replicating.get(key) if key is not None else None
            if not ok:
                self._answer(peer, msg_id, False, error or "store failed")
                if st is not None:  # (then key is not None)
                    del self.replicating[cast(bytes, key)]
            elif st is None:
                self._answer(peer, msg_id, True, None)
                if now_us and key is not None:
                    self._ack_latency(key, now_us)
            else:
                st.local = True
                st.waiters.append((peer, msg_id))
                self._replicated(cast(bytes, key), st)  # (st is not None: neither is key)

    def _acks_durable(self, seqs: Iterable[int]) -> None:
        """The consumer ACKs of ``seqs`` cannot be undone by a crash any more: confirm them
        to the credit consumers waiting for that."""
        out = self.out
        found: list[AckWaiter] = list(filter(None, map(self.ack_waiters.pop, seqs,
                                                      repeat(None))))
        if not found:
            return
        first = found[0]
        if type(first) is AckGroup and found.count(first) == len(found):  # one batch ACK
            first.pending -= len(found)
            if first.pending == 0:
                out.append(Confirm(first.consumer, first.ack_id, wire.ACKED))
            return
        for w in found:
            if type(w) is AckGroup:
                w.pending -= 1
                if w.pending == 0:
                    out.append(Confirm(w.consumer, w.ack_id, wire.ACKED))
            else:
                out.append(Confirm(w[0], w[1], wire.ACKED))

    def compact(self, seqs: Iterable[int]) -> None:
        """The log wants these messages written again at its head (compaction): Move those
        still here."""
        for seq in seqs:
            m = self.messages.get(seq)
            if m is not None:
                self.out.append(Move(seq, m.key, m.msg_id, m.frames, self.log_name))

    # --- consumers --------------------------------------------------------------------------

    def consumers_changed(self, connected: int, cid: Hashable = CONSUMERS) -> None:
        """``connected`` consumers share ``cid``: its credit is a window for each. When the
        last one leaves, what was in flight cannot be ACKed on its connection any more: it is
        ready again at once (a late ACK from a new connection is still honoured)."""
        if connected == 0:
            self.dispatcher.remove_consumer(cid)
        self.dispatcher.set_consumer(cid, self.limits.inflight_window * connected)

    def credit_consumer(self, cid: Hashable, window: int, max_bytes: int | None = None
                        ) -> bool:
        """A consumer of the credit endpoint says READY with its window: it gets at most
        ``window`` messages unACKed; with ``max_bytes`` it takes batches, and holds at most
        that many bytes of bodies unACKed (one message at least). False if there are too
        many such consumers already."""
        if cid not in self.dispatcher.consumers and self.credit_consumers >= MAX_CREDIT_CONSUMERS:
            return False
        if cid not in self.dispatcher.consumers:
            self.credit_consumers += 1
        if max_bytes is None:
            self.batch_consumers.pop(cid, None)
            self.dispatcher.set_consumer(cid, window)
        else:
            self.batch_consumers[cid] = max_bytes
            self.dispatcher.set_consumer(cid, window, max_bytes)
        return True

    def consumer_gone(self, cid: Hashable) -> int:
        """A consumer of the credit endpoint cannot be reached: what it held is ready again
        at once. Returns how many messages that was."""
        if cid in self.dispatcher.consumers:
            self.credit_consumers -= 1
        self.batch_consumers.pop(cid, None)
        return len(self.dispatcher.remove_consumer(cid))

    def next_delivery(self, now: float, now_us: int
                      ) -> tuple[Delivery | Deliveries,
                                 list[bytes] | list[bytes | list[bytes]]] | None:
        """The next delivery to send and its frames, or None. To a batch consumer, a batch:
        as many messages as its window takes (at most MAX_DELIVERY_BATCH) until one of
        several body frames, which goes alone."""
        if now >= self.deliver_until:
            return None  # fenced: peers may deliver these now (replication.py)
        dispatcher = self.dispatcher
        d = dispatcher.next_delivery(now)
        if d is None:
            return None
        messages, counters = self.messages, self.counters
        m = messages[d.seq]
        timeout_us = int(self.limits.ack_timeout * 1e6)
        if d.consumer not in self.batch_consumers or d.seq in self.alone:
            counters["delivered"] += 1
            return d, wire.delivery(m.key, now_us, timeout_us, m.frames)
        batch = dispatcher.more_to(d.consumer, now, MAX_DELIVERY_BATCH - 1, self.alone)
        batch.seqs.insert(0, d.seq)
        batch.attempts.insert(0, d.attempt)
        sent = [messages[seq] for seq in batch.seqs]
        counters["delivered"] += len(sent)
        return batch, wire.batch_delivery(now_us, timeout_us, [m.key for m in sent],
                                          [m.frames[0] for m in sent])

    def unsent(self, delivery: Delivery | Deliveries) -> None:
        """``delivery`` (or a batch) could not be sent: ready again, as it was."""
        self.counters["delivered"] -= (len(delivery.seqs) if type(delivery) is Deliveries
                                       else 1)
        self.dispatcher.unsent(delivery)

    def consumer_ack(self, frames: list[bytes], confirm_to: Hashable | None = None) -> None:
        """A consumer's ACK or NACK. With ``confirm_to`` (a credit consumer's id), an ACK is
        answered in ``confirmations`` once a crash can no longer undo it (ACKED), or at once
        if the key is not in the queue (UNKNOWN: ACKed before, or never there)."""
        a = wire.decode_consumer_ack(frames)
        if isinstance(a, wire.WireError):
            self.counters["malformed"] += 1
            return
        seq = self.keys.get(a.key)
        if seq is None or self.stream:  # a stream queue is ACKed by COMMIT only
            self.counters["unknown_acks"] += 1  # already ACKed (a duplicate), or not ours
            if confirm_to is not None and a.ok:
                self.out.append(Confirm(confirm_to, a.key, wire.UNKNOWN))
            return
        if not a.ok:
            self.counters["consumer_nacks"] += 1
            self.dispatcher.nack(seq)
            return
        self.counters["consumer_acks"] += 1
        self.dispatcher.ack(seq)
        if self.limits.replicas:
            self._done(a.key)
        self._drop(seq)
        if confirm_to is not None:
            self.ack_waiters[seq] = (confirm_to, a.key)

    def consumer_acks(self, keys: list[bytes], cid: Hashable, ack_id: bytes) -> None:
        """A batch consumer's ACK of ``keys``: each as :meth:`consumer_ack` (the log ACKs
        them in one AckMany); one Confirm (``ack_id``, ACKED) once all those that were in
        the queue are durable."""
        group = AckGroup(cid, ack_id)
        seq_of, messages = self.keys, self.messages
        copies = self.replication_out if self.limits.replicas else None
        acked: list[int] = []
        size = 0
        if not self.stream:  # a stream queue is ACKed by COMMIT only
            for key in keys:
                seq = seq_of.pop(key, None)
                if seq is None:
                    continue  # already ACKed (a duplicate), or not ours
                size += messages.pop(seq).size
                acked.append(seq)
                if copies is not None:
                    copies.append(Unreplicate(key))
                    self._done(key)
        self.counters["unknown_acks"] += len(keys) - len(acked)
        if not acked:
            self.out.append(Confirm(cid, ack_id, wire.ACKED))
            return
        self.dispatcher.ack_many(acked)
        if copies is None and self.waiting:
            for seq in acked:
                if seq in self.waiting:
                    self._consumed(seq)
        self.ack_waiters.update(dict.fromkeys(acked, group))
        group.pending = len(acked)
        self.counters["consumer_acks"] += group.pending
        self._count(-size, -len(acked))
        self.out.append(AckMany(acked, self.log_name))

    def _drop(self, seq: int) -> None:
        m = self.messages.pop(seq)
        del self.keys[m.key]
        self._count(-m.size, -1)
        self._log_ack(seq)
        if self.limits.replicas:
            self.replication_out.append(Unreplicate(m.key))
        elif seq in self.waiting:
            self._consumed(seq)

    def _done(self, key: bytes) -> None:
        """A replicated message was ACKed by a consumer here: a copy of it taken over later
        is known as delivered (adopt). (Not one a peer said it took: that peer has it.)"""
        done = self.done_roots
        done[wire.root_key(key)] = None
        if len(done) > MAX_DONE_ROOTS:
            del done[next(iter(done))]

    def _consumed(self, seq: int) -> None:
        """A consumer ACKed message ``seq`` before the log said it was durable: its
        producers are answered now. Delivered and ACKed, it owes them nothing more, whether
        its record still waits (write avoidance), is being written, or fails to be. (A
        producer batch's record waits for all of its batch: the log says when.)"""
        w = self.waiting.pop(seq)
        if len(w) > 1 or w[0][2] is None:  # (retries, or a batch's record)
            record = [e for e in w if e[2] is None]
            if record:
                self.waiting[seq] = record
                w = [e for e in w if e[2] is not None]
        if not w:
            return
        open_ack, before = self._open_ack, len(self.out)
        self._written(w, True, None, self.clock_us() if self.clock_us is not None else 0)
        if open_ack is not None and open_ack[1] == before:  # answers only: the next ACK
            self._open_ack = (open_ack[0], len(self.out))  # may still join it

    def _log_ack(self, seq: int) -> None:
        """The log is to ACK ``seq``: with the ACKs just before it when nothing but their
        producers' answers came after them (consumer ACKs read in one go: one AckMany, one
        taking of the log's lock)."""
        out, open_ack = self.out, self._open_ack
        if open_ack is not None and open_ack[1] == len(out):
            open_ack[0].seqs.append(seq)
        else:
            acks = AckMany([seq], self.log_name)
            out.append(acks)
            self._open_ack = (acks, len(out))

    # --- stream reads -----------------------------------------------------------------------

    def range(self, start: int, end: int, floor: int, max_bytes: int, max_messages: int
              ) -> tuple[int, list[Message]]:
        """(next, messages): the durable messages with seqs in [max(start, floor), end), in
        order, up to ``max_messages`` and ``max_bytes`` of bodies (at least one message if
        there is one). ``next``: every message of [start, next) is in the answer or below
        ``floor`` (committed); ask again from ``next`` for the rest."""
        if end <= floor:
            return end, []
        seq = max(start, floor)
        hi = min(end, self.head)
        out: list[Message] = []
        size = 0
        budget = max_messages + 65_536  # offsets looked at: gaps are failed writes, rare
        messages = self.messages
        while seq < hi and budget > 0:
            m = messages.get(seq)
            if m is not None:
                if out and (len(out) >= max_messages or size + m.size > max_bytes):
                    break
                out.append(m)
                size += m.size
            seq += 1
            budget -= 1
        return seq, out

    def commit_below(self, end: int) -> int:
        """Drop every message below seq ``end`` (a stream reader is done with them); returns
        how many. ``messages`` is in seq order (recovered sorted, then new seqs ascending)."""
        doomed = []
        for seq in self.messages:
            if seq >= end:
                break
            doomed.append(seq)
        for seq in doomed:
            self.dispatcher.drop(seq)
            self._drop(seq)
        self.counters["committed_messages"] += len(doomed)
        return len(doomed)

    # --- replication ------------------------------------------------------------------------

    def replica_confirmed(self, key: bytes, ok: bool) -> None:
        """A peer answered the copy of ``key`` ("1": it holds it)."""
        st = self.replicating.get(key)
        if st is not None and ok:
            st.got += 1
            self._replicated(key, st)

    def _replicated(self, key: bytes, st: Replicating) -> None:
        if not st.local or (st.got < st.need and not st.failed):
            return
        del self.replicating[key]
        done = st.got >= st.need
        self.counters["replicated" if done else "replication_failed"] += 1
        for peer, msg_id in st.waiters:
            self._answer(peer, msg_id, True, None if done else wire.REPLICATION_FAILED)
        if st.waiters and self.clock_us is not None:
            self._ack_latency(key, self.clock_us(), len(st.waiters))

    def _ack_latency(self, key: bytes, now_us: int, n: int = 1) -> None:
        """``n`` producer ACKs of the message ``key`` go out now: the key starts with the
        time it arrived (produce)."""
        self.ack_latency.observe(max(0, now_us - wire.sent_us_of(key)) * 1e-6, n)

    def next_replication_deadline(self) -> float | None:
        d = self._replica_deadlines
        while d and d[0][1] not in self.replicating:
            d.popleft()
        return d[0][0] if d else None

    def tick(self, now: float) -> list[int]:
        """Requeue the messages whose ACK timeout has passed; give up waiting for replicas
        whose timeout has passed."""
        d = self._replica_deadlines
        while d and d[0][0] <= now:
            _, key = d.popleft()
            st = self.replicating.get(key)
            if st is not None:
                st.failed = True
                self._replicated(key, st)
        return self.dispatcher.expire(now)

    def next_deadline(self) -> float | None:
        return self.dispatcher.next_deadline()

    # --- internals --------------------------------------------------------------------------

    def _count(self, size: int, n: int) -> None:
        self.backlog_bytes += size
        self.budget.bytes += size
        self.budget.messages += n

    def _goes_alone(self, seq: int) -> None:
        """Message ``seq`` has several body frames (or none); the seqs of messages gone
        meanwhile are let go once they are most of the set."""
        alone = self.alone
        alone.add(seq)
        if len(alone) > 64 and len(alone) > 2 * len(self.messages):
            self.alone = {s for s in alone if s in self.messages}

    def _answer(self, peer: Producer, msg_id: bytes, ok: bool,
                text: str | None) -> None:
        """A producer's message is stored (``ok``; ``text``: REPLICATION_FAILED or None) or
        failed (``text``: why). ``peer`` is a BatchWaiter for a part of a batch."""
        if type(peer) is BatchWaiter:
            if peer.part_done(ok, text):
                self._answer_batch(peer)
        elif ok:
            self._reply(peer, wire.producer_ack(msg_id, True, text))
        else:
            self._refuse(peer, msg_id, text or "store failed")

    def _answer_batch(self, w: BatchWaiter) -> None:
        if w.error is not None:
            self._refuse(w.peer, w.batch_id, w.error)
        else:
            self._reply(w.peer, wire.producer_ack(
                w.batch_id, True, wire.REPLICATION_FAILED if w.replication_failed else None))

    def _refusal_kind(self, reason: str) -> str:
        if reason == self.full_reason:
            return "full"
        if reason.startswith("store failed"):
            return "store_failed"
        if reason.startswith("Server busy"):
            return "busy"
        if "too large" in reason or "too big" in reason:
            return "too_large"
        return "invalid"

    def _reply(self, peer: bytes, frames: list[bytes]) -> None:
        self.counters["producer_acks"] += 1
        self.out.append(Reply(peer, frames))

    def refuse(self, peer: bytes, msg_id: bytes, reason: str) -> None:
        """Answer "0" with ``reason`` to input refused before it reached :meth:`produce` (the
        server's receive limits)."""
        self.counters["malformed"] += 1
        self._refuse(peer, msg_id, reason)

    def _refuse(self, peer: bytes, msg_id: bytes, reason: str) -> None:
        self.counters["producer_failures"] += 1
        self.refusals[self._refusal_kind(reason)] += 1
        self.out.append(Reply(peer, wire.producer_ack(msg_id, False, reason)))
