"""Who is in the cluster: peers, their heartbeats, joins and losses. No I/O.

Belts and Braces (zguide, "Heartbeating"): a broker pings a peer only when it has sent it
nothing for ``interval``; anything heard from a peer counts as liveness; a peer not heard from for
``timeout`` is lost. Sooner, when our connection to it closed (its process died: the kernel
closes its sockets at once) and nothing was heard from it for ``suspect_grace`` after that
(a connection that only broke is made again, and the peer's own traffic goes on meanwhile).
What is read within ``SUSPECT_SETTLE`` of the close does not count: a dead process's last
messages, sent before it died, may be read after its closed connection is seen.
mDNS says nothing about liveness (it keeps a killed broker for many
minutes): only what is heard counts.

A peer is admitted by its HELLO. Each admission is a new *life* of the peer, with a key of its
own (``<peer id>#<n>``), and services see lives, not brokers: state kept for an old life
(pipe ends, in-flight data) is dropped when it ends, and a late message of an old life cannot
act on a new one.

A HELLO that is not a reply asks the receiver to start afresh with the sender: it is sent by a
broker that does not have the receiver as a peer (first contact, or after it lost it). If the
receiver still had the sender as a peer (it did not notice the partition), that old life ends
first, so both sides start from the same state. Each HELLO names the sender's *session* with
the receiver, a token made anew each time the sender loses the peer there: the HELLOs that
cross when two brokers meet carry the session that the receiver admitted, a HELLO after a loss
a new one. So a loss is told from a crossing however soon after the meeting it comes (a broker
of before sends no session: its HELLO within a heartbeat interval of its admission is taken
as a crossing). A HELLO to a peer also names the receiver's session that the sender admitted
(``admitted``): a HELLO of ours from before a partition, held back on the way and delivered
once the link is back, can start a life of a session we no longer have (its contact given up
since); the answer says so, and instead of a life whose every message the peer would refuse,
we say our HELLO again, with our session now, and the peer starts afresh with that one.

A HELLO proves nothing by itself: anyone who reaches the peer socket can send one, with any id
and any endpoint. So a broker is admitted only once it *answers at the endpoint it claims*:
every HELLO we send to an endpoint carries a nonce for that endpoint (an HMAC of it under a
secret of this process, so nothing is kept per endpoint to check it), and every HELLO echoes
the last nonce its sender got from the receiver. A new life starts only on a HELLO that echoes
our nonce for its endpoint; any other HELLO from a stranger is answered with our own HELLO to
the endpoint it claims (a *challenge*): a real broker there answers with the echo and is
admitted, a made-up endpoint never does. Each HELLO sent in answer costs one received, and the
endpoints we talk to (*contacts*) are bounded: those learned from HELLOs that have not become a
peer are at most ``max_pending``, the oldest given up first, and each is given up after
``contact_timeout``. Static and discovered contacts are kept (and said HELLO to) for good.

Members also learn of each other from each other (gossip, gossip.py): a broker tells a peer
that joins it every other peer it has, and one peer in turn every ``gossip_interval`` — so one
seed in ``cluster.peers`` is enough to find the rest, across routers. What gossip names becomes
a *learned* contact, nothing more: it is admitted as a peer only by the HELLO round trip above,
at the endpoint gossip gave (at most ``max_learned`` such contacts wait at once, each given up
after ``contact_timeout`` like those learned from HELLOs). Gossip is taken only from peers, and
never says that a member is gone: only a member's own BYE, or our own heartbeats and link to it,
end a peer; and a new start of a broker (a new id) that answers at a peer's endpoint ends the
old start's life at once. A member lost is not brought back by stale gossip: its id (new at
every start: its incarnation) is remembered as gone for ``forget_after``, and gossip naming it
is ignored meanwhile; only the member itself, by answering our HELLO or saying its own, can
rejoin sooner.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .numbering import Numbering, session_bytes

PROTOCOL_VERSION = 2  # 2: HELLOs carry a nonce and its echo (admission by answer)
MAX_PENDING = 64  # contacts learned from HELLOs that have not become a peer
MAX_ENDPOINT = 256  # characters of an endpoint a HELLO may claim
MAX_LEARNED = 512  # contacts learned from gossip that have not become a peer
MAX_GONE = 1024  # ids of lost members remembered (against stale gossip)
SUSPECT_SETTLE = 0.1  # seconds after a close in which what is read was sent before it
SEND_RETRY = 0.1  # seconds before a PING (or MEMBERS) the peer's link refused is tried again
STALL_MIN = 0.5  # seconds late a timer must be for the broker to count as not having run


#: what a broker of before says of its ZPIPES at the HELLO's top level (it knows no
#: ``services``): taken as the ``zpipes`` service's features when a HELLO has no
#: ``services``, and still said there, for such brokers, from our own ``zpipes`` features
LEGACY_FEATURES = {"zpipes": ("directory", "fanout", "write_frames", "confirm")}
MAX_FEATURES = 64  # services, and keys of a service's features, a HELLO may carry


@dataclass(frozen=True)
class Hello:
    id: str  # the broker's id, new at every start
    name: str
    cluster: str
    endpoint: str  # where its peer socket listens
    version: int = PROTOCOL_VERSION
    reply: bool = False
    nonce: str = ""  # the sender's nonce for the receiver's endpoint
    echo: str = ""  # the last nonce the sender got from the receiver
    #: the sender takes and sends MEMBERS (gossip.py); brokers of before say nothing of it
    #: and are sent none (so no protocol version of its own)
    gossip: bool = True
    #: the sender's session with the receiver: new each time the sender lost the peer there
    session: str = ""
    #: the receiver's session the sender has a life of it with (the one its admitting HELLO
    #: named), if it has it as a peer: a HELLO of the receiver's from before, held back on
    #: the way, may have started it (see Membership.hello); brokers of before say nothing
    admitted: str = ""
    #: the sender numbers its service messages within a life (numbering.py); brokers of
    #: before say nothing of it and are sent the plain ones
    numbered: bool = True
    #: what each of the sender's services says it does (Service.features), by service; the
    #: cluster carries them without knowing what they mean
    features: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the sender's host name, for people to read (brokers of before say nothing of it)
    host: str = ""

    def to_dict(self) -> dict[str, Any]:
        legacy = {key: (self.features.get(service) or {}).get(key) is True
                  for service, keys in LEGACY_FEATURES.items() for key in keys}
        return {"id": self.id, "name": self.name, "cluster": self.cluster,
                "endpoint": self.endpoint, "version": self.version, "reply": self.reply,
                "nonce": self.nonce, "echo": self.echo, "gossip": self.gossip,
                "session": self.session, "admitted": self.admitted,
                "numbered": self.numbered, **legacy,
                "services": self.features, **({"host": self.host} if self.host else {})}

    @classmethod
    def from_dict(cls, data: Any) -> Hello | None:
        try:
            hello = cls(str(data["id"]), str(data["name"]), str(data["cluster"]),
                        str(data["endpoint"]), int(data["version"]), bool(data["reply"]),
                        str(data.get("nonce", "")), str(data.get("echo", "")),
                        data.get("gossip") is True, str(data.get("session", "")),
                        str(data.get("admitted", "")), data.get("numbered") is True,
                        _features(data), _host(data.get("host")))
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        return hello if hello.id and hello.endpoint else None


MAX_HOST = 64  # characters of a peer's host name kept


def _host(value: Any) -> str:
    """A HELLO's host name, made printable and short (it is shown to people)."""
    if not isinstance(value, str):
        return ""
    return "".join(c for c in value[:MAX_HOST] if c.isprintable() and not c.isspace())


