"""The holders of a pzq queue's copies over the cluster: what goes to them. No I/O.

A queue with ``replicas: N`` and no static peers copies each message (COPY) to the N peers
of the cluster that placement.py chooses, and tells them when its original was ACKed
(DELETE). A new holder (one replacing a holder lost) first gets a copy of every message not
yet ACKed, a window at a time (a *re-copy*, placement.Recopy), none while a peer that may
have taken those messages over has not said which (fence.py: a second holder would hold
copies of messages the first delivers, and take them over in turn); they go once it has.

:class:`Holders` keeps the placement and returns the messages for the holders; it reads the
queue's messages (for a re-copy) and changes nothing of the queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zbroker.services.pzq.core import peering
from zbroker.services.pzq.core.actions import Log, Replicate, SendCluster, Unreplicate
from zbroker.services.pzq.core.fence import Fence
from zbroker.services.pzq.core.messages import Message
from zbroker.services.pzq.core.placement import Placement


class Holders:
    def __init__(self, name: str, node_id: str, replicas: int,
                 messages: dict[int, Message], keys: dict[bytes, int]):
        """``messages`` and ``keys``: the queue's unACKed messages by seq and their seqs by
        key (read, never changed here)."""
        self.name = name
        self.node_id = node_id
        self._qname = name.encode()
        self.placement = Placement(node_id, replicas)
        self.messages = messages
        self.keys = keys
        self._recopy_owed = False  # the backlog was not re-copied to a new holder (waiting)

    def _log(self, level: str, event: str, **fields: Any) -> Log:
        return Log(level, event, {"queue": self.name, **fields})

    def __len__(self) -> int:
        return len(self.placement)

    def send(self, sends: Sequence[Replicate | Unreplicate]) -> list[Any]:
        """Copies and deletes for every holder."""
        placement = self.placement
        copies = [(a.key, a.body) for a in sends if type(a) is Replicate]
        deleted = [a.key for a in sends if type(a) is Unreplicate]
        # copies first: a key copied and ACKed within one turn is then deleted after its copy
        messages: list[Any] = [*peering.copies(self._qname, self.node_id, copies)]
        messages += [peering.Delete(self._qname, self.node_id, chunk)
                     for chunk in peering.key_chunks(deleted)]
        for key in deleted:
            placement.forget(key)
        out: list[Any] = [SendCluster(life, msg)
                          for life in placement.holders for msg in messages]
        if placement.recopies:
            out += self.pump()
        return out

    def pump(self) -> list[SendCluster]:
        """The next part of each new holder's re-copy (a window at a time)."""
        placement = self.placement
        seq_of, messages = self.keys, self.messages
        out: list[SendCluster] = []
        for life, r in list(placement.recopies.items()):
            while True:
                keys = r.next_keys()
                if not keys:
                    break
                items = []
                for key in keys:
                    seq = seq_of.get(key)
                    m = messages.get(seq) if seq is not None else None
                    if m is None:  # ACKed meanwhile
                        r.confirmed(key)
                    else:
                        items.append((key, m.frames))
                for msg in peering.copies(self._qname, self.node_id, items):
                    out.append(SendCluster(life, msg, recopy=True))
            if r.done:
                placement.recopies.pop(life, None)
        return out

    def confirmed(self, life: str, keys: Sequence[bytes]) -> list[SendCluster]:
        """``life`` holds the copies of ``keys`` (CONFIRM): its re-copy goes on."""
        placement = self.placement
        for key in keys:
            placement.confirmed(life, key)
        return self.pump() if placement.recopies else []

    def unreachable(self, life: str) -> None:
        """A message of a re-copy could not be sent to ``life``: it is lost (``gone``
        replaces it); nothing more goes to it."""
        self.placement.recopies.pop(life, None)

    def available(self, life: str, node_id: str, fence: Fence) -> list[Any]:
        """A peer life hosts this queue: a holder if one is missing."""
        return self._added(self.placement.available(life, node_id, self._backlog(fence)))

    def gone(self, life: str, fence: Fence) -> list[Any]:
        """A peer life left: replaced, if it was a holder."""
        placement = self.placement
        was = life in placement.holders
        out = self._added(placement.gone(life, self._backlog(fence)))
        if was:
            out.append(self._log("warning", "pzq replica holder lost", peer=life,
                                 holders=len(placement)))
        return out

    def fence_lifted(self, fence: Fence) -> list[Any]:
        """The peers that may have taken messages over have said which: the backlog owed to
        the holders goes to them now."""
        if not self._recopy_owed or fence.owed():
            return []
        self._recopy_owed = False
        backlog = self._backlog(fence)
        out: list[Any] = []
        if self.placement.recopy_to_holders(backlog) and backlog:
            out.append(self._log("info", "pzq backlog copied to the holders: the peers that "
                                 "took messages over have said which", messages=len(backlog)))
            out += self.pump()
        return out

    def recopy_backlog(self) -> int:
        """Copies of a re-copy not sent or not confirmed yet."""
        return sum(len(r.todo) + len(r.sent) for r in self.placement.recopies.values())

    def _added(self, added: list[str]) -> list[Any]:
        placement = self.placement
        out: list[Any] = []
        for life in added:
            r = placement.recopies.get(life)
            out.append(self._log("info", "pzq replica holder chosen", peer=life,
                                 holders=len(placement), recopy=len(r.todo) if r else 0))
        if added:
            out += self.pump()
        return out

    def _backlog(self, fence: Fence) -> list[bytes]:
        """What a new holder is to get a copy of: the messages not yet ACKed, none while a
        peer that may have taken them over has not said which (they go once it has:
        :meth:`fence_lifted`)."""
        if fence.owed():
            self._recopy_owed = True
            return []
        return [m.key for m in self.messages.values()]
