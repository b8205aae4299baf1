"""A cluster of brokers without sockets: ZPIPES server cores (zpipes_core.Core), each the
service of a broker's cluster core on the in-memory network of cluster_cores.py, whose clock is
theirs. What it models:

* brokers by name (``A``; its member id is the network's, ``A.1``, and each peer's life at a
  broker is the cluster's, ``A.1#1``: ``life``); a broker that comes back is another broker;
* what each broker's ZPIPES says it does, in its HELLO (``features`` of "zpipes"):
  ``directory`` (the pipe directory; without it a broker is one of before, told of every end,
  and using the directory with nobody), ``fanout`` (a DATA for several readers),
  ``write_frames`` (a chunk in its WRITE frame), ``confirm`` (answers CONFIRM). Each is
  ``True`` (every broker, those added later too) or the names of the brokers that have it.
  What a broker's core is told of a peer is what the service tells it (server.peer_terms);
* brokers that meet through their cluster cores (``link``, ``join``, ``join_all``: HELLOs),
  and are lost (``lose``: killed; the others notice their connections closed and the silence
  after, as the cluster layer does);
* the network's links (cluster_cores.Network): in order each way; everything in flight at
  once (``pump``), one random link's next message at a time so that links overtake each other
  (``step``), or one link (``deliver``); a way held (``pause``: its messages, heartbeats too,
  wait for ``resume``), a link cut (``cut``: what is in flight is lost, the rest waits at its
  sender until the peer is lost);
* frames that arrive as bytes, or in writable buffers as ZeroMQ's do (``writable``);
* a clock (``advance``) that runs the cluster cores' heartbeats and the ZPIPES cores' timers;
* every ZPIPES message sent counted by kind (``sent_by_kind``) and, unless ``per_link=False``,
  by (from, to, kind) (``sent``); the cluster layer's own (HELLO, PING...) are the network's.

Used by the cluster and directory core tests and by bench/bench_directory.py."""

from __future__ import annotations

import random
from collections import Counter, deque
from typing import Any

from cluster_cores import Network, Node, endpoint_of
from zpipes_core import Core

from zbroker.services.zpipes.failures import peer_lost
from zbroker.services.zpipes.server import SERVICE, ServerConfig, peer_terms
from zpipes import protocol as p

FEATURES = ("directory", "fanout", "write_frames", "confirm")
WITHIN = 5.0  # seconds brokers have to meet, or to notice one lost


class Broker:
    """A broker's ZPIPES service as the harness runs it: told what the cluster layer tells a
    service (``joined``, ``left``, ``message``), it tells its core what service.py tells it
    (peer_joined, peer_left, peer_message), then sends what the core has for peers through its
    node, as service.py's ``_flush`` does."""

    def __init__(self, cluster: Cluster, name: str, server: Core, node: Node) -> None:
        self.cluster, self.name, self.server, self.node = cluster, name, server, node
        self.directory = name in cluster.speaks["directory"]
        self.lives: dict[str, str] = {}  # peer's life -> its broker's name
        self.alive: dict[str, str] = {}  # peer's broker name -> its life now

    def joined(self, life: Any) -> None:
        terms = peer_terms(life)
        if not self.directory:  # a broker of before uses the directory with nobody
            terms["directory"] = False
        self.lives[life.id], self.alive[life.name] = life.name, life.id
        self.cluster.labels[life.name] = life.label
        self.server.peer_up(life.id, self.cluster.now, **terms)
        self.flush()

    def left(self, life: Any, why: str, alive: bool) -> None:
        if self.alive.get(life.name) == life.id:
            del self.alive[life.name]
        self.server.peer_down(life.id, self.cluster.now)
        self.flush()

    def message(self, life: Any, service: str, frames: list[Any]) -> None:
        if service == SERVICE:
            frame = self.cluster.frame
            self.server.peer_receive(life.id, [frame(f) for f in frames], self.cluster.now)
            self.flush()

    def flush(self) -> None:
        """Send what the core has for peers, in order (and what it did meanwhile)."""
        server, cluster = self.server, self.cluster
        while server.peer_outbox:
            out, server.peer_outbox = server.peer_outbox, []
            for life, frames in out:
                kind = bytes(frames[0])
                cluster.sent_by_kind[kind] += 1
                if cluster.per_link:
                    cluster.sent[self.name, self.lives.get(life, life), kind] += 1
                self.node.send(life, SERVICE, frames)