def _features(data: Any) -> dict[str, dict[str, Any]]:
    """A HELLO's features by service: its ``services`` (what is not a mapping of mappings is
    left out), or from a broker of before its top-level flags (LEGACY_FEATURES)."""
    said = data.get("services")
    if not isinstance(said, dict):
        return {service: {key: data.get(key) is True for key in keys}
                for service, keys in LEGACY_FEATURES.items()}
    return {str(service): {str(k): v for k, v in list(features.items())[:MAX_FEATURES]}
            for service, features in list(said.items())[:MAX_FEATURES]
            if isinstance(features, dict)}


def endpoint_problem(endpoint: str, transport: str) -> str | None:
    """Why a peer cannot be at ``endpoint`` (None if it can): an endpoint a HELLO claims must be
    of our own peer socket's ``transport``, and for tcp a host and a port."""
    if len(endpoint) > MAX_ENDPOINT:
        return f"its endpoint is longer than {MAX_ENDPOINT} characters"
    kind, sep, address = endpoint.partition("://")
    if not sep or kind != transport:
        return f"its endpoint {endpoint!r} is not a {transport}:// endpoint"
    if kind == "tcp":
        host, _, port = address.rpartition(":")
        if not host or "*" in host or not port.isdigit() or not 0 < int(port) < 65536:
            return f"its endpoint {endpoint!r} is not tcp://HOST:PORT"
    elif not address:
        return f"its endpoint {endpoint!r} has no address"
    return None


