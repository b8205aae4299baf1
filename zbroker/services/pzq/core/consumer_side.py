"""The consumer side of a pzq push queue: who consumes, what is sent to them, and the ACK
confirmations they wait for. No I/O.

Consumers are the send endpoint's (one id, ``CONSUMERS``, whose credit is a window for each
connected consumer) and the credit endpoint's (known by their id, each with the window it
said in READY; a *batch consumer* also gives the most bytes it holds, and gets its messages
in batches). The dispatcher (dispatcher.py) decides who gets which message and when one is
due again; :class:`ConsumerSide` keeps the consumers' kinds and encodes the deliveries: one
message, or a batch of as many as the window takes (a message of several body frames, or
none, goes alone).

A credit consumer's ACK is confirmed (ACKED) once a crash can no longer undo it: the log
says when (``durable``). A batch consumer's ACK of many keys is one :class:`AckGroup`,
confirmed once all of them are.

It calls nothing back: the queue core (queue.py) asks, and records what it returns.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from itertools import repeat
from typing import TypeAlias, final

from pzq import wire
from zbroker.services.pzq.core.actions import Confirm
from zbroker.services.pzq.core.dispatcher import Deliveries, Delivery, Dispatcher
from zbroker.services.pzq.core.messages import Message

CONSUMERS = "*"  # the one consumer id when consumers are not told apart (a DEALER socket)
MAX_CREDIT_CONSUMERS = 10_000  # consumers known by their credit (READY) at once
MAX_DELIVERY_BATCH = 1024  # messages in one batch to a batch consumer


@final  # (so that mypy narrows ``type(x) is AckGroup`` in both branches)
class AckGroup:
    """A batch consumer's ACK of many keys: confirmed (ACKED) once all are durable."""

    __slots__ = ("consumer", "ack_id", "pending")

    def __init__(self, consumer: Hashable, ack_id: bytes):
        self.consumer = consumer
        self.ack_id = ack_id
        self.pending = 0


#: a credit consumer waiting for its ACK to be durable: (consumer, key), or a batch's ACK
AckWaiter: TypeAlias = tuple[Hashable, bytes] | AckGroup


