"""Brokers' cluster cores (zbroker.cluster.core.node.NodeCore) wired together in memory, with a
clock of its own: no sockets, no sleeps. Each core's actions are carried out as the libzmq layer
(zbroker/cluster/node.py) carries them out, over links that model libzmq's:

* a broker is at ``tcp://NAME:5670``; its links to other endpoints are made by its core's
  Connect (or on first send), and are *connected* while a broker is at the other end and the
  pair is not cut (``partition``); a link's connecting and closing are told to the core when it
  is watched, as a monitor tells them;
* a send on a link that is not connected is refused (IMMEDIATE), and so is every send on a
  link whose queue is said to be full (``full``); a HELLO that is not a reply goes only on a
  connected link (POLLOUT);
* messages travel in order and arrive when the network delivers (``deliver``, at every step);
  those in flight between brokers cut apart, or to a broker gone, are lost;
* what a service's send ends (core.deferred) is carried out on the next turn, as the layer does;
* time moves only by ``run``/``advance``: each core's ``tick`` runs when it asked (Wake, or
  ``next_wake``), at that very time;
* a broker may be paused (``pause``, as SIGSTOP does): it runs nothing, what comes to it and
  what its monitor says wait, and on ``resume`` it reads them before its timers run;
* a service on a broker (``Node.service``) is told what the layer tells services: a peer's
  life begun (``joined(life)``), ended (``left(life, why, alive)``: ``alive``, the peer was
  running as it ended; ``Node.ended_alive`` keeps those lives), a message of it
  (``message(life, service, frames)``);
* one way between two brokers may be held (``hold``: what goes that way waits, heartbeats
  too, until ``release``), and links' messages may arrive one at a time: one random link's
  next (``step``: links overtake each other, a link's messages never do), or one link's
  (``deliver_link``).

Used by tests/unit/test_gossip.py, tests/unit/test_cluster_node.py and
tests/unit/test_cluster_troubles.py, and by tests/zpipes_cluster.py (ZPIPES's cores as the
brokers' service: tests/unit/test_cluster_core.py, tests/unit/test_directory_core.py,
bench/bench_directory.py), and by tests/pzq_replication_sim.py (pzq's replicated queues as the
brokers' service, under faults: tests/unit/test_pzq_fault_simulation.py).
"""

from __future__ import annotations

import json
from collections import Counter, deque
from typing import Any

from zbroker.cluster.core.actions import (
    NOT_REPORTED,
    Connect,
    Deliver,
    Disconnect,
    Joined,
    Left,
    Log,
    LookUpClosed,
    Send,
    SendHeld,
    Trust,
    Wake,
    Watch,
)
from zbroker.cluster.core.node import NodeCore
from zbroker.cluster.membership import Hello

INF = float("inf")
builtins_bytes = bytes  # (Frame's property shadows the name in its class)


class Frame(bytes):
    """A frame as a zmq.Frame gives it to the core: ``bytes``, ``buffer``, and where it came
    from (``address``)."""

    address = ""

    @property
    def bytes(self) -> bytes:  # type: ignore[override]
        return builtins_bytes(self)

    @property
    def buffer(self) -> memoryview:
        return memoryview(self)


def frames_of(sender: bytes, frames: list[Any], address: str = "") -> list[Frame]:
    out = [Frame(sender), *(Frame(builtins_bytes(f)) for f in frames)]
    for f in out:
        f.address = address
    return out


def endpoint_of(name: str) -> str:
    return f"tcp://{name}:5670"


