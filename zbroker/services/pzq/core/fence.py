"""The fence of a queue replicated over the cluster: who may deliver its messages. No I/O.

An origin delivers only while a quorum of the hosts of its queue (a majority of every host
seen, itself counted) has answered a LEASE it asked within the lease: cut off or paused, it
stops a lease after it was last heard, long before its holders may take its copies over (a
peer is lost after ``peer_timeout`` of silence). A holder takes a lost origin's copies over
only if such a quorum *without* the origin answers it. Stamps are the asker's own monotonic
clock, echoed: an answer read late (after a pause) is old, whatever its arrival.

Beside the quorum, an origin waits before it delivers for the TAKEN lists it is owed: each
host that comes (a new life) sends one, ended by a TAKEN without keys; each taker the others
name (TAKERS) sends its own; and after a fence, each holder it had sends one in a new life,
or answers in the life it had (then it never lost us, and took nothing). The waits are
bounded: a peer of before says nothing of lists, a taker may never come back.

With fewer than three hosts no quorum tells a partition from a death: the fence is open
(``lease`` 0: not in a cluster, no fence at all). :class:`Fence` keeps the state; the
replication core (replication.py) sends the messages and acts on what it says.
"""

from __future__ import annotations

_NEVER = float("inf")
#: leases a host's TAKEN list is waited for after it came (a peer of before sends none)
LIST_WAIT = 4


class Fence:
    def __init__(self, lease: float, taker_wait: float) -> None:
        """``lease``: how long an answered LEASE counts (0: no fence); ``taker_wait``: how
        long a taker's TAKEN list is waited for."""
        self.lease = lease
        self.taker_wait = taker_wait
        self.hosts: dict[str, str] = {}  # peer life -> its queue's node id
        self.answered: dict[str, float] = {}  # peer life -> our stamp it answered last
        self.known: set[str] = set()  # node ids of every host seen: the quorum's base
        self.last_from: dict[str, float] = {}  # node id -> when anything last came from it
        self.awaiting: dict[str, float] = {}  # life -> since when its TAKEN list is owed
        #: node id of a taker -> (since when, the life it had if it was our holder at a
        #: fence: an answer of that life says it took nothing)
        self.waiting_takers: dict[str, tuple[float, str | None]] = {}
        self.synced: set[str] = set()  # node ids whose list ended in their present life
        self.quorum = True  # as last told (quorum_changed)

    # --- hosts --------------------------------------------------------------------------------

    def joined(self, life: str, node_id: str, now: float) -> None:
        """A peer life hosts the queue: its TAKEN list is owed."""
        self.hosts[life] = node_id
        self.known.add(node_id)
        self.last_from[node_id] = now
        if self.lease:
            self.awaiting[life] = now

    def life_of(self, node_id: str) -> str | None:
        """The present life of the host whose queue's node id is ``node_id``, if it is one."""
        return next((life for life, n in self.hosts.items() if n == node_id), None)

    def left(self, life: str) -> None:
        self.synced.discard(self.hosts.pop(life, ""))
        self.answered.pop(life, None)
        self.awaiting.pop(life, None)

    def heard(self, life: str, now: float) -> None:
        """Something came from ``life`` (whatever it is)."""
        node_id = self.hosts.get(life)
        if node_id is not None:
            self.last_from[node_id] = now

    def answer(self, life: str, asked: float, now: float) -> None:
        """``life`` answered the LEASE we asked at ``asked`` (our clock)."""
        if life in self.hosts and asked <= now and asked > self.answered.get(life, -_NEVER):
            self.answered[life] = asked
            node_id = self.hosts[life]
            waited = self.waiting_takers.get(node_id)
            if waited is not None and waited[1] == life:
                del self.waiting_takers[node_id]

    def list_ended(self, life: str) -> None:
        """``life``'s TAKEN list is over."""
        node_id = self.hosts.get(life)
        if node_id is not None:
            self.synced.add(node_id)
            self.waiting_takers.pop(node_id, None)
        self.awaiting.pop(life, None)

    def told_takers(self, takers: list[str], me: str, now: float) -> None:
        """The others name the takers of our copies: wait for their lists too."""
        for taker in takers:
            if taker != me and taker not in self.synced:
                self.waiting_takers.setdefault(taker, (now, None))

    def fenced(self, holders: list[str], now: float,
               gone: tuple[str, str] | None = None) -> None:
        """We lost the quorum: the holders we have may take our copies over from now on.
        ``gone``: a life (and its node id) that ended as we found the quorum lost, its host
        gone already: the quorum was lost while it held our copies, if it did (its links
        closed as ours to the rest did, or its answers were the last to count)."""
        for life in holders:
            node_id = self.hosts.get(life)
            if node_id is None and gone is not None and gone[0] == life:
                node_id = gone[1]
            if node_id is not None:
                self.waiting_takers.setdefault(node_id, (now, life))

    # --- the quorum ---------------------------------------------------------------------------

    def others_needed(self) -> int:
        """How many other hosts make a quorum with us (0: no quorum to keep)."""
        n = len(self.known) + 1
        return 0 if n < 3 or not self.lease else n // 2

    def fresh(self, now: float, without: str | None = None) -> list[float]:
        """When we asked the LEASEs answered within the lease, latest first (``without``:
        not counting that node id's)."""
        lease, hosts = self.lease, self.hosts
        return sorted((t for life, t in self.answered.items()
                       if now - t < lease and hosts.get(life) != without), reverse=True)

    def quorum_without(self, node_id: str, now: float) -> bool:
        """A quorum of the hosts other than ``node_id`` answers us: that node, if alive, is
        outside it and has stopped delivering (its own fence)."""
        need = self.others_needed()
        return not need or len(self.fresh(now, without=node_id)) >= need

    def silent(self, node_id: str, now: float) -> bool:
        """Nothing came from ``node_id`` for a lease."""
        return now - self.last_from.get(node_id, -_NEVER) >= self.lease

    def counts(self, now: float, without: str | None = None) -> dict[str, int]:
        """For the log, in plain numbers: the hosts seen and those answering (ourselves
        counted), and how many make a majority."""
        hosts = len(self.known) + 1
        return {"hosts": hosts, "answering": len(self.fresh(now, without)) + 1,
                "majority": hosts // 2 + 1}

    # --- delivering ---------------------------------------------------------------------------

    def quorum_until(self, now: float) -> float:
        """Until when the quorum holds (inf without a fence; ``now`` or before: lost)."""
        need = self.others_needed()
        if not need:
            return _NEVER
        fresh = self.fresh(now)
        return fresh[need - 1] + self.lease if len(fresh) >= need else now

    def waiting(self, now: float) -> bool:
        """A TAKEN list is owed (those waited for long enough are let go)."""
        for life in [k for k, t in self.awaiting.items() if now - t >= LIST_WAIT * self.lease]:
            del self.awaiting[life]
        for node_id in [k for k, (t, _) in self.waiting_takers.items()
                        if now - t >= self.taker_wait]:
            del self.waiting_takers[node_id]
        return self.owed()

    def owed(self) -> bool:
        """A TAKEN list is owed, of those not let go yet (:meth:`waiting` lets go)."""
        return bool(self.awaiting or self.waiting_takers)
