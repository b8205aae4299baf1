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
peer's life, or ``SELF`` for this broker's own ends), bounded per owner. ``DirectoryMember`` is
this broker's part in the directory: it registers its ends with their homes (and again with
the new home when the members change), serves as home for the pipes it wins (introducing the
ends registered with it), and meets the ends introduced to its own: their proxies are attached
by the peer links (links.py). A peer that does not speak the directory (a broker of before) is
told of every end instead (ATTACH), and tells of its own likewise. Its messages are peering.py's,
recorded as actions (actions.py) in the server core's output.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import peering
from .actions import SendPeer
from .pipes import PipeTable, Reader, Writer, pipe_name_problem, shown

if TYPE_CHECKING:
    from .links import PeerLinks

SELF = ""  # the owner of this broker's own entries
MAX_PER_OWNER = 1 << 18  # entries one broker may hold at a home: its ends (<= its max_clients)

OPPOSITE = {"reader": "writer", "writer": "reader"}
# Kept only while a peer speaks the directory, and only needs to span the time an introduction
# takes to arrive (a round trip or so).
MAX_GONE = 16384  # our own ends closed, remembered to answer late introductions of them
MAX_WAITING = 10_000  # introductions to brokers we do not have as peers yet, kept a while
INTRO_WAIT = 30.0  # seconds such an introduction is kept
_UNKNOWN = "gone"  # what a late introduction of one of our writers we forgot is answered


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