def new_session() -> str:
    """A token for our session with a peer (HELLO's ``session``)."""
    return secrets.token_hex(8)


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
    gossip: bool = False  # it takes MEMBERS
    #: what its services said they do, from the HELLO that admitted it (Hello.features)
    features: dict[str, dict[str, Any]] = field(default_factory=dict)
    session: str = ""  # its session with us, from the HELLO that admitted it
    #: its service messages' numbers and ours in this life (None: a broker of before)
    numbering: Numbering | None = None
    host: str = ""  # its host name, as its HELLO said it ("" for a broker of before)
    #: a PING refused (its link's queue full, or not connected): not tried again before then
    retry_at: float = float("-inf")

    @property
    def label(self) -> str:
        """How people are told of it: ``local@hosta (10.0.0.1)``."""
        return broker_label(self.name, self.host, self.endpoint)


def endpoint_host(where: str) -> str:
    """The host of ``tcp://HOST:PORT`` (brackets of an IPv6 address taken off), or ``where``
    itself when it is a bare address: one host, whether named by an endpoint or by the
    address a connection came from."""
    if "://" in where:
        where = where.partition("://")[2].rpartition(":")[0]
    return where.strip("[]")


def broker_label(name: str, host: str, endpoint: str) -> str:
    """A broker as people are told of it: its name, its host's name and the address it is
    reached at (``local@hosta (10.0.0.1)``): every host's broker may be named ``local``."""
    address = endpoint_host(endpoint) or endpoint
    return f"{name}@{host} ({address})" if host else f"{name} ({address})"


