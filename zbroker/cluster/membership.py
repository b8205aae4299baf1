"""Who is in the cluster: peers, their heartbeats, joins and losses. No I/O.

Belts and Braces (zguide, "Heartbeating"): a broker pings a peer only when it has sent it
nothing for ``interval``; anything heard from a peer counts as liveness; a peer not heard from for
``timeout`` is lost. Sooner, when our connection to it closed (its process died: the kernel
closes its sockets at once) and nothing was heard from it for ``suspect_grace`` after that
(a connection that only broke is made again, and the peer's own traffic goes on meanwhile).
mDNS says nothing about liveness (it keeps a killed broker for many
minutes): only what is heard counts.

A peer is admitted by its HELLO. Each admission is a new *life* of the peer, with a key of its
own (``<peer id>#<n>``), and services see lives, not brokers: state kept for an old life
(pipe ends, in-flight data) is dropped when it ends, and a late message of an old life cannot
act on a new one.

A HELLO that is not a reply asks the receiver to start afresh with the sender: it is sent by a
broker that does not have the receiver as a peer (first contact, or after it lost it). If the
receiver still had the sender as a peer (it did not notice the partition), that old life ends
first, so both sides start from the same state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class Hello:
    id: str  # the broker's id, new at every start
    name: str
    cluster: str
    endpoint: str  # where its peer socket listens
    version: int = PROTOCOL_VERSION
    reply: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "cluster": self.cluster,
                "endpoint": self.endpoint, "version": self.version, "reply": self.reply}

    @classmethod
    def from_dict(cls, data: Any) -> Hello | None:
        try:
            hello = cls(str(data["id"]), str(data["name"]), str(data["cluster"]),
                        str(data["endpoint"]), int(data["version"]), bool(data["reply"]))
        except (KeyError, TypeError, ValueError):
            return None
        return hello if hello.id and hello.endpoint else None


@dataclass
class Peer:
    id: str
    name: str
    endpoint: str
    life: str  # key of this admission, given to services
    joined: float
    last_heard: float
    last_sent: float
    suspect_since: float | None = None  # our connection to it closed then


@dataclass
class Change:
    """What happened, for the caller to act on."""

    joined: list[Peer] = field(default_factory=list)
    left: list[tuple[Peer, str]] = field(default_factory=list)  # (peer, why)
    reply_hello_to: str | None = None  # endpoint to answer with our HELLO
    refused: str | None = None  # why a HELLO was not taken


class Membership:
    def __init__(self, me: Hello, timeout: float, interval: float | None = None,
                 suspect_grace: float | None = None) -> None:
        self.me = me
        self.timeout = timeout
        self.interval = interval if interval is not None else timeout / 3
        self.suspect_grace = (suspect_grace if suspect_grace is not None
                              else min(timeout, max(0.5, timeout / 6)))
        self.peers: dict[str, Peer] = {}  # by broker id
        self._lives = 0

    def hello(self, hello: Hello, now: float) -> Change:
        change = Change()
        if hello.id == self.me.id:
            change.refused = "that is this broker"
            return change
        if hello.cluster != self.me.cluster:
            change.refused = f"cluster {hello.cluster!r} is not ours ({self.me.cluster!r})"
            return change
        if hello.version != PROTOCOL_VERSION:
            change.refused = f"protocol version {hello.version}, ours is {PROTOCOL_VERSION}"
            return change
        known = self.peers.get(hello.id)
        if known is not None and (hello.reply or now - known.joined < self.interval):
            # a reply, or both sides said HELLO at once when they met: nothing to start afresh
            known.last_heard = now
            if not hello.reply:
                change.reply_hello_to = hello.endpoint
            return change
        if known is not None:  # it starts afresh with us: so do we
            change.left.append((self.peers.pop(hello.id), "restarted its session with us"))
        self._lives += 1
        peer = Peer(hello.id, hello.name, hello.endpoint, f"{hello.id}#{self._lives}", now, now,
                    now)
        self.peers[hello.id] = peer
        change.joined.append(peer)
        if not hello.reply:
            change.reply_hello_to = hello.endpoint
        return change

    def heard(self, peer_id: str, now: float) -> bool:
        """Traffic from ``peer_id``: True if it is a peer (else the traffic is to be ignored)."""
        peer = self.peers.get(peer_id)
        if peer is None:
            return False
        peer.last_heard = now
        peer.suspect_since = None
        return True

    def disconnected(self, endpoint: str, now: float) -> None:
        """Our connection to the peer at ``endpoint`` closed."""
        for peer in self.peers.values():
            if peer.endpoint == endpoint and peer.suspect_since is None:
                peer.suspect_since = now

    def connected(self, endpoint: str) -> None:
        """Our connection to ``endpoint`` is made (again): no reason to suspect it."""
        for peer in self.peers.values():
            if peer.endpoint == endpoint:
                peer.suspect_since = None

    def sent(self, peer_id: str, now: float) -> None:
        peer = self.peers.get(peer_id)
        if peer is not None:
            peer.last_sent = now

    def bye(self, peer_id: str) -> Change:
        change = Change()
        peer = self.peers.pop(peer_id, None)
        if peer is not None:
            change.left.append((peer, "said goodbye"))
        return change

    def due(self, now: float) -> tuple[list[Peer], Change]:
        """Peers to ping now, and peers lost (silent for ``timeout``)."""
        change = Change()
        for peer_id, peer in list(self.peers.items()):
            if now - peer.last_heard >= self.timeout:
                del self.peers[peer_id]
                change.left.append((peer, f"silent for {now - peer.last_heard:.1f} s"))
            elif (peer.suspect_since is not None
                  and now - peer.suspect_since >= self.suspect_grace):
                del self.peers[peer_id]
                change.left.append((peer, f"its connection closed and nothing was heard for "
                                          f"{now - peer.suspect_since:.1f} s"))
        to_ping = [p for p in self.peers.values() if now - p.last_sent >= self.interval]
        return to_ping, change

    def next_deadline(self) -> float:
        if not self.peers:
            return float("inf")
        return min(min(p.last_heard + self.timeout, p.last_sent + self.interval,
                       float("inf") if p.suspect_since is None
                       else p.suspect_since + self.suspect_grace)
                   for p in self.peers.values())
