"""The producer side of a pzq queue: what each producer ACK waits for, and the answers. No I/O.

A producer's message is answered once it is durable: when the log reports its seq written
(and synced), or when a consumer ACKed it first, whatever the log is doing with it. With
``replicas``, its ACK also waits for its copies' confirmations, or for the replication
timeout (then "1" REPLICATION_FAILED). A message sent again (its id is in the queue's
idempotence window) waits for the first one, or is answered at once if that one is
durable. A producer's batch (wire.ProduceBatch) is answered once, when all its parts are.

:class:`ProducerSide` keeps that bookkeeping (the producers waiting by seq, the messages
being copied by key, their deadlines), the refusals by kind and the ACK latency. It stores
nothing and calls nothing back: its methods return the answers (:class:`Reply` actions) for
the queue core (queue.py) to record in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import TypeAlias, cast, final

from pzq import wire
from zbroker.runtime.stats import Buckets
from zbroker.services.pzq.core.actions import Reply
from zbroker.services.pzq.core.messages import Message

#: why producers get "0" ACKs, for metrics (QueueCore.refusals): the queue is full, the
#: message over max_message_size, invalid (malformed, id too long, too many frames), the
#: receiver holding too much (busy), or its write failed
REFUSAL_KINDS = ("full", "too_large", "invalid", "busy", "store_failed")
MAX_ID = wire.MAX_ID


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


#: whom a producer ACK goes to: a producer (its routing id), or a batch waiting for its parts
Producer: TypeAlias = bytes | BatchWaiter
#: a producer waiting for a message to be written: (peer, msg id, key), or a batch's record,
#: (its BatchWaiter, b"", None)
Waiting: TypeAlias = tuple[Producer, bytes, bytes | None]


class ProducerSide:
    def __init__(self, messages: dict[int, Message], counters: dict[str, int],
                 full_reason: str, max_frames: int, max_message_size: int, replicas: int,
                 replication_timeout: float):
        """``messages``: the queue's unACKed messages by seq (read, never changed here);
        ``counters``: the queue's (what producers sent and what they were answered is
        counted in it)."""
        self.messages = messages
        self.counters = counters
        self.full_reason = full_reason
        self.max_frames = max_frames
        self.max_message_size = max_message_size
        self.replicas = replicas
        self.replication_timeout = replication_timeout
        #: seq -> the producers waiting for it to be written: (peer, msg id, key); a
        #: batch's record is (its BatchWaiter, b"", None)
        self.waiting: dict[int, list[Waiting]] = {}
        self.replicating: dict[bytes, Replicating] = {}
        self._replica_deadlines: deque[tuple[float, bytes]] = deque()
        #: for metrics: producer ACK latency (seconds from arrival to the ACK of a stored
        #: message), and "0" ACKs by kind (REFUSAL_KINDS)
        self.ack_latency = Buckets()
        self.refusals = dict.fromkeys(REFUSAL_KINDS, 0)
        #: the wall clock in microseconds (the time keys start with), for the ACK latency;
        #: None: not measured (the I/O side gives it)
        self.clock_us: Callable[[], int] | None = None

    def now_us(self) -> int:
        """The wall clock for the ACK latency, 0 if it is not measured."""
        return self.clock_us() if self.clock_us is not None else 0

    # --- what producers send ------------------------------------------------------------------

    def admit(self, peer: bytes, frames: list[bytes]) -> wire.Produce | Reply | None:
        """A producer's message (frames after its routing id), decoded, unless it is refused
        (its answer, or None for input without an id to answer to)."""
        counters = self.counters
        if len(frames) > self.max_frames:
            counters["malformed"] += 1
            return self.refusal(peer, bytes(frames[0][:MAX_ID]),
                                wire.too_many_frames(self.max_frames))
        p = wire.decode_produce(frames)
        if isinstance(p, wire.WireError):
            counters["malformed"] += 1
            return (self.refusal(peer, p.msg_id[:MAX_ID], p.reason) if p.msg_id is not None
                    else None)
        counters["produced"] += 1
        if len(p.msg_id) > MAX_ID:
            return self.refusal(peer, p.msg_id[:MAX_ID], wire.ID_TOO_LONG)
        if p.size > self.max_message_size:
            return self.refusal(peer, p.msg_id, wire.too_large(p.size, self.max_message_size))
        return p

    def admit_batch(self, peer: bytes, frames: list[bytes]
                    ) -> wire.ProduceBatch | Reply | None:
        """A producer's batch (wire.ProduceBatch), decoded, unless it is refused (as
        :meth:`admit`)."""
        b = wire.decode_produce_batch(frames)
        counters = self.counters
        if isinstance(b, wire.WireError):
            counters["malformed"] += 1
            return (self.refusal(peer, b.msg_id[:MAX_ID], b.reason) if b.msg_id is not None
                    else None)
        counters["produced"] += len(b.ids)
        counters["batches"] += 1
        batch_id = b.batch_id[:MAX_ID]
        if len(b.packed) > self.max_message_size:
            return self.refusal(peer, batch_id, f"Batch too large: {len(b.packed)} bytes, "
                                                f"limit {self.max_message_size}")
        if not all(b.bodies):
            return self.refusal(peer, batch_id, wire.EMPTY)
        return b

    # --- new messages, and messages sent again ------------------------------------------------

    def wait(self, seq: int, producer: Producer, msg_id: bytes, key: bytes | None) -> None:
        """``producer`` waits for message ``seq`` (key None: a batch's record)."""
        self.waiting[seq] = [(producer, msg_id, key)]

    def copying(self, key: bytes, now: float, targets: int) -> None:
        """Message ``key`` is copied to peers: its ACK waits for them until the replication
        timeout; with fewer ``targets`` than replicas, it says REPLICATION_FAILED as soon as
        it is written here."""
        st = self.replicating[key] = Replicating(self.replicas)
        st.failed = targets < self.replicas
        self._replica_deadlines.append((now + self.replication_timeout, key))

    def repeated(self, producer: Producer, msg_id: bytes, seq: int | None, head: int
                 ) -> bool:
        """A producer sent ``msg_id`` again, stored before as message ``seq`` (None: in the
        same batch). True if it waits for that message's write (its seq not below ``head``)
        or copies; False if it is to be answered now (or, in a batch, not at all)."""
        self.counters["duplicates"] += 1
        m = self.messages.get(seq) if seq is not None else None
        if m is None:  # gone since (ACKed)
            return False
        if m.seq >= head:  # not durable yet: wait for it
            self.waiting.setdefault(m.seq, []).append((producer, msg_id, m.key))
            return True
        st = self.replicating.get(m.key)
        if st is not None:
            st.waiters.append((producer, msg_id))
            return True
        return False

    # --- answers ------------------------------------------------------------------------------

    def ack(self, peer: bytes, msg_id: bytes) -> Reply:
        """A plain "1" for ``msg_id``."""
        self.counters["producer_acks"] += 1
        return Reply(peer, wire.producer_ack(msg_id))

    def refusal(self, peer: bytes, msg_id: bytes, reason: str) -> Reply:
        """A "0" with ``reason``, counted by kind."""
        self.counters["producer_failures"] += 1
        self.refusals[self._refusal_kind(reason)] += 1
        return Reply(peer, wire.producer_ack(msg_id, False, reason))

    def batch_answer(self, w: BatchWaiter) -> Reply:
        """The one answer to a batch, all of whose parts are done."""
        if w.error is not None:
            return self.refusal(w.peer, w.batch_id, w.error)
        self.counters["producer_acks"] += 1
        return Reply(w.peer, wire.producer_ack(
            w.batch_id, True, wire.REPLICATION_FAILED if w.replication_failed else None))

    def written(self, seqs: Iterable[int], ok: bool, error: str | None,
                now_us: int) -> list[Reply]:
        """The log wrote (``ok``) or failed to write (``error``) these messages: the answers
        to the producers that waited for them (with copies, once those are confirmed too)."""
        out: list[Reply] = []
        for w in filter(None, map(self.waiting.pop, seqs, repeat(None))):
            self._written(w, ok, error, now_us, out)
        return out

    def consumed(self, seq: int) -> list[Reply]:
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
        out: list[Reply] = []
        if w:
            self._written(w, True, None, self.now_us(), out)
        return out

    def confirmed(self, key: bytes, ok: bool) -> list[Reply]:
        """A peer answered the copy of ``key`` ("1": it holds it)."""
        out: list[Reply] = []
        st = self.replicating.get(key)
        if st is not None and ok:
            st.got += 1
            self._replicated(key, st, out)
        return out

    def expire(self, now: float) -> list[Reply]:
        """Give up waiting for the copies whose timeout has passed."""
        out: list[Reply] = []
        d = self._replica_deadlines
        while d and d[0][0] <= now:
            _, key = d.popleft()
            st = self.replicating.get(key)
            if st is not None:
                st.failed = True
                self._replicated(key, st, out)
        return out

    def next_deadline(self) -> float | None:
        """When copies are next given up on (:meth:`expire`)."""
        d = self._replica_deadlines
        while d and d[0][1] not in self.replicating:
            d.popleft()
        return d[0][0] if d else None

    def ack_latency_of(self, key: bytes, now_us: int, n: int = 1) -> None:
        """``n`` producer ACKs of the message ``key`` go out now: the key starts with the
        time it arrived (produce)."""
        self.ack_latency.observe(max(0, now_us - wire.sent_us_of(key)) * 1e-6, n)

    # --- internals ----------------------------------------------------------------------------

    def _written(self, w: list[Waiting], ok: bool, error: str | None, now_us: int,
                 out: list[Reply]) -> None:
        """Answer the producers ``w`` that waited for one message's write (or failure)."""
        for peer, msg_id, key in w:
            st = self.replicating.get(key) if key is not None else None
            if not ok:
                self._answer(peer, msg_id, False, error or "store failed", out)
                if st is not None:  # (then key is not None)
                    del self.replicating[cast(bytes, key)]
            elif st is None:
                self._answer(peer, msg_id, True, None, out)
                if now_us and key is not None:
                    self.ack_latency_of(key, now_us)
            else:
                st.local = True
                st.waiters.append((peer, msg_id))
                # (st is not None: neither is key)
                self._replicated(cast(bytes, key), st, out)

    def _replicated(self, key: bytes, st: Replicating, out: list[Reply]) -> None:
        if not st.local or (st.got < st.need and not st.failed):
            return
        del self.replicating[key]
        done = st.got >= st.need
        self.counters["replicated" if done else "replication_failed"] += 1
        for peer, msg_id in st.waiters:
            self._answer(peer, msg_id, True, None if done else wire.REPLICATION_FAILED, out)
        if st.waiters and self.clock_us is not None:
            self.ack_latency_of(key, self.clock_us(), len(st.waiters))

    def _answer(self, peer: Producer, msg_id: bytes, ok: bool, text: str | None,
                out: list[Reply]) -> None:
        """A producer's message is stored (``ok``; ``text``: REPLICATION_FAILED or None) or
        failed (``text``: why). ``peer`` is a BatchWaiter for a part of a batch."""
        if type(peer) is BatchWaiter:
            if peer.part_done(ok, text):
                out.append(self.batch_answer(peer))
        elif ok:
            self.counters["producer_acks"] += 1
            out.append(Reply(peer, wire.producer_ack(msg_id, True, text)))
        else:
            out.append(self.refusal(peer, msg_id, text or "store failed"))

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