class Node:
    """One broker: its core, and what its services and its log saw."""

    def __init__(self, net: Network, name: str, core: NodeCore, legacy: bool) -> None:
        self.net, self.name, self.core, self.legacy = net, name, core, legacy
        self.endpoint = endpoint_of(name)
        self.id = core.membership.me.id
        self.links: dict[str, bool] = {}  # endpoint -> watched
        self.made: Counter[str] = Counter()  # endpoint -> links made there (Connect)
        self.wake_at = INF
        self.ticked = -INF  # when its core last ticked
        self.joined: list[Any] = []  # PeerBroker, as services were told
        self.left: list[tuple[Any, str]] = []  # (PeerBroker, why)
        self.ended_alive: set[str] = set()  # lives that ended with their peer running (alive)
        self.messages: list[tuple[str, str, list[bytes]]] = []  # (life, service, frames)
        self.logs: list[Log] = []
        #: what the services were told, in order: ("joined" | "left" | "message", life id,
        #: the peer's start id)
        self.told: list[tuple[str, str, str]] = []
        self.trusted: set[str] = set()
        self.lookups = 0
        #: told what the layer tells the services (joined, left, message), if not None
        self.service: Any = None
        self.paused = False
        #: what came while paused, read on resume: ("frames", frames) | ("link", endpoint, up)
        self.waiting: list[tuple[Any, ...]] = []

    # --- what the services see -------------------------------------------------------------------

    def send(self, life: str, service: str, frames: list[Any]) -> bool:
        """A service's send, as ClusterNode.send does it."""
        now = self.net.now
        got = self.core.send(life, service, frames, now)
        if got is True or got is False:
            self.net.defer(self)
            return got
        if isinstance(got, Send):
            got = [got]
        *first, send = got
        self.run(first)  # (the link, made first)
        taken = self.core.service_sent(send, self.net.transmit(self, send.endpoint, send.frames),
                                       now)
        self.net.defer(self)
        return taken

    def lives(self) -> dict[str, str]:
        """Peer name -> the life services have of it now."""
        gone = {life.id for life, _ in self.left}
        return {life.name: life.id for life in self.joined if life.id not in gone}

    def peers(self) -> set[str]:
        return {p.name for p in self.core.membership.peers.values()}

    def said(self, event: str) -> list[dict[str, Any]]:
        """The fields of the log lines of ``event``."""
        return [line.fields for line in self.logs if line.event == event]

    # --- carrying out the core's actions ---------------------------------------------------------

    def run(self, actions: list[Any]) -> None:
        for action in actions:
            self.do(action)

    def do(self, action: Any) -> None:
        net, core, now = self.net, self.core, self.net.now
        if isinstance(action, Send):
            linked = not action.if_writable or net.connected(self, action.endpoint)
            ok = linked and net.transmit(self, action.endpoint, action.frames)
            if action.report != NOT_REPORTED:
                self.run(core.sent(action, ok, now, linked))
        elif isinstance(action, SendHeld):
            done = action.held.send(lambda frames: net.transmit(self, action.endpoint, frames))
            self.run(core.held_sent(action.peer, done, now))
        elif isinstance(action, Connect):
            self.made[action.endpoint] += 1
            net.connect(self, action.endpoint, action.watch)
        elif isinstance(action, Watch):
            if action.endpoint in self.links and not self.links[action.endpoint]:
                self.links[action.endpoint] = True
        elif isinstance(action, Disconnect):
            self.links.pop(action.endpoint, None)
        elif isinstance(action, Joined):
            self.joined.append(action.life)
            self.told.append(("joined", action.life.id, action.life.member))
            if self.service is not None:
                self.service.joined(action.life)
        elif isinstance(action, Left):
            self.left.append((action.life, action.why))
            if action.alive:
                self.ended_alive.add(action.life.id)
            self.told.append(("left", action.life.id, action.life.member))
            if self.service is not None:
                self.service.left(action.life, action.why, action.alive)
        elif isinstance(action, Deliver):
            self.told.append(("message", action.life.id, action.life.member))
            self.messages.append((action.life.id, action.service,
                                  [bytes(f) for f in action.frames]))
            if self.service is not None:
                self.service.message(action.life, action.service, action.frames)
        elif isinstance(action, Log):
            self.logs.append(action)
        elif isinstance(action, Wake):
            self.wake_at = min(self.wake_at, action.at)
        elif isinstance(action, Trust):
            self.trusted.add(action.address)
        elif isinstance(action, LookUpClosed):
            self.lookups += 1
        else:
            raise AssertionError(f"an action the harness does not know: {action!r}")

    def rearm(self) -> None:
        self.wake_at = min(self.wake_at, self.core.next_wake(self.net.now))

    def due(self) -> float:
        """When it ticks next: a timer due at once runs a turn of the loop later (1 ms) than
        the last tick, as a loop's timers do (a PING refused is due again at once); never
        while paused."""
        return INF if self.paused else max(self.wake_at, self.ticked + 0.001)


