"""ZpipesServer cores wired together in memory, as brokers that speak the pipe directory (or
not: ``legacy``), with every cluster message counted by kind. Used by the directory tests and
by bench/bench_directory.py."""

from __future__ import annotations

import random
from collections import Counter, deque

from zpipes_core import Core

from zbroker.services.zpipes.server import ServerConfig
from zpipes import protocol as p


class Net:
    """Brokers by name; a broker's name is its member id and the name of its life at the
    others (one life each: a broker that comes back is given a new name)."""

    def __init__(self, names=(), legacy=(), **config):
        self.config = config
        self.servers: dict[str, Core] = {}
        self.legacy: set[str] = set(legacy)
        self.now = 0.0
        self.sent: Counter[bytes] = Counter()  # messages between brokers, by kind
        for name in names:
            self.add(name)

    def add(self, name, legacy=False):
        server = Core(ServerConfig(**self.config))
        server.set_member(name)
        self.servers[name] = server
        if legacy:
            self.legacy.add(name)
        return server

    def link(self, a, b):
        """a and b admit each other; the directory only if both speak it."""
        both = a not in self.legacy and b not in self.legacy
        self.servers[a].peer_up(b, self.now, member=b, directory=both)
        self.servers[b].peer_up(a, self.now, member=a, directory=both)

    def join(self, name, legacy=False):
        """A new broker links to every one there."""
        self.add(name, legacy)
        for other in list(self.servers):
            if other != name:
                self.link(name, other)
        self.pump()

    def join_all(self):
        names = list(self.servers)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                self.link(a, b)
        self.pump()

    def lose(self, victim):
        """``victim`` dies: every other broker notices."""
        del self.servers[victim]
        for s in self.servers.values():
            if victim in s.peers:
                s.peer_down(victim, self.now)
        self.pump()

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
                self.sent[bytes(frames[0])] += 1
                if peer in self.servers:
                    self.servers[peer].peer_receive(name, [bytes(f) for f in frames], self.now)
                    if peer not in queued:
                        queued.add(peer)
                        todo.append(peer)

    def step(self, rng: random.Random) -> bool:
        """Deliver what one random link has in flight (False: nothing was): the other links
        wait, so messages of different links overtake each other."""
        busy = [n for n, s in self.servers.items() if s.peer_outbox]
        if not busy:
            return False
        name = rng.choice(busy)
        s = self.servers[name]
        peer = rng.choice([m[0] for m in s.peer_outbox])
        out = [m for m in s.peer_outbox if m[0] == peer]
        s.peer_outbox = [m for m in s.peer_outbox if m[0] != peer]
        for _, frames in out:
            self.sent[bytes(frames[0])] += 1
            if peer in self.servers:
                self.servers[peer].peer_receive(name, [bytes(f) for f in frames], self.now)
        return True

    def control_messages(self) -> int:
        """Messages about ends (not DATA nor CREDIT) sent so far."""
        return sum(n for kind, n in self.sent.items() if kind not in (b"DATA", b"CREDIT"))

    def send(self, broker, client, msg, pump=True):
        self.servers[broker].receive(client, [p.encode(msg)], self.now)
        if pump:
            self.pump([broker])

    def replies(self, broker, client):
        s = self.servers[broker]
        mine = [p.decode(f) for c, f in s.outbox if c == client]
        s.outbox[:] = [(c, f) for c, f in s.outbox if c != client]
        return [p.ReadOk(bytes(m.chunk)) if isinstance(m, p.ReadOk) else m for m in mine]

    def home(self, pipe: bytes) -> str:
        """The home of ``pipe`` as the first directory broker sees it."""
        for name, s in self.servers.items():
            if name not in self.legacy:
                return s.directory.home(pipe)
        raise LookupError("no broker speaks the directory")