class Cluster:
    def __init__(self, names=(), *, directory=(), fanout=(), write_frames=(), confirm=(),
                 writable=False, per_link=True, **config):
        self.config = config
        self.net = Network()
        self.servers: dict[str, Core] = {}
        self.brokers: dict[str, Broker] = {}
        self.names: dict[str, str] = {}  # member id -> broker name
        self.labels: dict[str, str] = {}  # broker name -> how its peers tell of it
        given = {"directory": directory, "fanout": fanout, "write_frames": write_frames,
                 "confirm": confirm}
        self.everyone = {f for f, which in given.items() if which is True}
        self.speaks = {f: set(names) if which is True else set(which or ())
                       for f, which in given.items()}
        self.frame = (lambda f: memoryview(bytearray(f))) if writable else bytes
        self.per_link = per_link
        self.sent: Counter[tuple[str, str, bytes]] = Counter()  # (from, to, kind) -> messages
        self.sent_by_kind: Counter[bytes] = Counter()
        for name in names:
            self.add(name)

    @property
    def now(self) -> float:
        return self.net.now

    # --- brokers and links -------------------------------------------------------------------

    def add(self, name, **features):
        """A new broker, linked to none; ``features`` (``directory=False``...) override what
        the cluster gives every broker."""
        for feature, on in features.items():
            (self.speaks[feature].add if on else self.speaks[feature].discard)(name)
        for feature in self.everyone - features.keys():
            self.speaks[feature].add(name)
        said = {f: True for f in FEATURES if name in self.speaks[f]}
        node = self.net.start(name, features={SERVICE: said})
        # (what the node keeps of what its services were told: not here, where the cores
        # are looked at, and a long run would keep every message)
        node.messages, node.told = deque(maxlen=0), deque(maxlen=0)  # type: ignore[assignment]
        server = Core(ServerConfig(**self.config))
        server.set_member(node.id)
        self.names[node.id] = name
        self.servers[name] = server
        self.brokers[name] = node.service = Broker(self, name, server, node)
        return server

    def life(self, at: str, of: str) -> str:
        """The life ``at`` has of broker ``of`` now (the name its core knows it by)."""
        return self.brokers[at].alive[of]

    def _contact(self, name: str, others) -> None:
        """``name`` says HELLO to ``others`` (contacts, as seeds are)."""
        node = self.brokers[name].node
        for other in others:
            if other not in self.brokers[name].alive:
                node.run(node.core.add_contact(endpoint_of(other), True, self.now))
        node.rearm()

    def _met(self, pairs) -> bool:
        return all(b in self.brokers[a].alive and a in self.brokers[b].alive for a, b in pairs)

    def _until(self, done, step: float = 0.001) -> None:
        """Let time pass until ``done()``, within WITHIN seconds."""
        start = self.now
        while not done():
            assert self.now - start < WITHIN, "the brokers did not meet, or did not notice"
            self._pass(step)

    def link(self, a, b):
        """``a`` and ``b`` meet; what follows is delivered."""
        self._contact(a, [b])
        self._until(lambda: self._met([(a, b)]))
        self.pump()

    def join(self, name, via=None, **features):
        """A new broker says HELLO to every one there, all at once (or to ``via`` only, and
        learns the others from it, as a broker given one seed does)."""
        self.add(name, **features)
        others = [n for n in self.brokers if n != name]
        self._contact(name, others if via is None else [via])
        self._until(lambda: self._met((name, other) for other in others))
        self.pump()

    def join_all(self):
        """Every broker meets every other (each says HELLO to those before it, in turn)."""
        names = list(self.brokers)
        for i, name in enumerate(names):
            self._contact(name, names[:i])
            self._pass(0.001)
        self._until(lambda: self._met((a, b) for i, a in enumerate(names)
                                      for b in names[i + 1:]))
        self.pump()

    def lose(self, victim):
        """``victim`` dies: its connections close, and every other broker notices (that, and
        its silence since)."""
        self.net.kill(victim)
        del self.servers[victim], self.brokers[victim]
        self._until(lambda: all(victim not in b.alive for b in self.brokers.values()),
                    step=0.05)
        self.pump()

    # --- delivery ----------------------------------------------------------------------------

    def flush(self) -> None:
        """What each core has for peers goes on its way: what the tests asked of a core
        itself (a broker's own events send what they make at once)."""
        for broker in self.brokers.values():
            broker.flush()

    def pump(self):
        """Deliver everything in flight, until nothing is (what is held waits)."""
        self.flush()
        self.net.deliver()

    def step(self, rng: random.Random) -> bool:
        """One random link's next message arrives (False: nothing was in flight): the other
        links wait, so messages of different links overtake each other."""
        return self.net.step(rng)

    def deliver(self, src, dst):
        """Deliver what ``src`` has in flight to ``dst`` only."""
        self.net.deliver_link(src, dst)

    def cut(self, a, b):
        """The link between ``a`` and ``b`` is cut: what is in flight is lost; what they send
        each other then waits at the sender (its link is down) until the peer is lost."""
        self.net.partition([a], [b])

    def pause(self, a, b):
        """Messages from ``a`` to ``b`` wait on the way (its heartbeats too)."""
        self.net.hold(a, b)

    def resume(self, a, b):
        """Messages from ``a`` to ``b`` go again: those that waited arrive first."""
        self.flush()
        self.net.release(a, b)

    def _pass(self, seconds: float) -> None:
        """Time passes: the cluster cores' heartbeats, and each ZPIPES core's timers when its
        deadline comes, as the service's timer runs them."""
        end = self.now + seconds
        for _ in range(100_000):
            due = min((s.next_deadline() for s in self.servers.values()), default=end)
            self.net.advance(min(max(due, self.now), end))
            for broker in list(self.brokers.values()):
                if broker.server.next_deadline() <= self.now:
                    broker.server.tick(self.now)
                    broker.flush()
            self.net.deliver()
            if self.now >= end:
                return
        raise AssertionError("a ZPIPES core's deadline never passes")

    def advance(self, seconds):
        self._pass(seconds)
        self.pump()

    # --- clients -----------------------------------------------------------------------------

    def send(self, broker, client, msg, pump=True):
        """``client`` of ``broker`` sends ``msg``; then, unless ``pump=False``, what follows is
        delivered."""
        self.servers[broker].receive(client, [self.frame(p.encode(msg))], self.now)
        self.brokers[broker].flush()
        if pump:
            self.pump()

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

    def lost(self, name: str) -> str:
        """What the ends a lost broker ``name`` broke are told (which broker, on which host)."""
        return str(peer_lost(self.labels[name]))

    def home(self, pipe: bytes) -> str:
        """The home of ``pipe`` as the first directory broker sees it (a broker's name)."""
        for name, s in self.servers.items():
            if name in self.speaks["directory"]:
                return self.names[s.directory.home(pipe)]
        raise LookupError("no broker speaks the directory")
