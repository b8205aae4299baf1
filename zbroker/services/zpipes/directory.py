"""The pipe directory: which broker is the home of a pipe name, and what a home holds. No I/O.

Instead of telling every peer of every pipe end (N-1 messages per end, and every broker holding
every end of the cluster), each pipe name has a *home*: the broker that rendezvous hashing
(highest random weight) picks among the live members that speak the directory, itself included.
Every broker computes it alone from the members it has; they agree as soon as they agree on
the members. A broker registers each of its ends with the end's home (REGISTER); the home
introduces matching ends of different brokers to each other's brokers (INTRODUCE: readers to
the writers' brokers and writers to the readers' brokers, in one step, so that either side
knows the other was told); data then flows directly between those brokers, as before.

When the members change, only the pipes whose home was lost or is beaten by the newcomer move
(rendezvous hashing: about 1/N of them), and their ends register again with the new home. An
introduction already made stays: proxies live on the brokers of the ends, not at the home, so a
lost home fails nothing, and a new home introducing the same ends again changes nothing.

``Directory`` is what one broker holds as a home: the ends registered with it, by owner (a
peer's life, or ``SELF`` for this broker's own ends), bounded per owner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

SELF = ""  # the owner of this broker's own entries
MAX_PER_OWNER = 1 << 18  # entries one broker may hold at a home: its ends (<= its max_clients)

OPPOSITE = {"reader": "writer", "writer": "reader"}


def score(member: str, pipe: bytes) -> int:
    """The weight of ``member`` for ``pipe``: the member with the highest is the pipe's home."""
    digest = hashlib.blake2b(member.encode("utf-8", "replace") + b"\0" + pipe,
                             digest_size=8).digest()
    return int.from_bytes(digest, "big")


def home_of(pipe: bytes, members: Iterable[str]) -> tuple[int, str]:
    """(score, member) of the home of ``pipe`` among ``members`` (ties: the larger id)."""
    return max((score(m, pipe), m) for m in members)


@dataclass(frozen=True, slots=True)
class Entry:
    owner: str
    end: int
    role: str


class Directory:
    """The ends registered with this broker as their pipes' home."""

    def __init__(self, max_per_owner: int = MAX_PER_OWNER) -> None:
        self.max_per_owner = max_per_owner
        self.pipes: dict[bytes, dict[tuple[str, int], str]] = {}  # pipe -> {(owner, end): role}
        self._index: dict[tuple[str, int], bytes] = {}  # (owner, end) -> pipe
        self._owned: dict[str, set[int]] = {}  # owner -> its ends held here
        self.refused = 0  # entries refused past ``max_per_owner``

    def register(self, owner: str, role: str, end: int, pipe: bytes) -> list[Entry] | None:
        """Hold an end; the ends of other owners it matches (the other role, same pipe), or
        None if it was refused (its owner is over its bound). Registering again is harmless:
        the matches are given again."""
        key = (owner, end)
        known = self._index.get(key)
        if known is not None and known != pipe:
            self.unregister(owner, end)  # an end never changes pipe: a confused owner
        if key not in self._index:
            owned = self._owned.setdefault(owner, set())
            if len(owned) >= self.max_per_owner:
                self.refused += 1
                return None
            owned.add(end)
            self._index[key] = pipe
        ends = self.pipes.setdefault(pipe, {})
        ends[key] = role
        other = OPPOSITE[role]
        return [Entry(o, e, r) for (o, e), r in ends.items() if r == other and o != owner]

    def unregister(self, owner: str, end: int) -> bool:
        key = (owner, end)
        pipe = self._index.pop(key, None)
        if pipe is None:
            return False
        ends = self.pipes[pipe]
        del ends[key]
        if not ends:
            del self.pipes[pipe]
        owned = self._owned[owner]
        owned.discard(end)
        if not owned:
            del self._owned[owner]
        return True

    def drop_owner(self, owner: str) -> int:
        """Forget every end of ``owner`` (its broker was lost): how many there were."""
        ends = list(self._owned.get(owner, ()))
        for end in ends:
            self.unregister(owner, end)
        return len(ends)

    def entries(self) -> int:
        return len(self._index)

    def owned_by(self, owner: str) -> int:
        return len(self._owned.get(owner, ()))
