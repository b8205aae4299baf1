"""Taken lists: which messages of a queue its peers delivered while it was gone. No I/O.

A holder that took a lost cluster origin's copies over remembers the keys it wrote in its
own queue (RememberTaken: on disk, kept across its restarts) and tells them to that origin's
queue when it is announced again (TAKEN, then a TAKEN without keys to end the list), so that
it drops them instead of delivering them twice. Told, a list is kept for TAKEN_KEEP rejoin
graces more (told again at each return of the origin), since the origin's drops are not on
its disk at once, and a crash meanwhile brings them back.

The takers are told too: each holder that took an origin's copies over says so to the
queue's other hosts (TOOK), who tell the origin when it is back (TAKERS), so that it waits
for that taker's list before it delivers (fence.py).

:class:`TakenLists` keeps both and returns the actions that remember, tell and forget them.
"""

from __future__ import annotations

from typing import Any

from zbroker.services.pzq.core import peering
from zbroker.services.pzq.core.actions import ForgetTaken, Log, RememberTaken, SendCluster

TAKEN_KEEP = 5  # rejoin graces a list of keys taken over is kept once told (taken_told)


class TakenLists:
    def __init__(self, name: str, lease: bool, taken: dict[str, list[bytes]] | None = None):
        """``lease``: the queue is fenced (a list told is kept a while, else forgotten at
        once); ``taken``: the keys taken over from each origin, as kept from before a
        restart."""
        self.name = name
        self._qname = name.encode()
        self.lease = lease
        #: the keys whose copies were taken over from each origin and are written in our
        #: queue (told to that origin when it is back: TAKEN)
        self.taken: dict[str, list[bytes]] = dict(taken or {})
        #: when each origin was last told its whole list (kept TAKEN_KEEP rejoin graces)
        self.taken_told: dict[str, float] = {}
        #: who took whose copies over, as the takers said (TOOK): origin node id ->
        #: {taker node id: when}, told to the origin when it is back (TAKERS), kept as taken
        #: lists are
        self.takers: dict[str, dict[str, float]] = {}

    def remember(self, taken: dict[str, list[bytes]]) -> list[RememberTaken]:
        """The copies of these keys, taken over from each origin, are written in our queue:
        to be told (and remembered before the copies leave the replica logs)."""
        out = []
        for node_id, keys in taken.items():
            self.taken.setdefault(node_id, []).extend(keys)
            self.taken_told.pop(node_id, None)  # (not all told now)
            out.append(RememberTaken(node_id, keys))
        return out

    def tell(self, life: str, node_id: str, now: float) -> list[Any]:
        """Tell a queue that is back (``node_id``, in ``life``) which of its messages we took
        over (TAKEN) and who else did (TAKERS), then that the list is over (a TAKEN without
        keys): it delivers nothing before that."""
        out: list[Any] = []
        taken = self.taken.get(node_id)
        if taken:
            for chunk in peering.key_chunks(taken, peering.TAKEN_BATCH):
                out.append(SendCluster(life, peering.Taken(self._qname, node_id, chunk)))
            if self.lease:
                self.taken_told[node_id] = now
            else:
                out.append(self.forget(node_id))
            out.append(Log("info", "pzq told a returning queue what was delivered in its "
                           "absence", {"queue": self.name, "node": node_id,
                                       "messages": len(taken)}))
        takers = self.takers.get(node_id)
        if takers:
            names = list(takers)[-peering.MAX_TAKERS:]
            out.append(SendCluster(life, peering.Takers(self._qname, node_id, names)))
        out.append(SendCluster(life, peering.Taken(self._qname, node_id, [])))
        return out

    def tell_written(self, life: str, node_id: str, keys: list[bytes]) -> list[Any]:
        """Keys taken over from ``node_id`` that our queue wrote after that queue was back
        (``life``) and told its list: told at once, so that it drops them before it delivers
        them (a restarted origin holds what it recovered for a rejoin grace). Kept all the
        same, and told again at its next return."""
        out: list[Any] = [SendCluster(life, peering.Taken(self._qname, node_id, chunk))
                          for chunk in peering.key_chunks(keys, peering.TAKEN_BATCH)]
        out.append(Log("info", "pzq told a queue that is back what was taken over of it since",
                       {"queue": self.name, "node": node_id, "messages": len(keys)}))
        return out

    def forget(self, node_id: str) -> ForgetTaken:
        self.taken.pop(node_id, None)
        self.taken_told.pop(node_id, None)
        return ForgetTaken(node_id)

    def took(self, origin: str, taker: str, now: float) -> None:
        """``taker`` said it took ``origin``'s copies over (TOOK)."""
        self.takers.setdefault(origin, {})[taker] = now

    def expire(self, now: float, keep: float) -> list[ForgetTaken]:
        """Forget the lists told and the takers heard of more than ``keep`` ago."""
        out = [self.forget(node_id)
               for node_id in [n for n, t in self.taken_told.items() if now - t > keep]]
        for node_id, takers in list(self.takers.items()):
            for taker in [n for n, t in takers.items() if now - t > keep]:
                del takers[taker]
            if not takers:
                del self.takers[node_id]
        return out
