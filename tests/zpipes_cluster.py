"""A cluster of brokers without sockets: several ZPIPES server cores (zpipes_core.Core) whose
peer messages an in-memory link carries. What it models:

* brokers by name; a broker's name is its member id and the name of its life at the others
  (one life each: a broker that comes back is given a new name);
* what each broker speaks, per broker: ``directory`` (the pipe directory; without it a broker
  is one of before, told of every end), ``fanout`` (a DATA for several readers),
  ``write_frames`` (a chunk in its WRITE frame), ``confirm`` (answers CONFIRM). Each is
  ``True`` (every broker, those added later too) or the names of the brokers that have it;
* links that deliver in order, each direction on its own: everything in flight at once
  (``pump``), one random link at a time so that links overtake each other (``step``), or one
  link (``deliver``); a direction may be ``paused`` (its messages wait for ``resume``) or a
  link ``cut`` (its messages are lost);
* frames that arrive as bytes, or in writable buffers as ZeroMQ's do (``writable``);
* brokers that join and are lost (every other broker notices), and a clock (``advance``);
* every message between brokers counted by kind (``sent_by_kind``) and, unless
  ``per_link=False``, by (from, to, kind) (``sent``).

Used by the cluster and directory core tests and by bench/bench_directory.py."""

from __future__ import annotations

import random
from collections import Counter, deque

from zpipes_core import Core

from zbroker.services.zpipes.server import ServerConfig
from zpipes import protocol as p

FEATURES = ("directory", "fanout", "write_frames", "confirm")


