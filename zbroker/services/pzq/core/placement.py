"""Which peer brokers hold the copies of one queue's messages (replication over the cluster).

Pure bookkeeping, no I/O. A queue with ``replicas: N`` keeps N *holders*: peers of the
cluster (one life each, see ``zbroker.service.PeerBroker``) that host a queue of the same name.
Holders are kept while they live; when one leaves, the next candidate replaces it, and the
new holder must receive a copy of every message not yet ACKed (a *re-copy*). Candidates are
ordered by rendezvous hashing of (this queue's node id, the candidate's node id), so that
the copies of many origins spread over the cluster and an origin picks the same holders
again after a restart when they are still there.

A re-copy goes out in a window (``RECOPY_WINDOW`` copies unconfirmed at a time), so that a
backlog of 100 000 messages does not flood the link to the new holder.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

RECOPY_WINDOW = 1000


def rank(origin: str, candidate: str) -> bytes:
    return hashlib.blake2b(f"{origin}/{candidate}".encode(), digest_size=8).digest()


@dataclass
class Recopy:
    """The backlog being copied to a new holder: keys still to send, and those sent and not
    yet confirmed."""

    todo: deque[bytes]
    sent: set[bytes] = field(default_factory=set)

    def next_keys(self, window: int = RECOPY_WINDOW) -> list[bytes]:
        """Keys to send now (the window's free room), taken off ``todo``."""
        room = min(window - len(self.sent), len(self.todo))
        if room <= 0:
            return []
        todo = self.todo
        out = [todo.popleft() for _ in range(room)]
        self.sent.update(out)
        return out

    def confirmed(self, key: bytes) -> None:
        self.sent.discard(key)

    @property
    def done(self) -> bool:
        return not self.todo and not self.sent


class Placement:
    def __init__(self, node_id: str, replicas: int):
        self.node_id = node_id
        self.replicas = replicas
        self.candidates: dict[str, str] = {}  # peer life -> its queue's node id
        self.holders: list[str] = []  # peer lives, at most ``replicas``
        self.recopies: dict[str, Recopy] = {}  # holder -> its pending re-copy

    def available(self, life: str, node_id: str, backlog: Iterable[bytes]) -> list[str]:
        """A peer life hosts this queue (its queue's node id ``node_id``). Returns the lives
        that became holders (each gets ``backlog`` re-copied)."""
        if node_id == self.node_id:
            return []  # ourselves, through a peer list that names us
        self.candidates[life] = node_id
        return self._fill(backlog)

    def gone(self, life: str, backlog: Iterable[bytes]) -> list[str]:
        """A peer life left the cluster. Returns the replacement holders, if any."""
        self.candidates.pop(life, None)
        self.recopies.pop(life, None)
        if life not in self.holders:
            return []
        self.holders.remove(life)
        return self._fill(backlog)

    def _fill(self, backlog: Iterable[bytes]) -> list[str]:
        free = [life for life in self.candidates if life not in self.holders]
        free.sort(key=lambda life: rank(self.node_id, self.candidates[life]))
        added = free[:max(0, self.replicas - len(self.holders))]
        if added:
            keys = list(backlog)
            for life in added:
                self.holders.append(life)
                if keys:
                    self.recopies[life] = Recopy(deque(keys))
        return added

    def recopy_to_holders(self, backlog: Iterable[bytes]) -> list[str]:
        """Every holder is to get a copy of ``backlog`` too (copies it has are held once);
        returns the holders."""
        keys = list(backlog)
        if keys:
            for life in self.holders:
                r = self.recopies.get(life)
                if r is None:
                    self.recopies[life] = Recopy(deque(keys))
                else:
                    r.todo.extend(keys)
        return list(self.holders)

    def confirmed(self, life: str, key: bytes) -> None:
        r = self.recopies.get(life)
        if r is not None:
            r.confirmed(key)
            if r.done:
                del self.recopies[life]

    def forget(self, key: bytes) -> None:
        """``key`` was ACKed: a re-copy need not send it any more (the holders get a DELETE)."""
        for r in self.recopies.values():
            r.sent.discard(key)  # keys still in ``todo`` are skipped when their turn comes

    def __len__(self) -> int:
        return len(self.holders)
