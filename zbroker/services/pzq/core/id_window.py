"""The idempotence window of a queue: the producer message ids it remembers, each with the
seq of the message it stored for it, so that a message sent again is answered, not stored
twice. It keeps the last ``max_ids`` ids, and at most ``max_bytes`` bytes of them: the
oldest are forgotten first. No I/O.

A plain dict maps each id to its seq. The order the ids came in is a deque of groups (a
producer's batch is one group: its ids and their seqs), so that a batch is remembered and
forgotten in a few C calls, not a Python step per id (an OrderedDict, as before, took one
per id and cost more per entry). An id forgotten early (:meth:`IdWindow.forget`) or
remembered again with a newer seq stays in its old group, stale: it is passed over when
that group is let go, and the groups are compacted when stale ids pile up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import cast

#: a batch's ids and their seqs, in the order they came
Group = tuple[list[bytes], Sequence[int]]


class IdWindow:
    def __init__(self, max_ids: int, max_bytes: int):
        self.max_ids = max_ids
        self.max_bytes = max_bytes
        self.bytes = 0  # of the ids remembered
        self._seq: dict[bytes, int] = {}
        #: (ids, their seqs) in the order they came, stale ones included; an id added
        #: alone is (id, seq)
        self._order: deque[Group | tuple[bytes, int]] = deque()
        self._held = 0  # ids in _order, stale ones included

    def __len__(self) -> int:
        return len(self._seq)

    def __contains__(self, msg_id: bytes) -> bool:
        return msg_id in self._seq

    def get(self, msg_id: bytes) -> int | None:
        return self._seq.get(msg_id)

    def any_known(self, ids: Iterable[bytes]) -> bool:
        """Whether any of ``ids`` is remembered."""
        return not self._seq.keys().isdisjoint(ids)

    def add(self, msg_id: bytes, seq: int) -> None:
        """Remember ``msg_id`` for message ``seq`` (again: as the newest; the same id and
        seq again, a message recovered twice, changes nothing)."""
        prior = self._seq.get(msg_id)
        if prior == seq:
            return
        if prior is not None:
            self.bytes -= len(msg_id)
        self._seq[msg_id] = seq
        self.bytes += len(msg_id)
        self._order.append((msg_id, seq))
        self._held += 1
        if len(self._seq) > self.max_ids or self.bytes > self.max_bytes:
            self._trim()
        if prior is not None:
            self._compact_if_stale()

    def add_many(self, ids: list[bytes], first: int) -> None:
        """Remember a batch's ids, for the seqs from ``first`` on. They are new to the
        window and distinct (the caller checked: :meth:`any_known`)."""
        seqs = range(first, first + len(ids))
        self._seq.update(zip(ids, seqs, strict=True))
        self.bytes += sum(map(len, ids))
        self._order.append((ids, seqs))
        self._held += len(ids)
        self._trim()

    def forget(self, msg_id: bytes) -> int | None:
        """Forget ``msg_id`` now; returns its seq, or None if it was not remembered."""
        seq = self._seq.pop(msg_id, None)
        if seq is not None:
            self.bytes -= len(msg_id)
            self._compact_if_stale()
        return seq

    def _compact_if_stale(self) -> None:
        """Compact the groups once most of the ids they hold are stale (so that they stay
        within twice the ids remembered, and a constant)."""
        if self._held > 2 * len(self._seq) + 1024:
            self._compact()

    def _trim(self) -> None:
        """Let the oldest ids go while there are too many of them, or too many bytes."""
        seq_of, order = self._seq, self._order
        while order and (len(seq_of) > self.max_ids or self.bytes > self.max_bytes):
            ids, seqs = order[0]
            if type(ids) is bytes:  # one id (added alone): (id, seq)
                order.popleft()
                self._held -= 1
                if seq_of.get(ids) == seqs:
                    del seq_of[ids]
                    self.bytes -= len(ids)
                continue
            # a group, (ids, seqs): mypy does not tie the two halves' types together
            ids, seqs = cast("Group", order[0])
            k = min(len(ids), max(1, len(seq_of) - self.max_ids))  # (bytes: one by one)
            if k == len(ids):
                order.popleft()
            else:
                order[0] = (ids[k:], seqs[k:])
                ids, seqs = ids[:k], seqs[:k]
            self._held -= k
            now = list(map(seq_of.get, ids))
            if now == list(seqs):  # none stale: the common case, in one go
                deque(map(seq_of.__delitem__, ids), maxlen=0)
                self.bytes -= sum(map(len, ids))
                continue
            for msg_id, seq, was in zip(ids, seqs, now, strict=True):
                if was == seq:
                    del seq_of[msg_id]
                    self.bytes -= len(msg_id)

    def _compact(self) -> None:
        """Drop the stale ids from the groups (one group of the rest, in order)."""
        seq_of = self._seq
        live: list[tuple[bytes, int]] = []
        for entry in self._order:
            if type(entry[0]) is bytes:  # one id: (id, seq)
                if seq_of.get(entry[0]) == entry[1]:
                    live.append(entry)
            else:
                ids, seqs = cast("Group", entry)
                live.extend(p for p in zip(ids, seqs, strict=True) if seq_of.get(p[0]) == p[1])
        self._order = deque([([i for i, _ in live], [s for _, s in live])] if live else [])
        self._held = len(live)