class Cluster:
    def __init__(self, names=(), *, directory=(), fanout=(), write_frames=(), confirm=(),
                 writable=False, per_link=True, **config):
        self.config = config
        self.servers: dict[str, Core] = {}
        given = {"directory": directory, "fanout": fanout, "write_frames": write_frames,
                 "confirm": confirm}
        self.everyone = {f for f, which in given.items() if which is True}
        self.speaks = {f: set(names) if which is True else set(which or ())
                       for f, which in given.items()}
        self.frame = (lambda f: memoryview(bytearray(f))) if writable else bytes
        self.now = 0.0
        self.paused: set[tuple[str, str]] = set()  # (from, to): its messages wait
        self.waiting: list[tuple[str, str, list]] = []
        self.cut: set[frozenset] = set()  # {a, b}: messages between them are lost
        self.per_link = per_link
        self.sent: Counter[tuple[str, str, bytes]] = Counter()  # (from, to, kind) -> messages
        self.sent_by_kind: Counter[bytes] = Counter()
        for name in names:
            self.add(name)

    # --- brokers and links -------------------------------------------------------------------

    def add(self, name, **features):
        """A new broker, linked to none; ``features`` (``directory=False``...) override what
        the cluster gives every broker."""
        for feature, on in features.items():
            (self.speaks[feature].add if on else self.speaks[feature].discard)(name)
        for feature in self.everyone - features.keys():
            self.speaks[feature].add(name)
        server = Core(ServerConfig(**self.config))
        server.set_member(name)
        self.servers[name] = server
        return server

    def _admit(self, a, b):
        """``a`` admits ``b`` as a peer, with what ``b`` speaks; the directory only if both do."""
        has = {f: b in self.speaks[f] for f in FEATURES}
        has["directory"] = has["directory"] and a in self.speaks["directory"]
        self.servers[a].peer_up(b, self.now, member=b, **has)

    def link(self, a, b):
        """``a`` and ``b`` admit each other; what follows is delivered."""
        self._admit(a, b)
        self._admit(b, a)
        self.pump([a, b])

    def join(self, name, **features):
        """A new broker links to every one there, all at once."""
        self.add(name, **features)
        for other in list(self.servers):
            if other != name:
                self._admit(name, other)
                self._admit(other, name)
        self.pump()

    def join_all(self):
        """Every broker links to every other."""
        names = list(self.servers)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                self._admit(a, b)
                self._admit(b, a)
        self.pump()

    def lose(self, victim):
        """``victim`` dies: every other broker notices (heartbeat timeout)."""
        del self.servers[victim]
        for s in self.servers.values():
            if victim in s.peers:
                s.peer_down(victim, self.now)
        self.pump()

    # --- delivery ----------------------------------------------------------------------------

    def _carry(self, name, peer, frames):
        """One message from ``name`` to ``peer`` on the link: counted, then it waits (paused),
        is lost (cut, or no such broker) or arrives."""
        kind = bytes(frames[0])
        self.sent_by_kind[kind] += 1
        if self.per_link:
            self.sent[name, peer, kind] += 1
        if (name, peer) in self.paused:
            self.waiting.append((name, peer, frames))
        elif peer in self.servers and frozenset((name, peer)) not in self.cut:
            self.servers[peer].peer_receive(name, [self.frame(f) for f in frames], self.now)

    def pump(self, start=None):
        """Deliver everything in flight, in order per link, until nothing is; ``start``: the
        only brokers that may have something to send (default: all)."""
        todo = deque(self.servers if start is None else start)
        queued = set(todo)
        while todo:
            name = todo.popleft()
            queued.discard(name)
            s = self.servers.get(name)
            if s is None or not s.peer_outbox:
                continue
            out, s.peer_outbox = s.peer_outbox, []
            for peer, frames in out:
                self._carry(name, peer, frames)
                if peer not in queued and peer in self.servers:
                    queued.add(peer)
                    todo.append(peer)

    def step(self, rng: random.Random) -> bool:
        """Deliver what one random link has in flight (False: nothing was): the other links
        wait, so messages of different links overtake each other."""
        busy = [n for n, s in self.servers.items() if s.peer_outbox]
        if not busy:
            return False
        name = rng.choice(busy)
        self.deliver(name, rng.choice([m[0] for m in self.servers[name].peer_outbox]))
        return True

    def deliver(self, src, dst):
        """Deliver what ``src`` has in flight to ``dst`` only."""
        s = self.servers[src]
        out = [frames for peer, frames in s.peer_outbox if peer == dst]
        s.peer_outbox = [m for m in s.peer_outbox if m[0] != dst]
        for frames in out:
            self._carry(src, dst, frames)

    def resume(self, a, b):
        """Messages from ``a`` to ``b`` go again: those that waited arrive first."""
        self.paused.discard((a, b))
        waited = [w for w in self.waiting if w[:2] == (a, b)]
        self.waiting = [w for w in self.waiting if w[:2] != (a, b)]
        for name, peer, frames in waited:
            if peer in self.servers:
                self.servers[peer].peer_receive(name, [self.frame(f) for f in frames],
                                                self.now)
        self.pump()

    def advance(self, seconds):
        self.now += seconds
        for s in self.servers.values():
            s.tick(self.now)
        self.pump()

    # --- clients -----------------------------------------------------------------------------

    def send(self, broker, client, msg, pump=True):
        """``client`` of ``broker`` sends ``msg``; then, unless ``pump=False``, what follows is
        delivered."""
        self.servers[broker].receive(client, [self.frame(p.encode(msg))], self.now)
        if pump:
            self.pump([broker])

    def replies(self, broker, client):
        """What ``broker`` answered ``client`` since last asked (a ReadOk's chunk as bytes)."""
        s = self.servers[broker]
        mine = [p.decode(f) for c, f in s.outbox if c == client]
        s.outbox[:] = [(c, f) for c, f in s.outbox if c != client]
        return [p.ReadOk(bytes(m.chunk)) if isinstance(m, p.ReadOk) else m for m in mine]

    # --- what the cluster did ----------------------------------------------------------------

    def control_messages(self) -> int:
        """Messages about ends (not DATA nor CREDIT) sent so far."""
        return sum(n for kind, n in self.sent_by_kind.items() if kind not in (b"DATA", b"CREDIT"))

    def home(self, pipe: bytes) -> str:
        """The home of ``pipe`` as the first directory broker sees it."""
        for name, s in self.servers.items():
            if name in self.speaks["directory"]:
                return s.directory.home(pipe)
        raise LookupError("no broker speaks the directory")