class Named(Protocol):
    """A member as gossip names it (gossip.Member)."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def endpoint(self) -> str: ...


@dataclass
class Contact:
    """An endpoint we say HELLO to: a static or discovered one (``pinned``), or one a HELLO
    claimed."""

    endpoint: str
    pinned: bool
    since: float  # when it was made, or when the last peer there left
    their_nonce: str = ""  # echoed in our HELLOs to it
    last_said: float = float("-inf")  # when we last said HELLO to it (kept by the caller)
    learned: bool = False  # named by gossip (not by a HELLO): bounded by ``max_learned``
    #: our session with the peer there: made anew when a peer there leaves
    session: str = field(default_factory=new_session)


@dataclass
class Change:
    """What happened, for the caller to act on."""

    joined: list[Peer] = field(default_factory=list)
    left: list[tuple[Peer, str]] = field(default_factory=list)  # (peer, why)
    reply_hello_to: str | None = None  # endpoint to answer with our HELLO
    refused: str | None = None  # why a HELLO was not taken
    challenge: str | None = None  # endpoint to say our HELLO to (not a reply) before admitting
    dropped: list[str] = field(default_factory=list)  # contacts given up: close their links
    learned: list[str] = field(default_factory=list)  # contacts gossip named: say HELLO there
    #: seconds this broker did not run (paused, or its loop blocked): not counted as its
    #: peers' silence
    stalled: float = 0.0


class Membership:
    def __init__(self, me: Hello, timeout: float, interval: float | None = None,
                 suspect_grace: float | None = None, *, secret: bytes | None = None,
                 max_pending: int = MAX_PENDING, contact_timeout: float | None = None,
                 max_learned: int = MAX_LEARNED, gossip_interval: float | None = None,
                 forget_after: float | None = None) -> None:
        self.me = me
        self.timeout = timeout
        self.interval = interval if interval is not None else timeout / 3
        self.max_learned = max_learned
        self.gossip_interval = gossip_interval if gossip_interval is not None else timeout
        self.suspect_grace = (suspect_grace if suspect_grace is not None
                              else min(timeout, max(0.5, timeout / 6)))
        self.max_pending = max_pending
        self.contact_timeout = (contact_timeout if contact_timeout is not None
                                else max(2.0, 2 * timeout))
        # longer than any other member can go on naming a lost one (it loses it within
        # ``timeout`` too) and than its contact is kept here
        self.forget_after = (forget_after if forget_after is not None
                             else self.contact_timeout + timeout)
        self.transport = me.endpoint.partition("://")[0]
        self.peers: dict[str, Peer] = {}  # by broker id
        self.contacts: dict[str, Contact] = {}  # by endpoint, oldest first
        self._secret = secret if secret is not None else secrets.token_bytes(16)
        self._lives = 0
        self.gone: dict[str, float] = {}  # id of a lost member -> when, oldest first
        self._last_gossip = float("-inf")
        self._gossip_turn = ""  # id of the peer last told in turn
        self._last_due: float | None = None

    # --- HELLOs --------------------------------------------------------------------------------

    def nonce(self, endpoint: str) -> str:
        """Our nonce for ``endpoint``: only what listens there learns it."""
        return hmac.new(self._secret, endpoint.encode(), hashlib.sha256).hexdigest()[:32]

    def greeting(self, endpoint: str, reply: bool) -> Hello:
        """Our HELLO to ``endpoint``."""
        contact = self.contacts.get(endpoint)
        me = self.me
        admitted = next((p.session for p in self.peers.values() if p.endpoint == endpoint), "")
        return Hello(me.id, me.name, me.cluster, me.endpoint, reply=reply,
                     nonce=self.nonce(endpoint), echo=contact.their_nonce if contact else "",
                     session=contact.session if contact else "", admitted=admitted,
                     features=me.features, host=me.host)

    def own_contact(self, hello: Hello) -> str | None:
        """The contact at which ``hello``, naming this broker, was said by this broker itself
        (it carries our nonce for that contact), or None: a HELLO that only claims our id
        cannot make us give up a contact."""
        if hello.id != self.me.id or not hello.nonce:
            return None
        for endpoint in self.contacts:
            if hmac.compare_digest(hello.nonce, self.nonce(endpoint)):
                return endpoint
        return None

    def hello(self, hello: Hello, now: float, sender: str | None = None) -> Change:
        """A HELLO from the broker connected as ``sender`` (None: not checked)."""
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
        if sender is not None and sender != hello.id:
            change.refused = "its HELLO names another broker than the one connected"
            return change
        problem = endpoint_problem(hello.endpoint, self.transport)
        if problem:
            change.refused = problem
            return change
        contact = self.contacts.get(hello.endpoint)
        if contact is not None and hello.nonce:
            contact.their_nonce = hello.nonce
        known = self.peers.get(hello.id)
        if hello.admitted and hello.admitted != (contact.session if contact else "") \
                and hello.echo and hmac.compare_digest(hello.echo, self.nonce(hello.endpoint)):
            return self._admitted_another(hello, known, now)
        if known is not None and known.endpoint == hello.endpoint and (
                hello.reply or (hello.session == known.session if hello.session
                                else now - known.joined < self.interval)):
            # a reply, or both sides said HELLO at once when they met (the session we
            # admitted): nothing to start afresh
            known.last_heard = now
            if not hello.reply:
                change.reply_hello_to = hello.endpoint
            return change
        if not (hello.echo and hmac.compare_digest(hello.echo, self.nonce(hello.endpoint))):
            # it has not answered at the endpoint it claims yet: ask there
            if contact is None:
                change = self.add_contact(hello.endpoint, now, pinned=False)
                self.contacts[hello.endpoint].their_nonce = hello.nonce
            change.challenge = hello.endpoint
            return change
        if contact is None:  # it answered a HELLO of a contact given up since
            contact = Contact(hello.endpoint, False, now, hello.nonce)
            self.contacts[hello.endpoint] = contact
        if known is not None:  # it starts afresh with us: so do we
            self._leave(known, now)
            change.left.append((known, "restarted its session with us"))
        for old in [p for p in self.peers.values() if p.endpoint == hello.endpoint]:
            # what answers there now is a new start: the old one is gone (no longer there)
            self._leave(old, now)
            change.left.append((old, "a new start of it answers at its endpoint"))
        self.gone.pop(hello.id, None)
        if self._last_gossip == float("-inf"):  # a joining peer is told at once: the first
            self._last_gossip = now  # one in turn only an interval later
        self._lives += 1
        peer = Peer(hello.id, hello.name, hello.endpoint, f"{hello.id}#{self._lives}", now, now,
                    now, gossip=hello.gossip, features=hello.features,
                    session=hello.session, host=hello.host)
        if hello.numbered and hello.session:
            peer.numbering = Numbering(session_bytes(contact.session),
                                       session_bytes(hello.session))
        self.peers[hello.id] = peer
        change.joined.append(peer)
        if not hello.reply:
            change.reply_hello_to = hello.endpoint
        return change

    def _admitted_another(self, hello: Hello, known: Peer | None, now: float) -> Change:
        """``hello`` (which answered us) says its sender has a life of us of a session that is
        not ours with it now: a HELLO of ours from before started it, one held back on the way
        (a partition: the kernel sends what was in flight on a connection again once the link
        is back) after we had lost the peer and given its contact up. Our messages in that
        life would be of a session it did not admit, and the life would end at its first
        message, or PING. So no life of ours starts on it (and one that did, on a HELLO of
        the sender's that crossed this one, ends): we say our HELLO, with the session we
        have, and the sender starts afresh with that one."""
        change = Change()
        if known is not None:
            self._leave(known, now)
            change.left.append((known, "its life of us is of a session of ours given up (a "
                                       "HELLO of ours from before, held back on the way, "
                                       "started it)"))
        if hello.endpoint not in self.contacts:
            change.dropped = self.add_contact(hello.endpoint, now, pinned=False).dropped
            self.contacts[hello.endpoint].their_nonce = hello.nonce
        change.challenge = hello.endpoint
        return change

    # --- contacts ------------------------------------------------------------------------------

    def add_contact(self, endpoint: str, now: float, pinned: bool = True) -> Change:
        """An endpoint to say HELLO to until a peer answers there. Unpinned ones (learned from
        a HELLO) are bounded: the oldest pending ones are given up (``Change.dropped``)."""
        change = Change()
        contact = self.contacts.get(endpoint)
        if contact is not None:
            contact.pinned = contact.pinned or pinned
            return change
        self.contacts[endpoint] = Contact(endpoint, pinned, now)
        if not pinned:
            pending = self._pending("hello")
            for old in pending[:max(0, len(pending) - self.max_pending)]:
                del self.contacts[old.endpoint]
                change.dropped.append(old.endpoint)
        return change

    def forget_contact(self, endpoint: str) -> Change:
        """Stop saying HELLO to ``endpoint`` (unless a peer is there)."""
        change = Change()
        if endpoint in self.contacts and endpoint not in self._up():
            del self.contacts[endpoint]
            change.dropped.append(endpoint)
        return change

    def unanswered(self) -> list[Contact]:
        """Contacts where no peer is: to say HELLO to."""
        return self._pending("all")

    def _up(self) -> set[str]:
        return {p.endpoint for p in self.peers.values()}

    def _pending(self, which: str) -> list[Contact]:
        """Contacts without a peer, oldest first: ``all``, ``unpinned`` (learned from HELLOs
        or gossip), ``hello`` or ``learned`` (from gossip) ones."""
        def wanted(c: Contact) -> bool:
            if which == "all":
                return True
            if c.pinned:
                return False
            return which == "unpinned" or c.learned == (which == "learned")

        up = self._up()
        found = [c for c in self.contacts.values() if c.endpoint not in up and wanted(c)]
        found.sort(key=lambda c: c.since)
        return found

    def _leave(self, peer: Peer, now: float) -> None:
        """``peer`` is no longer one: its contact is pending again, from now, and its id is
        remembered as gone (gossip naming it is stale)."""
        self.peers.pop(peer.id, None)
        self.gone.pop(peer.id, None)
        self.gone[peer.id] = now
        while len(self.gone) > MAX_GONE:
            del self.gone[next(iter(self.gone))]
        contact = self.contacts.get(peer.endpoint)
        if contact is not None and peer.endpoint not in self._up():
            contact.since = now
            contact.session = new_session()  # what we say there now is a new session

    def heard(self, peer_id: str, now: float) -> bool:
        """Traffic from ``peer_id``: True if it is a peer (else the traffic is to be ignored)."""
        peer = self.peers.get(peer_id)
        if peer is None:
            return False
        peer.last_heard = now
        if peer.suspect_since is not None and now - peer.suspect_since >= SUSPECT_SETTLE:
            peer.suspect_since = None  # (sooner, it may be what it sent before it died)
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

    def send_refused(self, peer_id: str, now: float) -> None:
        """Our PING (or MEMBERS) to ``peer_id`` could not go: tried again SEND_RETRY later,
        not at every turn of the loop until the peer is lost."""
        peer = self.peers.get(peer_id)
        if peer is not None:
            peer.retry_at = now + SEND_RETRY

    def bye(self, peer_id: str, now: float = 0.0) -> Change:
        change = Change()
        peer = self.peers.get(peer_id)
        if peer is not None:
            self._leave(peer, now)
            change.left.append((peer, "said goodbye"))
        return change

    def due(self, now: float) -> tuple[list[Peer], Change]:
        """Peers to ping now, peers lost (silent for ``timeout``), and contacts learned from
        HELLOs given up (no peer there for ``contact_timeout``)."""
        change = Change()
        self._credit_stall(now, change)
        for peer in list(self.peers.values()):
            if now - peer.last_heard >= self.timeout:
                self._leave(peer, now)
                change.left.append((peer, f"silent for {now - peer.last_heard:.1f} s"))
            elif (peer.suspect_since is not None
                  and now - peer.suspect_since >= self.suspect_grace):
                self._leave(peer, now)
                change.left.append((peer, f"its connection closed and nothing was heard for "
                                          f"{now - peer.suspect_since:.1f} s"))
        for contact in self._pending("unpinned"):
            if now - contact.since >= self.contact_timeout:
                del self.contacts[contact.endpoint]
                change.dropped.append(contact.endpoint)
        to_ping = [p for p in self.peers.values()
                   if now - p.last_sent >= self.interval and now >= p.retry_at]
        return to_ping, change

    def _credit_stall(self, now: float, change: Change) -> None:
        """``due`` runs at least every ``interval`` while there are peers (their pings are
        due). Called much later, this broker did not run meanwhile (SIGSTOP, a blocked loop):
        what its peers sent waits unread, so that time is not their silence. Without this, a
        broker resumed after a pause longer than ``timeout`` declares every live peer lost
        before it reads a byte of theirs."""
        last, self._last_due = self._last_due, now
        if last is None or not self.peers:
            return
        stalled = now - last - self.interval
        if stalled < max(STALL_MIN, self.interval / 2):
            return
        change.stalled = stalled
        for peer in self.peers.values():
            peer.last_heard = max(peer.last_heard, min(now, peer.last_heard + stalled))
            if peer.suspect_since is not None:
                peer.suspect_since += stalled

    def next_deadline(self) -> float:
        expiries = [c.since + self.contact_timeout for c in self._pending("unpinned")]
        if any(p.gossip for p in self.peers.values()):
            expiries.append(self._last_gossip + self.gossip_interval)
        return min([*(min(p.last_heard + self.timeout,
                          max(p.last_sent + self.interval, p.retry_at),
                          float("inf") if p.suspect_since is None
                          else p.suspect_since + self.suspect_grace)
                      for p in self.peers.values()), *expiries], default=float("inf"))

    # --- gossip ------------------------------------------------------------------------------

    def members_for(self, peer_id: str) -> list[Peer]:
        """What we tell ``peer_id`` of whom we know: every other peer we have."""
        return [p for p in self.peers.values() if p.id != peer_id]

    def gossip_due(self, now: float) -> Peer | None:
        """The peer to tell whom we know now (one every ``gossip_interval``, in turn), or None:
        anything a join's telling missed (a contact given up meanwhile, a partition) is told
        again."""
        if now - self._last_gossip < self.gossip_interval:
            return None
        told = sorted((p for p in self.peers.values() if p.gossip), key=lambda p: p.id)
        if not told:
            return None
        self._last_gossip = now
        peer = next((p for p in told if p.id > self._gossip_turn), told[0])
        self._gossip_turn = peer.id
        return peer

    def learn(self, members: Iterable[Named], sender: str, now: float) -> Change:
        """What peer ``sender`` says of whom it knows: members we neither have nor know to be
        gone become learned contacts (``Change.learned``), to be said HELLO to. ``refused``:
        why some or all of it was not taken."""
        change = Change()
        if sender not in self.peers:
            change.refused = "not from a peer"
            return change
        for gone_id, since in list(self.gone.items()):  # oldest first
            if now - since < self.forget_after:
                break
            del self.gone[gone_id]
        waiting = len(self._pending("learned"))
        bad, full = 0, 0
        for member in members:
            if member.id == self.me.id or member.id in self.peers or member.id in self.gone \
                    or member.endpoint in self.contacts or member.endpoint == self.me.endpoint:
                continue
            if endpoint_problem(member.endpoint, self.transport):
                bad += 1
                continue
            if waiting >= self.max_learned:
                full += 1
                continue
            self.contacts[member.endpoint] = Contact(member.endpoint, False, now, learned=True)
            change.learned.append(member.endpoint)
            waiting += 1
        problems = []
        if bad:
            problems.append(f"{bad} members at endpoints no peer can be at")
        if full:
            problems.append(f"{full} members past the {self.max_learned} learned contacts "
                            f"waiting")
        change.refused = "; ".join(problems) or None
        return change
