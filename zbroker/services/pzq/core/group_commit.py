"""When a log's writer writes and fdatasyncs: the group-commit policy. No threads, no files,
no clock (the time is passed in).

The store (store.py) queues records in memory as they come; its writer thread holds them in
arrival order and asks this policy, under the store's lock, what to do:

    batch, wake = policy.record(size, now)  # a record is queued: its batch number, and
                                            # whether the writer must look now
    wake = policy.ack(now, avoided, count)  # ``count`` ACKs are queued; ``avoided``: queued
                                            # records were ACKed by their consumer (never
                                            # written)
    policy.wait(waiting, live, now, stopping)
                                            # the writer looks (``live``: the bytes of the
                                            # waiting records still to be written): 0, write
                                            # now; None, nothing waits; else seconds to sleep
                                            # (then look again)
    n = policy.take(waiting)                # the write starting now takes waiting[:n] and
                                            # every ACK queued
    policy.written(ok, now)                 # how that write went

Sync modes:

    batch   a batch gathers records for up to ``window`` seconds after the first one waiting
            while they keep coming, then the writer writes and fdatasyncs once. Gathering,
            the writer looks every tenth of the window (``linger``) from when it began, and
            writes as soon as nothing new came in the last one (a producer that waits for
            each ACK, a burst that ended): a lone message is not held for the whole window.
            When the writer looks afresh (a write ended, or it was woken late) and the
            oldest record has already waited a linger or more, it writes at once: what
            comes meanwhile gathers during that write, instead of the disk waiting out a
            gathering (a younger record is given one linger to grow). A batch
            holds at most ``max_batch_bytes`` (or one message, if larger): it closes when
            the next record would take it past that, a closed batch is written at once, and
            one write takes whole batches of at most ``max_batch_bytes`` of live records
            together (one batch at least), so that the first messages of a burst are ACKed
            after their own part of it is synced, not after the whole burst.
            While consumers ACK records that wait (write avoidance: such a record is never
            written, and its producer is answered at once), the gathering grows AVOIDING
            times: it may go on for up to AVOIDING windows, looking every AVOIDING lingers
            (a writer that looks less often takes the GIL from the event loop less often),
            and closed batches wait too until more than AVOIDING times ``max_batch_bytes``
            of live records wait. When such a gathering ends at its deadline, the write
            takes only the records that have waited at least AVOIDING / 2 windows: the
            younger ones are most likely on their way to a consumer, and wait for the next
            write (by then they are old enough: none waits more than AVOIDING windows).
            With consumers that keep up, nearly every record is then ACKed before it is
            written, which saves its write, the fdatasyncs and the CPU of both. Consumers
            count as keeping up until AVOIDING windows after the last such ACK (a write
            that took every record leaves them nothing to ACK for a while); a record nobody
            consumes still waits at most AVOIDING windows.
    always  one fdatasync per message: each record is a batch of its own and one write takes
            one live record (records ACKed before they were written, and ACK records, ride
            along); no gathering.
    none    no fdatasync: batches as in ``batch``, written as soon as they are there.

After a failed write, the next one waits ``backoff``: BACKOFF_MIN, doubling while writes keep
failing, up to BACKOFF_MAX; a good write resets it. Stopping ends every wait: what waits is
written at once, whole batches of at most ``max_batch_bytes`` a write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

SYNC_MODES = ("batch", "always", "none")
#: a Store's defaults, and so a queue's (zbroker.services.pzq.config.PzqQueueConfig refers to them)
DEFAULT_SYNC = "batch"
DEFAULT_SYNC_WINDOW = 0.002  # seconds a batch gathers messages before its fdatasync
DEFAULT_MAX_BATCH_BYTES = 1 << 20  # a batch closes there: one fdatasync covers at most this
LINGER = 0.1  # of the window: written once nothing new came for that long
AVOIDING = 5  # windows a batch may gather while consumers ACK the records that wait
BACKOFF_MIN = 0.01  # seconds the writer waits after a failed write, doubling while it fails
BACKOFF_MAX = 1.0


class Waiting(Protocol):
    """A record waiting for the writer, as the policy sees it."""

    batch: int  # the number record() gave it
    size: int  # bytes, as given to record()
    alive: bool  # False: ACKed before it was written, so not written (it costs no bytes)
    at: float  # when it was queued


class GroupCommit:
    def __init__(self, sync: str = DEFAULT_SYNC, window: float = DEFAULT_SYNC_WINDOW,
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES):
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, got {sync!r}")
        if max_batch_bytes <= 0:
            raise ValueError(f"max_batch_bytes must be > 0, got {max_batch_bytes}")
        self.sync = sync
        self.window = max(0.0, window)
        self.linger = self.window * LINGER
        self.max_batch_bytes = max_batch_bytes
        self.gathers = sync == "batch" and self.window > 0
        self.batch = 0  # the open batch: the number of the records queued now
        self.open_bytes = 0  # bytes queued in the open batch
        self.first_at: float | None = None  # when the oldest record or ACK waiting came
        self.arrivals = 0  # records and ACKs queued so far
        self.avoided_at = -math.inf  # when a consumer last ACKed a record that waits
        self._look: tuple[float, int] | None = None  # gathering: when the writer last
        # looked, and the arrivals then
        #: the write starting now leaves the records that came after this (None: it takes
        #: what its batches allow); set when consumers keep up (see wait())
        self._cut: float | None = None
        self.backoff = 0.0  # how long the write after a failed one waits
        self.retry_at = 0.0  # no write before this (a failed write's backoff)

    def record(self, size: int, now: float) -> tuple[int, bool]:
        """A record of ``size`` bytes is queued: (its batch number, whether the writer must
        look now: it is the first thing waiting, or it closed the batch before it)."""
        closed = bool(self.open_bytes) and self.open_bytes + size > self.max_batch_bytes
        if closed:
            self.batch += 1
            self.open_bytes = 0
        batch = self.batch
        if self.sync == "always":
            self.batch += 1
        else:
            self.open_bytes += size
        return batch, self._arrived(now) or closed

    def ack(self, now: float, avoided: bool = False, count: int = 1) -> bool:
        """``count`` ACK records are queued, or (``avoided``) records that wait were ACKed
        by their consumer, so they will not be written (new records may follow): whether
        the writer must look now (they are the first thing waiting)."""
        if avoided:
            self.avoided_at = now
        return self._arrived(now, count)

    def _arrived(self, now: float, count: int = 1) -> bool:
        self.arrivals += count
        if self.first_at is None:
            self.first_at = now
            return True
        return False

    def wait(self, waiting: Sequence[Waiting], live: int, now: float, stopping: bool = False
             ) -> float | None:
        """The writer looks, at ``now``, with ``live`` bytes of the waiting records still to
        be written: how long it waits before its next write. 0.0, write now; None, nothing
        waits (an arrival that needs the writer wakes it: record() and ack() say so); else
        the seconds it may sleep, after which (or after a wake) it looks again."""
        self._cut = None
        if self.first_at is None:
            return None
        if stopping:
            return 0.0
        if now < self.retry_at:
            return self.retry_at - now
        deadline, linger = self.first_at + self.window, self.linger
        closed = bool(waiting) and waiting[0].batch < self.batch
        avoiding = self.gathers and now - self.avoided_at < self.window * AVOIDING
        if avoiding:  # consumers keep up: gather on
            deadline, linger = self.first_at + self.window * AVOIDING, linger * AVOIDING
            closed = closed and live > self.max_batch_bytes * AVOIDING
        if not self.gathers or now >= deadline or closed:
            if avoiding and not closed:  # the young records wait for the next write
                self._cut = now - self.window * AVOIDING / 2
            return 0.0
        look = self._look
        if look is None and not avoiding and now - self.first_at >= linger:
            return 0.0  # waited a linger already (during a write, or for the writer)
        if look is not None and now < look[0] + linger:
            return min(deadline, look[0] + linger) - now  # woken before its linger
        if look is not None and look[1] == self.arrivals:
            return 0.0  # nothing new for a linger
        self._look = (now, self.arrivals)
        return min(deadline - now, linger)

    def take(self, waiting: Sequence[Waiting]) -> int:
        """How many of the waiting records, oldest first, the write that starts now takes
        (every ACK queued goes with it): whole batches, at most ``max_batch_bytes`` of live
        records (one batch at least), and, at the end of a gathering while consumers keep
        up, up to the first live one that came after the cut wait() set (possibly none at
        all: the ACKs go alone, or nothing is written); with ``always``, up to the first
        live record."""
        cut, self._cut = self._cut, None
        if self.sync == "always":
            n = next((i + 1 for i, e in enumerate(waiting) if e.alive), len(waiting))
        else:
            n = self._whole_batches(waiting)
            if cut is not None:  # up to the first live record that came after it
                n = next((i for i in range(n) if waiting[i].alive and waiting[i].at > cut), n)
            if n and waiting[n - 1].batch == self.batch:
                if n < len(waiting) and waiting[n].batch == self.batch:  # cut within it:
                    self.open_bytes -= sum(e.size for e in waiting[:n]  # it stays open
                                           if e.batch == self.batch)
                else:
                    self.batch += 1  # the open batch is taken: later records start the next
                    self.open_bytes = 0
        self.first_at = waiting[n].at if n < len(waiting) else None
        self._look = None  # the next write's gathering begins when the writer looks next
        return n

    def _whole_batches(self, waiting: Sequence[Waiting]) -> int:
        cap = self.max_batch_bytes
        total = n = i = 0
        while i < len(waiting):
            batch, size, j = waiting[i].batch, 0, i
            while j < len(waiting) and waiting[j].batch == batch:
                if waiting[j].alive:
                    size += waiting[j].size
                j += 1
            if n and total + size > cap:
                break
            total += size
            n = i = j
        return n

    def written(self, ok: bool, now: float) -> None:
        """The write went well (``ok``) or failed: a failed one holds the next for the
        backoff, doubled from the last."""
        if ok:
            self.backoff = self.retry_at = 0.0
        else:
            self.backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, self.backoff * 2))
            self.retry_at = now + self.backoff