class Network:
    """Brokers at ``tcp://NAME:5670`` and the links between them."""

    def __init__(self, timeout: float = 3.0) -> None:
        self.now = 0.0
        self.timeout = timeout
        self.nodes: dict[str, Node] = {}  # by endpoint
        self.queue: deque[tuple[Node, str, list[Frame]]] = deque()
        self.cut: set[frozenset[str]] = set()
        self.full: set[tuple[str, str]] = set()  # (from, to) endpoints: sends refused
        self.sent: Counter[bytes] = Counter()  # messages sent, by kind
        self.starts = 0
        self._deferred: list[Node] = []
        #: frames -> frames, for a message on its way from one broker to another (None: lost)
        self.tamper: Any = None
        #: (from, to) endpoints whose messages wait (``hold``); those that wait, in order
        self.holding: set[tuple[str, str]] = set()
        self.held_back: list[tuple[Node, str, list[Frame]]] = []

    # --- brokers ---------------------------------------------------------------------------------

    def start(self, name: str, seeds: tuple[str, ...] | list[str] = (), *, keyed: bool = True,
              legacy: bool = False, features: dict[str, dict[str, Any]] | None = None) -> Node:
        """A broker ``name`` (a new id at every start) with ``seeds`` (names); ``legacy``: a
        broker of before, whose HELLOs say neither gossip nor numbering."""
        self.starts += 1
        me = Hello(f"{name}.{self.starts}", name, "prod", endpoint_of(name),
                   features=features or {}, host=f"host-{name}")
        core = NodeCore(me, self.timeout, self.now, seeds=[endpoint_of(s) for s in seeds],
                        bound=endpoint_of(name), keyed=keyed,
                        address_of=lambda frame: getattr(frame, "address", ""))
        node = Node(self, name, core, legacy)
        self.nodes[node.endpoint] = node
        node.run(core.start(self.now))
        node.rearm()
        for other in self.nodes.values():  # links to this endpoint connect (again)
            if other is not node and node.endpoint in other.links:
                self._link_event(other, node.endpoint, True)
        return node

    def stop(self, name: str, why: str | None = None) -> None:
        """``name`` stops, saying BYE."""
        node = self.nodes[endpoint_of(name)]
        node.run(node.core.stop(why, self.now))
        self.deliver()
        self.kill(name)

    def kill(self, name: str) -> None:
        """``name`` is gone without a word: its connections close (the kernel closes them)."""
        node = self.nodes.pop(endpoint_of(name))
        for other in self.nodes.values():
            if node.endpoint in other.links:
                self._link_event(other, node.endpoint, False)

    def crash(self, name: str) -> None:
        """``name`` killed at once (kill -9), as ``kill``; and its messages still on their way
        (not those a held link keeps: ``hold``), and what it had still to carry out, are lost
        with its process, as if libzmq had not handed them on yet."""
        node = self.node(name)
        self.queue = deque(m for m in self.queue if m[0] is not node)
        if node in self._deferred:
            self._deferred.remove(node)
        self.kill(name)

    def node(self, name: str) -> Node:
        return self.nodes[endpoint_of(name)]

    def pause(self, name: str) -> None:
        """``name`` stops running (SIGSTOP): its links stay up, what comes waits."""
        self.node(name).paused = True

    def resume(self, name: str) -> None:
        """``name`` runs again: it reads what came meanwhile, then its timers run."""
        node = self.node(name)
        node.paused = False
        waiting, node.waiting = node.waiting, []
        for what in waiting:
            if what[0] == "frames":
                node.run(node.core.received(what[1], self.now, self.now))
            else:
                node.run(node.core.link_event(what[1], what[2], self.now))
        node.rearm()
        self.defer(node)
        self.deliver()

    def inject(self, name: str, sender: bytes, frames: list[bytes], address: str = "") -> None:
        """A message at ``name``'s socket from anyone (a stranger's DEALER)."""
        node = self.node(name)
        node.run(node.core.received(frames_of(sender, frames, address), self.now, self.now))
        node.rearm()

    # --- links -----------------------------------------------------------------------------------

    def connected(self, node: Node, endpoint: str) -> bool:
        return (endpoint in node.links and endpoint in self.nodes
                and frozenset((node.endpoint, endpoint)) not in self.cut)

    def connect(self, node: Node, endpoint: str, watch: bool) -> None:
        if endpoint not in node.links:
            node.links[endpoint] = False
            if self.connected(node, endpoint) and watch:
                self._link_event(node, endpoint, True, watched=True)
        node.links[endpoint] = node.links[endpoint] or watch

    def transmit(self, node: Node, endpoint: str, frames: list[Any]) -> bool:
        """A send on ``node``'s link to ``endpoint`` (made if it is not): False if refused."""
        if endpoint not in node.links:
            node.links[endpoint] = False
        if not self.connected(node, endpoint) or (node.endpoint, endpoint) in self.full:
            return False
        frames = [builtins_bytes(f) for f in frames]
        if node.legacy and frames[0] == b"HELLO":  # says nothing of gossip and numbering
            said = json.loads(frames[1])
            said.pop("gossip"), said.pop("numbered")
            frames[1] = json.dumps(said).encode()
        self.sent[frames[0]] += 1
        self.queue.append((node, endpoint, frames_of(node.id.encode(), frames,
                                                     node.endpoint.split("//")[1][:-5])))
        return True

    def _link_event(self, node: Node, endpoint: str, connected: bool,
                    watched: bool = False) -> None:
        if watched or node.links.get(endpoint):
            if node.paused:
                node.waiting.append(("link", endpoint, connected))
                return
            node.run(node.core.link_event(endpoint, connected, self.now))
            node.rearm()

    def partition(self, left: str, right: str, cut: bool = True) -> None:
        """Cut (or mend) the links between each broker named in ``left`` and each in
        ``right``: what is in flight between them is lost."""
        for a in left:
            for b in right:
                pair = frozenset((endpoint_of(a), endpoint_of(b)))
                if (pair in self.cut) == cut:
                    continue
                (self.cut.add if cut else self.cut.discard)(pair)
                for x, y in ((a, b), (b, a)):
                    node = self.nodes.get(endpoint_of(x))
                    if node is not None and endpoint_of(y) in node.links \
                            and endpoint_of(y) in self.nodes:
                        self._link_event(node, endpoint_of(y), not cut)

    # --- time ------------------------------------------------------------------------------------

    def defer(self, node: Node) -> None:
        if node.core.deferred and node not in self._deferred:
            self._deferred.append(node)

    def deliver(self) -> None:
        """Everything in flight arrives (and what it makes the brokers send)."""
        for _ in range(100_000):
            ready = next((n for n in self._deferred if not n.paused), None)
            if ready is not None:
                self._deferred.remove(ready)
                node = ready
                actions, node.core.deferred = node.core.deferred, []
                node.run(actions)
                node.rearm()
                continue
            if not self.queue:
                return
            self._arrive(*self.queue.popleft())
        raise AssertionError("the brokers never stop talking")

    def advance(self, to: float) -> None:
        """Move the clock to ``to``, running every tick due on the way, each at its time."""
        while True:
            self.deliver()
            due = min((n.due() for n in self.nodes.values()), default=INF)
            if due > to:
                break
            self.now = max(self.now, due)
            for node in list(self.nodes.values()):
                if node.due() <= self.now and node.endpoint in self.nodes:
                    node.wake_at, node.ticked = INF, self.now
                    node.run(node.core.flush_held(self.now))
                    node.run(node.core.tick(self.now, self.now))
                    node.rearm()
        self.now = max(self.now, to)

    def run(self, seconds: float, until: Any = None, step: float = 0.05) -> float:
        """Let ``seconds`` pass (or until ``until()``, looked at every ``step``): the time it
        took."""
        start = self.now
        while self.now - start < seconds - 1e-9:
            self.advance(min(self.now + step, start + seconds))
            if until is not None and until():
                break
        return self.now - start

    # --- what the tests look at ------------------------------------------------------------------

    def peers(self, name: str) -> set[str]:
        return self.node(name).peers()

    def complete(self) -> bool:
        names = {n.name for n in self.nodes.values()}
        return all(self.peers(n) == names - {n} for n in names)

    def contacts_of(self, name: str) -> list[str]:
        """Everyone's contacts at ``name``'s endpoint."""
        at = endpoint_of(name)
        return [n.name for n in self.nodes.values() if at in n.core.membership.contacts]

    def meet(self, *names: str, seeds: str | None = None, within: float = 5.0) -> list[Node]:
        """Brokers ``names`` started (the first the others' seed) and met."""
        first, *rest = names
        nodes = [self.start(first)] + [self.start(n, seeds=[seeds or first]) for n in rest]
        self.run(within, until=self.complete)
        assert self.complete(), {n.name: n.peers() for n in nodes}
        return nodes

    # --- links held one way, and links overtaking each other -------------------------------------

    def hold(self, src: str, dst: str) -> None:
        """What ``src`` sends ``dst`` waits on the way (a slow link, one way: its heartbeats
        too), until ``release``."""
        self.holding.add((endpoint_of(src), endpoint_of(dst)))

    def release(self, src: str, dst: str) -> None:
        """What waited from ``src`` to ``dst`` arrives, in order, before anything sent after
        it; then everything in flight."""
        link = (endpoint_of(src), endpoint_of(dst))
        self.holding.discard(link)
        waited = [m for m in self.held_back if (m[0].endpoint, m[1]) == link]
        self.held_back = [m for m in self.held_back if (m[0].endpoint, m[1]) != link]
        self.queue.extendleft(reversed(waited))
        self.deliver()

    def in_flight(self) -> list[tuple[str, str]]:
        """The links (from, to: names) with a message on its way, not held."""
        links = dict.fromkeys((src.name, endpoint) for src, endpoint, _ in self.queue
                              if (src.endpoint, endpoint) not in self.holding)
        return [(src, endpoint.split("//")[1][:-5]) for src, endpoint in links]

    def deliver_link(self, src: str, dst: str, count: int | None = None) -> int:
        """The next ``count`` messages (all, if None) on their way from ``src`` to ``dst``
        arrive, and only they: what they make the brokers send stays on its way. How many
        arrived."""
        link = (endpoint_of(src), endpoint_of(dst))
        if link in self.holding:
            return 0
        mine = [m for m in self.queue if (m[0].endpoint, m[1]) == link][:count]
        if mine:
            taken = {id(m) for m in mine}
            self.queue = deque(m for m in self.queue if id(m) not in taken)
        for src_node, endpoint, frames in mine:
            self._arrive(src_node, endpoint, frames)
        return len(mine)

    def step(self, rng: Any) -> bool:
        """One random link's next message arrives (False: none is on its way): messages of
        different links overtake each other, those of one link never do."""
        links = self.in_flight()
        if not links:
            return False
        self.deliver_link(*rng.choice(links), count=1)
        return True

    def _arrive(self, src: Node, endpoint: str, frames: list[Frame]) -> None:
        """One message on its way to ``endpoint`` arrives: lost (the broker gone, the link
        cut), held back (``hold``), or read (now, or on ``resume``)."""
        node = self.nodes.get(endpoint)
        if node is None or frozenset((src.endpoint, endpoint)) in self.cut:
            return
        if (src.endpoint, endpoint) in self.holding:
            self.held_back.append((src, endpoint, frames))
            return
        if self.tamper is not None:
            frames = self.tamper(src, node, frames)
            if frames is None:
                return
        if node.paused:
            node.waiting.append(("frames", frames))
            return
        node.run(node.core.received(frames, self.now, self.now))
        node.rearm()
