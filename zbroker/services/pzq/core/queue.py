"""One pzq queue without its sockets: producers' messages in, deliveries and replies out.

The core decides; the server (server.py) moves frames, runs the clock and the log. The core
never calls the log: what to write, ACK or move there, and what to answer, it records as
typed actions (actions.py) that the caller takes with :meth:`QueueCore.take_output` and
carries out in order; what the log did comes back as a :class:`BatchResult` (``batch_done``:
the seqs it placed or failed). The core keeps:

- the unACKed messages (``messages``, by seq) and their keys (what consumers ACK with),
- the idempotence window (id_window.py): the last ``idempotence_window`` producer message
  ids (and at most ``idempotence_bytes`` of them), so that a retried id is answered, not
  stored twice,
- what they cost (``Budget``), the seqs and the ``head``, and what the log is asked to do.

It holds three parts, which keep their own bookkeeping and return what is to be done, for
the core to record in order; none of them calls the core:

- the producer side (producer_side.py): what each producer ACK waits for (the message's
  write, its copies) and the answers (the producer ACK goes out when the log reports its
  seq written and synced, or when a consumer ACKed the message first, whatever the log is
  doing with it; refused input is answered at once),
- the consumer side (consumer_side.py): the consumers, their deliveries (the dispatcher,
  dispatcher.py, decides who gets what and when it is due again), and the confirmations of
  credit consumers' ACKs,
- the adoption of copies taken over from lost peers (adoption.py).

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
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pzq import wire
from zbroker.runtime.stats import Buckets
from zbroker.services.pzq.core.actions import (
    AckMany,
    Append,
    AppendBatch,
    BatchResult,
    Confirm,
    Move,
    Replicate,
    Unreplicate,
)
from zbroker.services.pzq.core.adoption import Adoption
from zbroker.services.pzq.core.consumer_side import CONSUMERS, ConsumerSide
from zbroker.services.pzq.core.dispatcher import Deliveries, Delivery, Dispatcher
from zbroker.services.pzq.core.id_window import IdWindow
from zbroker.services.pzq.core.messages import Message, read_range
from zbroker.services.pzq.core.producer_side import REFUSAL_KINDS, BatchWaiter, ProducerSide
from zbroker.services.pzq.core.records import MessageRecord

__all__ = ["CONSUMERS", "MODES", "QUEUE_FULL", "REFUSAL_KINDS", "Budget", "Limits", "Message",
           "QueueCore"]

QUEUE_FULL = "Queue full"
ID_TOO_LONG = wire.ID_TOO_LONG
MAX_ID = wire.MAX_ID
#: how a queue's consumers get its messages: push (sent to them, ACKed one by one) or stream
#: (read by offset, committed; stream.py)
MODES = ("push", "stream")


@dataclass(frozen=True)
class Limits:
    """A queue's limits. The defaults here are the queue's defaults: the broker's config
    (zbroker.services.pzq.config.PzqQueueConfig) refers to them."""

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
        self.counters = dict.fromkeys((
            "produced", "stored", "producer_acks", "producer_failures", "duplicates",
            "malformed", "consumer_acks", "consumer_nacks", "unknown_acks", "delivered",
            "recovered", "replicated", "replication_failed", "committed_messages",
            "taken_back", "batches"), 0)
        # the parts (they share the messages, the dispatcher and the counters)
        self.producers = ProducerSide(self.messages, self.counters, full_reason, limits.max_frames,
                                      limits.max_message_size, limits.replicas,
                                      limits.replication_timeout)
        self.consumers = ConsumerSide(self.dispatcher, self.messages, self.counters,
                                      limits.ack_timeout, limits.inflight_window)
        self.adoption = Adoption(self.messages, self.keys, self.ids)
        #: the monotonic time from which nothing is delivered (replication.py's lease: peers
        #: may have taken our messages over since); inf: no lease to keep
        self.deliver_until = float("inf")
        self.out: list[Any] = []  # actions for the I/O (take_output)
        #: the AckMany of ``out`` that the next consumer ACK joins while ``out`` still ends
        #: where it did after it and its producers' answers: (that AckMany, that length)
        self._open_ack: tuple[AckMany, int] | None = None
        #: for the replication core: Replicate, Unreplicate, Adopted (take_replication)
        self.replication_out: list[Any] = []
        #: how many peers copies go to now; below ``replicas`` a new message's ACK says
        #: REPLICATION_FAILED as soon as it is written here, without waiting for the timeout
        self.replica_targets = limits.replicas
        self.held: list[int] = []  # recovered seqs not given to the dispatcher yet
        self.next_seq = 0
        self.head = 0  # every message below this seq is durable (or was dropped)
        self.backlog_bytes = 0
        self._prefix = str(uuid.uuid4())[:24].encode()  # "xxxxxxxx-xxxx-4xxx-yxxx-"

    # what the I/O side and the monitor read of the parts
    @property
    def clock_us(self) -> Callable[[], int] | None:
        """The wall clock in microseconds (the time keys start with), for the producer ACK
        latency; None: not measured (the I/O side gives it)."""
        return self.producers.clock_us

    @clock_us.setter
    def clock_us(self, clock: Callable[[], int] | None) -> None:
        self.producers.clock_us = clock

    @property
    def ack_latency(self) -> Buckets:
        return self.producers.ack_latency

    @property
    def refusals(self) -> dict[str, int]:
        return self.producers.refusals

    @property
    def credit_consumers(self) -> int:
        return self.consumers.credit_consumers

    @property
    def alone(self) -> set[int]:
        return self.consumers.alone

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
                self.consumers.goes_alone(r.seq)
            self.keys[r.key] = r.seq
            self.adoption.recovered(r.key, r.seq)
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
        p = self.producers.admit(peer, frames)
        if not isinstance(p, wire.Produce):
            if p is not None:
                self.out.append(p)
            return
        msg_id = p.msg_id
        size = wire.cost(msg_id, p.body)
        prior = self.ids.get(msg_id)
        if prior is not None:
            if not self.producers.repeated(peer, msg_id, prior, self.head):
                self.out.append(self.producers.ack(peer, msg_id))
            return
        budget = self.budget
        if (budget.bytes + size > self.limits.max_backlog
                or budget.messages >= self.limits.max_messages):
            return self._refuse(peer, msg_id, self.full_reason)
        seq = self.next_seq
        self.next_seq += 1
        key = wire.message_key(wire.key_base(now_us, self._prefix), seq)
        self._add(seq, key, msg_id, p.body, size)
        self.producers.wait(seq, peer, msg_id, key)
        if self.limits.replicas:
            self.producers.copying(key, now, self.replica_targets)
            self.replication_out.append(Replicate(key, p.body))

    def produce_batch(self, peer: bytes, frames: list[bytes], now_us: int,
                      now: float = 0.0) -> None:
        """A producer's batch (wire.ProduceBatch, frames after its routing id): its new
        messages go to the log as one record (all of them or none after a crash); one
        answer when every message of it is durable (or was before: ids are idempotent as
        one by one), or "0" and why for all of it."""
        b = self.producers.admit_batch(peer, frames)
        if not isinstance(b, wire.ProduceBatch):
            if b is not None:
                self.out.append(b)
            return
        limits, ids, bodies, n = self.limits, b.ids, b.bodies, len(b.ids)
        batch_id = b.batch_id[:MAX_ID]
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
        new: set[bytes] = set()  # (new_ids, to look in: a batch has up to wire.MAX_BATCH)
        first = self.next_seq
        for msg_id, body in zip(ids, bodies, strict=True):
            prior = self.ids.get(msg_id)
            if prior is None and msg_id not in new:
                new.add(msg_id)
                new_ids.append(msg_id)
                new_bodies.append(body)
                continue
            if self.producers.repeated(w, msg_id, prior, self.head):
                w.pending += 1
        if new_ids:
            n = len(new_ids)
            self.next_seq = first + n
            base = wire.key_base(now_us, self._prefix)
            self.out.append(AppendBatch(first, n, base, wire.pack(new_ids, new_bodies),
                                        self.log_name))
            self._add_batch(w, first, base, new_ids, new_bodies, now)
        elif w.pending == 0:
            self.out.append(self.producers.batch_answer(w))  # all of it stored before

    def _add_batch(self, w: BatchWaiter, first: int, base: bytes, ids: list[bytes],
                   bodies: list[bytes], now: float) -> None:
        """Take the messages of a batch record with seqs from ``first`` on."""
        messages, keys, producers = self.messages, self.keys, self.producers
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
                producers.wait(seq, w, msg_id, key)
                w.pending += 1
                producers.copying(key, now, self.replica_targets)
                self.replication_out.append(Replicate(key, (body,)))
        keys.update(zip(batch_keys, seqs, strict=True))
        self.ids.add_many(ids, first)  # (new and distinct: both callers made sure)
        if not self.stream:
            self.dispatcher.add_many(seqs, sizes)
        self._count(sum(sizes), len(ids))
        if not replicas:
            producers.wait(first, w, b"", None)  # the record: one part
            w.pending += 1

    def refuse(self, peer: bytes, msg_id: bytes, reason: str) -> None:
        """Answer "0" with ``reason`` to input refused before it reached :meth:`produce` (the
        server's receive limits)."""
        self.counters["malformed"] += 1
        self._refuse(peer, msg_id, reason)

    def _refuse(self, peer: bytes, msg_id: bytes, reason: str) -> None:
        self.out.append(self.producers.refusal(peer, msg_id, reason))

    # --- copies taken over ------------------------------------------------------------------

    def adopt(self, msg_id: bytes, frames: tuple[bytes, ...], now_us: int, token: Any,
              copy_key: bytes | None = None) -> None:
        """Take a message over with no producer waiting (a replica whose owner is lost);
        ``Adopted(token, ok, claim)`` goes to the replication core once the log has written
        it. ``copy_key``: its key at its origin; its new key here starts with the first key
        the message had (wire.adopted_key), so that it is known when it comes back under
        another key: our own message, or one taken over here before (no claim then)."""
        held, answer = self.adoption.held(msg_id, copy_key, token, self.head)
        if answer is not None:
            self.replication_out.append(answer)
        if held:
            return
        seq = self.next_seq
        self.next_seq += 1
        key = wire.message_key(wire.key_base(now_us, self._prefix), seq)
        if copy_key is not None:
            key = wire.adopted_key(copy_key, key)
        self.adoption.taking(seq, key, token, copy_key is not None)
        # not checked against max_backlog: a copy held here was counted there already
        self._add(seq, key, msg_id, frames, wire.cost(msg_id, frames))

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

    # --- the log ----------------------------------------------------------------------------

    def _add(self, seq: int, key: bytes, msg_id: bytes, body: tuple[bytes, ...],
             size: int) -> None:
        self.out.append(Append(seq, key, msg_id, body, self.log_name))
        self.messages[seq] = Message(seq, key, msg_id, body, size)
        if len(body) != 1:
            self.consumers.goes_alone(seq)
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
        if self.consumers.ack_waiters:
            self.out += self.consumers.durable(result.acked)
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
        producers, adopting = self.producers, self.adoption.adopting
        now_us = producers.now_us() if result.placed else 0
        for seqs in (result.placed, result.failed, result.acked):
            if adopting:
                self.replication_out += self.adoption.written(seqs, ok)
            if producers.waiting:
                self.out += producers.written(seqs, ok, result.error, now_us)
        if ok:
            self.counters["stored"] += len(result.placed)

    def unwritten(self, seqs: Sequence[int]) -> None:
        """The log let go of these messages' record before writing it: their consumers
        ACKed them first (write avoidance), so nothing of them is left to make durable.
        Their producers, and the credit consumers that wait for those ACKs, are answered
        now, not when the batch they were in completes (which reports them again, in
        ``acked``: answered once)."""
        self.out += self.producers.written(seqs, True, None, self.producers.now_us())
        if self.consumers.ack_waiters:
            self.out += self.consumers.durable(seqs)

    def compact(self, seqs: Iterable[int]) -> None:
        """The log wants these messages written again at its head (compaction): Move those
        still here."""
        for seq in seqs:
            m = self.messages.get(seq)
            if m is not None:
                self.out.append(Move(seq, m.key, m.msg_id, m.frames, self.log_name))

    # --- consumers --------------------------------------------------------------------------

    def consumers_changed(self, connected: int, cid: Hashable = CONSUMERS) -> None:
        """``connected`` consumers share ``cid`` (ConsumerSide.consumers_changed)."""
        self.consumers.consumers_changed(connected, cid)

    def credit_consumer(self, cid: Hashable, window: int, max_bytes: int | None = None
                        ) -> bool:
        """A consumer of the credit endpoint says READY (ConsumerSide.credit_consumer)."""
        return self.consumers.credit_consumer(cid, window, max_bytes)

    def consumer_gone(self, cid: Hashable) -> int:
        """A consumer of the credit endpoint cannot be reached (ConsumerSide.consumer_gone)."""
        return self.consumers.consumer_gone(cid)

    def next_delivery(self, now: float, now_us: int
                      ) -> tuple[Delivery | Deliveries,
                                 list[bytes] | list[bytes | list[bytes]]] | None:
        """The next delivery to send and its frames, or None (ConsumerSide.next_delivery)."""
        if now >= self.deliver_until:
            return None  # fenced: peers may deliver these now (replication.py)
        return self.consumers.next_delivery(now, now_us)

    def unsent(self, delivery: Delivery | Deliveries) -> None:
        """``delivery`` (or a batch) could not be sent: ready again, as it was."""
        self.consumers.unsent(delivery)

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
            self.adoption.delivered(a.key)
        self._drop(seq)
        if confirm_to is not None:
            self.consumers.confirm_when_durable(seq, confirm_to, a.key)

    def consumer_acks(self, keys: list[bytes], cid: Hashable, ack_id: bytes) -> None:
        """A batch consumer's ACK of ``keys``: each as :meth:`consumer_ack` (the log ACKs
        them in one AckMany); one Confirm (``ack_id``, ACKED) once all those that were in
        the queue are durable."""
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
                    self.adoption.delivered(key)
        self.counters["unknown_acks"] += len(keys) - len(acked)
        if not acked:
            self.out.append(Confirm(cid, ack_id, wire.ACKED))
            return
        self.dispatcher.ack_many(acked)
        if copies is None and self.producers.waiting:
            for seq in acked:
                if seq in self.producers.waiting:
                    self._consumed(seq)
        self.consumers.confirm_all_when_durable(acked, cid, ack_id)
        self.counters["consumer_acks"] += len(acked)
        self._count(-size, -len(acked))
        self.out.append(AckMany(acked, self.log_name))

    def _drop(self, seq: int) -> None:
        m = self.messages.pop(seq)
        del self.keys[m.key]
        self._count(-m.size, -1)
        self._log_ack(seq)
        if self.limits.replicas:
            self.replication_out.append(Unreplicate(m.key))
        elif seq in self.producers.waiting:
            self._consumed(seq)

    def _consumed(self, seq: int) -> None:
        """A consumer ACKed message ``seq`` before the log said it was durable: its
        producers are answered now (ProducerSide.consumed)."""
        answers = self.producers.consumed(seq)
        if answers:
            open_ack, before = self._open_ack, len(self.out)
            self.out += answers
            if open_ack is not None and open_ack[1] == before:  # answers only: the next
                self._open_ack = (open_ack[0], len(self.out))  # ACK may still join it

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
        """(next, messages): the durable messages of [max(start, floor), end) in order, as
        many as fit (messages.read_range)."""
        return read_range(self.messages, self.head, start, end, floor, max_bytes,
                          max_messages)

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

    # --- copies and the clock ---------------------------------------------------------------

    def replica_confirmed(self, key: bytes, ok: bool) -> None:
        """A peer answered the copy of ``key`` ("1": it holds it)."""
        self.out += self.producers.confirmed(key, ok)

    def next_replication_deadline(self) -> float | None:
        return self.producers.next_deadline()

    def tick(self, now: float) -> list[int]:
        """Requeue the messages whose ACK timeout has passed; give up waiting for replicas
        whose timeout has passed."""
        self.out += self.producers.expire(now)
        return self.dispatcher.expire(now)

    def next_deadline(self) -> float | None:
        return self.dispatcher.next_deadline()

    def _count(self, size: int, n: int) -> None:
        self.backlog_bytes += size
        self.budget.bytes += size
        self.budget.messages += n