class ConsumerSide:
    def __init__(self, dispatcher: Dispatcher, messages: dict[int, Message],
                 counters: dict[str, int], ack_timeout: float, inflight_window: int):
        """``messages``: the queue's unACKed messages by seq (read, never changed here);
        ``counters``: the queue's (``delivered`` is counted in it)."""
        self.dispatcher = dispatcher
        self.messages = messages
        self.counters = counters
        self.inflight_window = inflight_window
        self._timeout_us = int(ack_timeout * 1e6)
        self.credit_consumers = 0  # consumers of the credit endpoint (known by their id)
        #: consumers of the credit endpoint that take batches: id -> most bytes in a batch
        self.batch_consumers: dict[Hashable, int] = {}
        #: seqs of the messages of several body frames (or none): each goes alone to a batch
        #: consumer. Seqs are never reused, so those of messages gone since may stay a while
        self.alone: set[int] = set()
        #: seq -> (consumer, key), or the AckGroup of a batch consumer's ACK
        self.ack_waiters: dict[int, AckWaiter] = {}

    # --- who consumes ---------------------------------------------------------------------

    def consumers_changed(self, connected: int, cid: Hashable = CONSUMERS) -> None:
        """``connected`` consumers share ``cid``: its credit is a window for each. When the
        last one leaves, what was in flight cannot be ACKed on its connection any more: it is
        ready again at once (a late ACK from a new connection is still honoured)."""
        if connected == 0:
            self.dispatcher.remove_consumer(cid)
        self.dispatcher.set_consumer(cid, self.inflight_window * connected)

    def credit_consumer(self, cid: Hashable, window: int, max_bytes: int | None = None
                        ) -> bool:
        """A consumer of the credit endpoint says READY with its window: it gets at most
        ``window`` messages unACKed; with ``max_bytes`` it takes batches, and holds at most
        that many bytes of bodies unACKed (one message at least). False if there are too
        many such consumers already."""
        consumers = self.dispatcher.consumers
        if cid not in consumers and self.credit_consumers >= MAX_CREDIT_CONSUMERS:
            return False
        if cid not in consumers:
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

    # --- deliveries -----------------------------------------------------------------------

    def next_delivery(self, now: float, now_us: int
                      ) -> tuple[Delivery | Deliveries,
                                 list[bytes] | list[bytes | list[bytes]]] | None:
        """The next delivery to send and its frames, or None. To a batch consumer, a batch:
        as many messages as its window takes (at most MAX_DELIVERY_BATCH) until one of
        several body frames, which goes alone."""
        dispatcher = self.dispatcher
        d = dispatcher.next_delivery(now)
        if d is None:
            return None
        messages, counters = self.messages, self.counters
        m = messages[d.seq]
        if d.consumer not in self.batch_consumers or d.seq in self.alone:
            counters["delivered"] += 1
            return d, wire.delivery(m.key, now_us, self._timeout_us, m.frames)
        batch = dispatcher.more_to(d.consumer, now, MAX_DELIVERY_BATCH - 1, self.alone)
        batch.seqs.insert(0, d.seq)
        batch.attempts.insert(0, d.attempt)
        sent = [messages[seq] for seq in batch.seqs]
        counters["delivered"] += len(sent)
        return batch, wire.batch_delivery(now_us, self._timeout_us, [m.key for m in sent],
                                          [m.frames[0] for m in sent])

    def unsent(self, delivery: Delivery | Deliveries) -> None:
        """``delivery`` (or a batch) could not be sent: ready again, as it was."""
        self.counters["delivered"] -= (len(delivery.seqs) if type(delivery) is Deliveries
                                       else 1)
        self.dispatcher.unsent(delivery)

    def goes_alone(self, seq: int) -> None:
        """Message ``seq`` has several body frames (or none); the seqs of messages gone
        meanwhile are let go once they are most of the set."""
        alone = self.alone
        alone.add(seq)
        if len(alone) > 64 and len(alone) > 2 * len(self.messages):
            self.alone = {s for s in alone if s in self.messages}

    # --- ACK confirmations ----------------------------------------------------------------

    def confirm_when_durable(self, seq: int, cid: Hashable, key: bytes) -> None:
        """Credit consumer ``cid`` ACKed ``key`` (message ``seq``): ACKED once durable."""
        self.ack_waiters[seq] = (cid, key)

    def confirm_all_when_durable(self, seqs: list[int], cid: Hashable, ack_id: bytes
                                 ) -> None:
        """Batch consumer ``cid`` ACKed these messages as ``ack_id``: one ACKED once all of
        them are durable."""
        group = AckGroup(cid, ack_id)
        group.pending = len(seqs)
        self.ack_waiters.update(dict.fromkeys(seqs, group))

    def durable(self, seqs: Iterable[int]) -> list[Confirm]:
        """The consumer ACKs of ``seqs`` cannot be undone by a crash any more: the
        confirmations to the credit consumers waiting for that."""
        out: list[Confirm] = []
        found: list[AckWaiter] = list(filter(None, map(self.ack_waiters.pop, seqs,
                                                      repeat(None))))
        if not found:
            return out
        first = found[0]
        if type(first) is AckGroup and found.count(first) == len(found):  # one batch ACK
            first.pending -= len(found)
            if first.pending == 0:
                out.append(Confirm(first.consumer, first.ack_id, wire.ACKED))
            return out
        for w in found:
            if type(w) is AckGroup:
                w.pending -= 1
                if w.pending == 0:
                    out.append(Confirm(w.consumer, w.ack_id, wire.ACKED))
            else:
                out.append(Confirm(w[0], w[1], wire.ACKED))
        return out