class DirectoryMember:
    """This broker's part in the pipe directory. It attaches the ends introduced to it through
    the peer links (``links``), and calls nothing else of the server core: what it does to
    ends is in the pipe table (the ends it wakes in ``woken``), what it sends in the output.
    ``now`` is the time of the event being handled (the core sets it)."""

    def __init__(self, log: Any, pipes: PipeTable, out: list[Any], woken: deque[int],
                 links: PeerLinks) -> None:
        # per-pipe lines have a budget a second for each kind (zbroker/logs/budget.py),
        # larger for the ends peers (brokers of the cluster) tell ("peer") than for this
        # broker's own clients' ("lines"): a peer tells many at once when it links
        self.log = log
        self.pipes = pipes
        self.out = out  # the server core's output (actions.py)
        self._woken = woken  # ends the pipe table says may now be answered
        self.links = links
        self.now = 0.0
        self.member_id = ""  # this broker's id among the members (set by set_member)
        self.held = Directory()  # the ends registered with us as their pipes' home
        self._members: dict[str, str] = {}  # member id -> life, of peers speaking the directory
        self._member_of: dict[str, str] = {}  # life -> member id
        self._legacy: set[str] = set()  # lives of peers that do not: told of every end
        self._registered: dict[int, tuple[str, str, bytes]] = {}  # end -> (home, role, pipe)
        self._homes: dict[bytes, tuple[int, str]] = {}  # pipe of our ends -> (score, home)
        self._known_at: dict[int, set[str]] = {}  # our end -> lives introduced to it
        self._gone: OrderedDict[int, str | None] = OrderedDict()  # our ends closed -> failure
        # introductions naming a broker we do not have yet: member -> [(until, group)]
        self._waiting: OrderedDict[str, list[tuple[float, peering.Group]]] = OrderedDict()
        self._waiting_count = 0
        # our ends whose home is to say REGISTERED: end -> pipe (held: pipes.hold)
        self._awaiting: dict[int, bytes] = {}

    def speaks(self, peer: str) -> bool:
        """Whether the peer (a life) speaks the directory."""
        return peer in self._member_of

    # --- members come and go -----------------------------------------------------------------

    def set_member(self, member_id: str) -> None:
        """This broker's id among the members (its cluster start id): the hash that picks
        pipes' homes takes it. Set before the first peer comes."""
        if member_id == self.member_id:
            return
        old, self.member_id = self.member_id, member_id
        self._homes.clear()
        for end, (home, role, pipe) in list(self._registered.items()):
            if home == old:
                self._registered[end] = (member_id, role, pipe)

    def peer_up(self, peer: str, member: str, directory: bool, now: float) -> bool:
        """A peer broker joined: if it speaks the directory, our ends whose home it now is
        register with it, and the introductions that waited for it are met; otherwise it is
        told of every end we have, so pipes opened before it came find their other ends.
        Whether it speaks the directory."""
        if directory and member and member != self.member_id:
            self._members[member] = peer
            self._member_of[peer] = member
            self._rehome(joined=member)
            waiting = self._waiting.pop(member, [])
            self._waiting_count -= len(waiting)
            self._introduced([g for until, g in waiting if until >= now])
            return True
        self._legacy.add(peer)
        for role, name, end in self.pipes.local_ends():
            self.out.append(SendPeer(peer, peering.encode(peering.Attach(role, end, name))))
        return False

    def peer_down(self, peer: str) -> None:
        """A peer broker was lost: what it had registered with us is forgotten, and our ends
        whose home it was register with their new home."""
        self._legacy.discard(peer)
        member = self._member_of.pop(peer, None)
        if member is not None:
            if self._members.get(member) == peer:
                del self._members[member]
            self.held.drop_owner(peer)
            self._rehome(lost=member)

    # --- our ends ----------------------------------------------------------------------------

    def announce(self, role: str, end: int, name: bytes) -> None:
        """A local end was opened: peers without the directory are told, and the end registers
        with its pipe's home."""
        if self._legacy:
            frames = peering.encode(peering.Attach(role, end, name))
            for peer in self._legacy:
                self.out.append(SendPeer(peer, frames))
        home = self.home(name)
        self._registered[end] = (home, role, name)
        if home == self.member_id:
            self._home_register(SELF, [(role, end, name, False)])
            return
        # A writer's audience is the readers attached when its stream starts. With a reader
        # here, the stream of a writer here could start before the home has introduced the
        # readers elsewhere that registered before it: the home is asked to say when it has,
        # and no writer of the pipe here starts until then.
        pipe = self.pipes.pipes[name]
        answer = (any(not r.remote for r in pipe.readers.values())
                  and any(not w.remote and not w.started for w in pipe.writers.values()))
        if answer:
            self._awaiting[end] = name
            self.pipes.hold(name)
        self.out.append(SendPeer(self._members[home], peering.encode(
            peering.Register(((role, end, name, answer),)))))

    def home(self, name: bytes) -> str:
        """The member that is the home of pipe ``name``."""
        cached = self._homes.get(name)
        if cached is None:
            cached = self._homes[name] = home_of(name, [self.member_id, *self._members])
        return cached[1]

    def told_of(self, end: int) -> list[str]:
        """The peers that may hold a proxy of our ``end``: those without the directory, those
        introduced to it, and those whose ends of its pipe we hold (its stream may have gone
        to them before their introduction reached us)."""
        told = dict.fromkeys(self._legacy)
        told.update(dict.fromkeys(self._known_at.pop(end, ())))
        pipe = self.pipes.pipe_of(end)
        if pipe is not None and self._member_of:
            others: tuple[Reader | Writer, ...] = (*pipe.readers.values(),
                                                    *pipe.writers.values())
            for other in others:
                if other.remote:
                    broker = self.links.broker_of(other.end)
                    if broker is not None:  # a remote end is a proxy: it has a broker
                        told[broker] = None
        peers = self.links.peers
        return [peer for peer in told if peer in peers]

    def unregister(self, end: int, failure: str | None) -> None:
        """Our ``end`` is closed: its home forgets it; its failure is kept a while, to answer
        an introduction of it that was on its way."""
        if self._members:
            self._gone[end] = failure
            if len(self._gone) > MAX_GONE:
                self._gone.popitem(last=False)
        if end in self._awaiting:
            self._woken.extend(self.pipes.release(self._awaiting.pop(end)))
        home, _, name = self._registered.pop(end, ("", "", b""))
        if home == self.member_id:
            self.held.unregister(SELF, end)
        elif home in self._members:
            self.out.append(SendPeer(self._members[home],
                                     peering.encode(peering.Unregister((end,)))))
        if name and not any(self._registered.get(e, ("", "", b""))[2] == name
                            for e in self._ends_of(name)):
            self._homes.pop(name, None)

    def _ends_of(self, name: bytes) -> list[int]:
        pipe = self.pipes.pipes.get(name)
        if pipe is None:
            return []
        ends: tuple[tuple[int, Reader | Writer], ...] = (*pipe.readers.items(),
                                                          *pipe.writers.items())
        return [e for e, x in ends if not x.remote]

    def _rehome(self, joined: str | None = None, lost: str | None = None) -> None:
        """The members changed: our ends whose pipe's home moved register with the new home
        (and leave the old one, if it is still a member). Rendezvous hashing moves only the
        pipes the newcomer wins, or those of the member lost."""
        members = [self.member_id, *self._members]
        by_pipe: dict[bytes, list[int]] = {}
        for end, (_, _, name) in self._registered.items():
            by_pipe.setdefault(name, []).append(end)
        register: dict[str, list[tuple[str, int, bytes, bool]]] = {}
        unregister: dict[str, list[int]] = {}
        homes: dict[bytes, tuple[int, str]] = {}
        for name, ends in by_pipe.items():
            cached = self._homes.get(name)
            if cached is None or (lost is not None and cached[1] == lost):
                new = home_of(name, members)
            elif joined is not None:
                new = max(cached, (score(joined, name), joined))
            else:
                new = cached
            homes[name] = new
            for end in ends:
                old, role, _ = self._registered[end]
                if old == new[1]:
                    continue
                self._registered[end] = (new[1], role, name)
                if old == self.member_id:
                    self.held.unregister(SELF, end)
                elif old in self._members:
                    unregister.setdefault(old, []).append(end)
                register.setdefault(new[1], []).append((role, end, name,
                                                        end in self._awaiting))
        self._homes = homes
        for member, ends in unregister.items():
            for i in range(0, len(ends), peering.MAX_BATCH):
                self.out.append(SendPeer(self._members[member], peering.encode(
                    peering.Unregister(tuple(ends[i:i + peering.MAX_BATCH])))))
        for member, entries in register.items():
            if member == self.member_id:
                self._home_register(SELF, entries)
                for _, end, _, answer in entries:
                    if answer:
                        self._woken.extend(self.pipes.release(self._awaiting.pop(end)))
                continue
            for i in range(0, len(entries), peering.MAX_BATCH):
                self.out.append(SendPeer(self._members[member], peering.encode(
                    peering.Register(tuple(entries[i:i + peering.MAX_BATCH])))))

    # --- as a home ---------------------------------------------------------------------------

    def _home_register(self, owner: str,
                       entries: Sequence[tuple[str, int, bytes, bool]]) -> None:
        """Ends registered with us as their home (``owner``: the life of their broker, or
        SELF): each is introduced to the ends of other brokers it matches, and they to it, in
        one INTRODUCE per broker; then REGISTERED to the owner for those that ask it."""
        owner_member = self.member_id if owner == SELF else self._member_of[owner]
        # recipient -> (pipe, member, role of theirs) -> (theirs, yours)
        intros: dict[str, dict[tuple[bytes, str, str],
                                tuple[list[tuple[str, int]], list[int]]]] = {}
        refused = 0
        answered = [end for _, end, _, answer in entries if answer]
        for role, end, name, _ in entries:
            matches = self.held.register(owner, role, end, name)
            if matches is None:
                refused += 1
                continue
            for m in matches:
                member = self.member_id if m.owner == SELF else self._member_of.get(m.owner)
                if member is None:
                    continue
                theirs, yours = intros.setdefault(owner, {}).setdefault(
                    (name, member, m.role), ([], []))
                theirs.append((m.role, m.end))
                yours.append(end)
                theirs, yours = intros.setdefault(m.owner, {}).setdefault(
                    (name, owner_member, role), ([], []))
                theirs.append((role, end))
                yours.append(m.end)
        if len(entries) == 1 and not refused:
            role, end, name, _ = entries[0]
            self.log.info(
                "pipe end registered", budget="peer" if owner else "lines", pipe=shown(name),
                role=role, end=end,
                peer=owner or "self", met=len(intros) - (owner in intros))
        elif entries:
            self.log.info("pipe ends registered", budget="peer" if owner else "lines",
                          ends=len(entries) - refused, peer=owner or "self")
        if refused:
            self.log.warning("directory entries refused", peer=owner or "self", ends=refused,
                             limit=self.held.max_per_owner)
        for recipient, found in intros.items():
            groups = [peering.Group(name, member, tuple(dict.fromkeys(theirs)),
                                    tuple(dict.fromkeys(yours)))
                      for (name, member, _), (theirs, yours) in found.items()]
            if recipient == SELF:
                self._introduced(groups)
                continue
            for i in range(0, len(groups), peering.MAX_BATCH):
                self.out.append(SendPeer(recipient, peering.encode(
                    peering.Introduce(tuple(groups[i:i + peering.MAX_BATCH])))))
        if answered and owner != SELF:  # after its introductions, on the same link
            self.out.append(SendPeer(owner, peering.encode(peering.Registered(tuple(answered)))))

    # --- introductions -----------------------------------------------------------------------

    def _introduced(self, groups: Sequence[peering.Group]) -> None:
        """A home says: these ends of another broker match these of ours."""
        for group in groups:
            if group.member == self.member_id or not group.theirs \
                    or pipe_name_problem(group.pipe):
                continue
            peer = self._members.get(group.member)
            if peer is None:  # not (yet) a peer of ours: kept until it is, a while
                self._wait_for(group)
            else:
                self._meet(peer, group)

    def _meet(self, peer: str, group: peering.Group) -> None:
        """Attach ``peer``'s ends of the group; our ends of it that have gone are detached on
        its side (it was told of them at the same time as we of its ends)."""
        alive = []
        mine = OPPOSITE[group.theirs[0][0]]
        for end in group.yours:
            if self.pipes.has_local_end(end, group.pipe):
                alive.append(end)
                continue
            failure = self._gone.get(end, _UNKNOWN) if mine == "writer" else None
            self.out.append(SendPeer(peer, peering.encode(peering.Detach(end, failure))))
        if not alive:
            return
        for end in alive:
            self._known_at.setdefault(end, set()).add(peer)
        for role, end in group.theirs:
            tomb = self.links.tomb(peer, end)
            if tomb is None:
                self.links.attach_remote(peer, role, end, group.pipe)
            elif not tomb[0] and role == "writer" and tomb[1] is None:
                # it closed before its introduction reached us: the readers it was matched
                # with saw it close (and it sent them nothing, or it would be attached)
                self._woken.extend(self.pipes.saw_close(alive))

    def _wait_for(self, group: peering.Group) -> None:
        waiting = self._waiting.setdefault(group.member, [])
        waiting.append((self.now + INTRO_WAIT, group))
        self._waiting_count += 1
        while self._waiting_count > MAX_WAITING:
            _, dropped = self._waiting.popitem(last=False)
            self._waiting_count -= len(dropped)

    # --- peer messages -----------------------------------------------------------------------

    def _from_member(self, peer: str) -> bool:
        """Whether ``peer`` speaks the directory (a directory message from one that does not
        is logged, and dropped)."""
        if peer in self._member_of:
            return True
        self.log.warning("invalid peer message", peer=peer,
                         error="a directory message from a peer that did not say it "
                               "speaks the directory")
        return False

    def on_register(self, peer: str, msg: peering.Register) -> None:
        if self._from_member(peer):
            self._home_register(peer, [e for e in msg.entries if not pipe_name_problem(e[2])])

    def on_unregister(self, peer: str, msg: peering.Unregister) -> None:
        if self._from_member(peer):
            for end in msg.ends:
                self.held.unregister(peer, end)

    def on_registered(self, peer: str, msg: peering.Registered) -> None:
        if self._from_member(peer):
            member = self._member_of[peer]
            for end in msg.ends:
                if end in self._awaiting and self._registered[end][0] == member:
                    self._woken.extend(self.pipes.release(self._awaiting.pop(end)))

    def on_introduce(self, peer: str, msg: peering.Introduce) -> None:
        if self._from_member(peer):
            self._introduced(msg.groups)
