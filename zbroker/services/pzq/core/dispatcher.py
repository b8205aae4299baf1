"""Who gets which message next, and when a message is due again. No I/O, no clock.

Messages are known by their seq; consumers by any hashable id. The dispatcher keeps:

- the ready queue (FIFO; a NACKed or timed-out message goes to the front),
- per consumer a credit: the most messages it may hold unACKed (its window),
- a global cap on bytes in flight,
- per message in flight its consumer, and per send (one message, or a batch) its deadline
  (all deadlines come from one ack timeout, so they are in order: timing out is a look at
  the front of a deque, no rescans),
- the attempts of the messages sent before and back (the others: 0 when ready, 1 in flight).

Rules:
- ``next_delivery`` gives the oldest ready message to the least-loaded consumer that has
  credit; nothing while no consumer has credit.
- ``expire(now)`` requeues only messages whose deadline has passed.
- ``ack`` removes a message wherever it is: in flight, or back in the ready queue after a
  timeout (a late ACK is honoured, the message is not sent again).
- ``nack`` requeues at once, at the front.
- ``unsent`` gives a send back as if it never happened (its connection could not take it).
- a consumer that leaves gives its messages back to the ready queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import islice, repeat
from typing import final

READY = "ready"


@dataclass
class Consumer:
    id: Hashable
    credit: int
    inflight: set[int] = field(default_factory=set)
    paused: bool = False  # its connection is full for now: skipped, credit kept
    max_bytes: int = 1 << 62  # its window in bytes: more only while below (one at least)
    inflight_bytes: int = 0

    @property
    def free(self) -> int:
        return self.credit - len(self.inflight)


@final  # (so that mypy narrows ``type(x) is Delivery`` in both branches)
@dataclass(slots=True)
class Delivery:
    seq: int
    consumer: Hashable
    attempt: int  # 1 for the first delivery


@dataclass(slots=True)
class Deliveries:
    """Messages that go to one consumer together (a batch consumer's delivery), in order."""

    consumer: Hashable
    seqs: list[int]
    attempts: list[int]  # each one's, as Delivery.attempt


class Dispatcher:
    def __init__(self, ack_timeout: float, max_inflight_bytes: int = 1 << 62):
        self.ack_timeout = ack_timeout
        self.max_inflight_bytes = max_inflight_bytes
        self.consumers: dict[Hashable, Consumer] = {}
        self._ready: deque[int] = deque()
        self._where: dict[int, Hashable] = {}  # seq -> READY or the consumer holding it
        self._size: dict[int, int] = {}
        #: seq -> its sends so far, kept only for a message sent before and not in flight,
        #: or in flight again: none for one never sent (0) or in flight once (1), the usual
        #: case, so that most messages never have an entry
        self._attempts: dict[int, int] = {}
        #: (deadline, seqs, their attempts) of each send (a batch's: one entry for all)
        self._deadlines: deque[tuple[float, Sequence[int], Sequence[int]]] = deque()
        self.inflight_bytes = 0
        self.inflight = 0
        self.expired = 0
        self.redelivered = 0

    # --- consumers -------------------------------------------------------------------------

    def set_consumer(self, cid: Hashable, credit: int, max_bytes: int = 1 << 62) -> None:
        """Add a consumer, or change its credit (messages and bytes unACKed)."""
        c = self.consumers.get(cid)
        if c is None:
            self.consumers[cid] = Consumer(cid, credit, max_bytes=max_bytes)
        else:
            c.credit = credit
            c.max_bytes = max_bytes

    def pause(self, cid: Hashable, paused: bool = True) -> None:
        """Skip (or no longer skip) ``cid`` when choosing whom to send to."""
        c = self.consumers.get(cid)
        if c is not None:
            c.paused = paused

    def remove_consumer(self, cid: Hashable) -> list[int]:
        """The consumer is gone: its messages go back to the front of the ready queue."""
        c = self.consumers.pop(cid, None)
        if c is None:
            return []
        back = sorted(c.inflight)
        for seq in reversed(back):
            self._unflight(seq)
            self._to_front(seq)
        return back

    # --- messages --------------------------------------------------------------------------

    def add(self, seq: int, size: int) -> None:
        """A new message, ready for delivery."""
        self._size[seq] = size
        self._where[seq] = READY
        self._ready.append(seq)

    def add_many(self, seqs: Sequence[int], sizes: Sequence[int]) -> None:
        """New messages (a producer's batch), ready for delivery in this order."""
        self._size.update(zip(seqs, sizes, strict=True))
        self._where.update(dict.fromkeys(seqs, READY))
        self._ready.extend(seqs)

    def __contains__(self, seq: int) -> bool:
        return seq in self._where

    def __len__(self) -> int:
        return len(self._where)

    @property
    def ready(self) -> int:
        return sum(1 for s in self._ready if self._where.get(s) == READY)

    def next_delivery(self, now: float) -> Delivery | None:
        """The next message to send and to whom; marks it in flight until now+ack_timeout."""
        while self._ready:
            seq = self._ready[0]
            if self._where.get(seq) != READY:
                self._ready.popleft()  # ACKed or dropped meanwhile
                continue
            size = self._size[seq]
            if self.inflight and self.inflight_bytes + size > self.max_inflight_bytes:
                return None
            consumer = self._least_loaded(size)
            if consumer is None:
                return None
            return self._send(seq, size, consumer, now)
        return None

    def more_to(self, cid: Hashable, now: float, limit: int, alone: AbstractSet[int]
                ) -> Deliveries:
        """More of a batch to consumer ``cid``: up to ``limit`` messages in ready order, while
        its windows and the bytes in flight allow, stopping at one that must go alone (in
        ``alone``); marked in flight as :meth:`next_delivery` does."""
        consumer = self.consumers[cid]
        ready, where, sizes = self._ready, self._where, self._size
        room = min(limit, consumer.credit - len(consumer.inflight))
        room_bytes = min(self.max_inflight_bytes - self.inflight_bytes,
                         consumer.max_bytes - consumer.inflight_bytes)
        # the common case in one go: the first ``room`` ready ones all fit and may all go
        seqs = list(islice(ready, max(room, 0)))
        if seqs and list(map(where.get, seqs)).count(READY) == len(seqs):
            total = sum(map(sizes.__getitem__, seqs))
            if total <= room_bytes and alone.isdisjoint(seqs):
                for _ in seqs:
                    ready.popleft()
                return Deliveries(cid, seqs, self._send_batch(seqs, total, consumer, now))
        seqs = []
        total = 0
        while ready and len(seqs) < room:
            seq = ready[0]
            if where.get(seq) != READY:
                ready.popleft()  # ACKed or dropped meanwhile
                continue
            size = sizes[seq]
            if total + size > room_bytes or seq in alone:
                break
            ready.popleft()
            seqs.append(seq)
            total += size
        return Deliveries(cid, seqs, self._send_batch(seqs, total, consumer, now))

    def _send(self, seq: int, size: int, consumer: Consumer, now: float) -> Delivery:
        """``seq``, first in the ready queue, goes to ``consumer``."""
        self._ready.popleft()
        attempt = self._attempts.get(seq, 0) + 1
        if attempt > 1:
            self._attempts[seq] = attempt
            self.redelivered += 1
        self._where[seq] = consumer.id
        consumer.inflight.add(seq)
        consumer.inflight_bytes += size
        self.inflight += 1
        self.inflight_bytes += size
        self._deadlines.append((now + self.ack_timeout, (seq,), (attempt,)))
        return Delivery(seq, consumer.id, attempt)

    def _send_batch(self, seqs: list[int], size: int, consumer: Consumer, now: float
                    ) -> list[int]:
        """:meth:`_send` for ``seqs`` (``size`` bytes), taken from the ready queue, with the
        dict and set operations done over all of them: their attempts."""
        if not seqs:
            return []
        attempts_of = self._attempts
        before = list(map(attempts_of.get, seqs, repeat(0))) if attempts_of else ()
        if any(before):  # (kept for all of them: one sent before is)
            attempts = [a + 1 for a in before]
            attempts_of.update(zip(seqs, attempts, strict=True))
            self.redelivered += len(seqs) - attempts.count(1)
        else:  # all sent for the first time: nothing to keep
            attempts = [1] * len(seqs)
        self._where.update(dict.fromkeys(seqs, consumer.id))
        consumer.inflight.update(seqs)
        consumer.inflight_bytes += size
        self.inflight += len(seqs)
        self.inflight_bytes += size
        # (copies: the caller may add to the lists it is given)
        self._deadlines.append((now + self.ack_timeout, tuple(seqs), tuple(attempts)))
        return attempts

    def unsent(self, sent: Delivery | Deliveries) -> None:
        """What was sent could not be after all (given back at once, before anything else
        is sent): back to the front as it was, not counted, and without its deadline."""
        if type(sent) is Delivery:
            sent = Deliveries(sent.consumer, [sent.seq], [sent.attempt])
        # that send's deadline entries are the newest: let them go, or one would time the
        # message out early once it is sent again (with the same attempt number)
        seqs = set(sent.seqs)
        while self._deadlines and seqs.issuperset(self._deadlines[-1][1]):
            self._deadlines.pop()
        for seq, attempt in zip(reversed(sent.seqs), reversed(sent.attempts), strict=True):
            if self._where.get(seq) != sent.consumer:
                continue
            self._unflight(seq)  # (its sends are kept now: one at least)
            if attempt > 1:
                self._attempts[seq] = attempt - 1
                self.redelivered -= 1
            else:
                del self._attempts[seq]  # never sent, after all
            self._to_front(seq)

    def ack(self, seq: int) -> bool:
        """Done with ``seq``: forget it. False if it was not known (a duplicate ACK)."""
        where = self._where.get(seq)
        if where is None:
            return False
        size = self._size.pop(seq)
        if where != READY:
            self._release(where, seq, size)
        del self._where[seq]
        self._attempts.pop(seq, None)
        return True

    def ack_many(self, seqs: Iterable[int]) -> None:
        """:meth:`ack` each of ``seqs`` (a batch consumer's ACK), the dict and set operations
        done over all of them."""
        seqs = list(seqs)
        wheres = list(map(self._where.pop, seqs, repeat(None)))
        if None in wheres:  # not known: duplicate ACKs
            seqs = [s for s, w in zip(seqs, wheres, strict=True) if w is not None]
            wheres = [w for w in wheres if w is not None]
        if not seqs:
            return
        sizes = list(map(self._size.pop, seqs))
        if self._attempts:
            deque(map(self._attempts.pop, seqs, repeat(None)), maxlen=0)
        holder = wheres[0]
        if holder != READY and wheres.count(holder) == len(wheres):  # all in flight to one
            c = self.consumers.get(holder)
            total = sum(sizes)
            if c is not None:
                c.inflight.difference_update(seqs)
                c.inflight_bytes -= total
            self.inflight -= len(seqs)
            self.inflight_bytes -= total
            return
        for seq, where, size in zip(seqs, wheres, sizes, strict=True):
            if where != READY:  # in flight
                self._release(where, seq, size)

    def nack(self, seq: int) -> bool:
        """The consumer failed ``seq``: deliver it again now (at the front)."""
        where = self._where.get(seq)
        if where is None or where == READY:
            return where is not None
        self._unflight(seq)
        self._to_front(seq)
        return True

    def drop(self, seq: int) -> None:
        """Forget ``seq`` whatever its state (it could not be stored)."""
        self.ack(seq)

    def expire(self, now: float) -> list[int]:
        """Requeue (at the front, oldest first) every message whose deadline has passed."""
        due: list[int] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, seqs, attempts = deadlines.popleft()
            for seq in self._still_in_flight(seqs, attempts):
                self._unflight(seq)
                due.append(seq)
        for seq in reversed(due):
            self._to_front(seq)
        self.expired += len(due)
        return due

    def next_deadline(self) -> float | None:
        """When ``expire`` next has something to do (stale deadlines are dropped first)."""
        deadlines, where = self._deadlines, self._where
        while deadlines:
            deadline, seqs, attempts = deadlines[0]
            if len(seqs) == 1:  # a single send's, with no list made (most are ACKed)
                at = where.get(seqs[0])
                if (at is not None and at != READY
                        and self._attempts.get(seqs[0], 1) == attempts[0]):
                    return deadline
            elif self._still_in_flight(seqs, attempts):
                return deadline
            deadlines.popleft()
        return None

    def _still_in_flight(self, seqs: Sequence[int], attempts: Sequence[int]) -> list[int]:
        """Those of ``seqs`` still in flight from the send of these ``attempts`` (not ACKed,
        NACKed or sent again since: for the others, that deadline is stale)."""
        wheres = list(map(self._where.get, seqs))
        if wheres.count(None) == len(wheres):  # all ACKed: the common case, in one go
            return []
        attempts_of = self._attempts
        return [seq for seq, where, attempt in zip(seqs, wheres, attempts, strict=True)
                if where is not None and where != READY
                and attempts_of.get(seq, 1) == attempt]

    def attempts(self, seq: int) -> int:
        where = self._where.get(seq)
        if where is None:
            return 0
        return self._attempts.get(seq, 0 if where == READY else 1)

    # --- internals -------------------------------------------------------------------------

    def _least_loaded(self, size: int) -> Consumer | None:
        """The consumer with the fewest messages in flight that may take one of ``size``
        bytes (a consumer with nothing in flight takes any size)."""
        best = None
        for c in self.consumers.values():
            if (c.free > 0 and not c.paused
                    and (best is None or len(c.inflight) < len(best.inflight))
                    and (not c.inflight or c.inflight_bytes + size <= c.max_bytes)):
                best = c
        return best

    def _to_front(self, seq: int) -> None:
        """``seq`` is ready again, first in line."""
        self._where[seq] = READY
        self._ready.appendleft(seq)

    def _unflight(self, seq: int) -> None:
        """``seq`` is in flight no more: it is ready again (its sends are kept from now on,
        a first one too)."""
        self._attempts.setdefault(seq, 1)
        self._release(self._where[seq], seq, self._size[seq])
        self._where[seq] = READY

    def _release(self, holder: Hashable, seq: int, size: int) -> None:
        """``seq`` (``size`` bytes) is no longer in flight to consumer ``holder``."""
        c = self.consumers.get(holder)
        if c is not None:
            c.inflight.discard(seq)
            c.inflight_bytes -= size
        self.inflight -= 1
        self.inflight_bytes -= size
