"""A broker's place in the cluster, without I/O: its peers' messages, its heartbeats, what it
holds for a peer whose link is made again, and the services' traffic to and from peers.

``NodeCore`` is given events — a message with its frames (``received``), the time (``tick``,
``flush_held``), what a link did (``link_event``, ``link_refused``, ``connect_failed``), what
the broker or a service asks (``add_contact``, ``send``, ``stop``) — and returns what to do as
actions (actions.py), in order. Who is a peer is membership.py's; gossip.py's the MEMBERS;
numbering.py's the numbers of the service messages; diagnosis.py's why hosts do not link. The
time is passed in: ``now`` on the clock the caller's timers run on, ``mono`` a precise one for
the heartbeat's round trips (a loop's clock may tick in whole milliseconds).

A send whose outcome matters (``Send.report``) is reported back by the caller at once, before
any other event: with ``sent``, or for a service's message (the Send ``send`` returns), with
``service_sent``. What a service's send takes besides (a life that ends in it) waits in
``deferred``, for the caller to carry out on its next turn, not from inside the service's send.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from zbroker.runtime.stats import LATENCY_BOUNDS, Buckets
from zbroker.service import PeerBroker

from .. import gossip, troubles
from ..membership import Change, Hello, Membership, Peer
from . import protocol as wire
from .actions import (
    HELLO_RETRY,
    HELLO_SENT,
    PEER_SENT,
    SERVICE_SENT,
    Action,
    Connect,
    Deliver,
    Disconnect,
    Joined,
    Left,
    Log,
    Send,
    SendHeld,
    Trust,
    Wake,
    Watch,
)
from .diagnosis import Diagnosis
from .held import HOLD_RETRY, HOLD_SECONDS, Held
from .protocol import Frame

CONTACT_RETRY = 0.25  # seconds between HELLOs to a contact that has not answered
#: seconds a link to a contact may stay unconnected before it is made anew: libzmq gives up
#: on a link after some handshake failures (e.g. the other side had a key and we have none),
#: and would never try again once the other side is fixed
LINK_RETRY = 2.0


@dataclasses.dataclass
class Counters:
    """For metrics (read at scrape time): service traffic, losses, heartbeat round trips; a
    node that takes another's place goes on with them."""

    bytes_sent: int = 0
    bytes_received: int = 0
    peer_losses: int = 0
    rtt: Buckets = dataclasses.field(default_factory=lambda: Buckets(LATENCY_BOUNDS))
    last_rtt: dict[str, float] = dataclasses.field(default_factory=dict)  # peer id -> seconds


def _no_address(frame: Frame) -> str:
    return ""


class NodeCore:
    def __init__(self, me: Hello, timeout: float, now: float, *, seeds: Iterable[str] = (),
                 bound: str = "", keyed: bool = False, key_file: str | None = None,
                 counters: Counters | None = None, closed: set[tuple[str, int]] | None = None,
                 address_of: Callable[[Frame], str] = _no_address,
                 refusals: troubles.Refusals | None = None) -> None:
        """``me``: our HELLO's fixed part; ``bound``: the endpoint our socket is bound to (a
        contact there is ourselves); ``keyed``: the cluster has a key; ``closed``: the
        connections closed at our socket before (tcp_table.py); ``address_of``: where a
        frame came from ("" if unknown); ``counters`` and ``refusals``: where they are kept
        (the caller's, which it reads for the metrics and the status)."""
        self.membership = Membership(me, timeout)
        self.bound = bound
        self.keyed = keyed
        self.counters = counters or Counters()
        self.address_of = address_of
        self.diagnosis = Diagnosis(self.membership, seeds, keyed, key_file, now,
                                   refusals=refusals, closed=closed)
        self.lives: dict[str, PeerBroker] = {}  # peer id -> the life services know
        self.held: dict[str, Held] = {}  # peer id -> what waits for its link
        self.links: dict[str, float] = {}  # endpoint -> when our link there was made
        self.watched: set[str] = set()  # endpoints whose links are followed
        #: actions for the next turn: what a service's send took (a life that ended in it)
        self.deferred: list[Action] = []

    # --- what the broker asks --------------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        """Say HELLO to the seeds."""
        out: list[Action] = []
        for endpoint in sorted(self.diagnosis.static):
            out += self.add_contact(endpoint, True, now)
        out.append(Wake(now))
        return out

    def stop(self, why: str | None, now: float) -> list[Action]:
        """Say BYE to every peer; with ``why`` (a new node takes this one's place), the BYEs
        say it and every peer's life ends here too, the services told as of a loss. Then
        every link is closed (letting the BYEs go)."""
        out: list[Action] = []
        for peer in list(self.membership.peers.values()):
            self._send(out, peer.endpoint, [wire.KIND_BYE, *([why.encode()] if why else [])],
                       now)
            if why is not None:
                self._apply(self.membership.bye(peer.id, now), now, out, why)
        for endpoint in list(self.links):
            self._disconnect(endpoint, out, linger=200)
        return out

    def add_contact(self, endpoint: str, pinned: bool, now: float) -> list[Action]:
        """An endpoint where a peer may listen: said HELLO to for good (static list,
        discovery), or unpinned (a peer of the node before this one) until given up."""
        out: list[Action] = []
        if endpoint != self.bound and endpoint not in self.membership.contacts:
            self._apply(self.membership.add_contact(endpoint, now, pinned=pinned), now, out)
            out.append(Wake(now))
        return out

    # --- what services send ----------------------------------------------------------------------

    def send(self, life: str, service: str, frames: list[Any], now: float
             ) -> Send | list[Action] | bool:
        """A service message to one life of a peer: the Send of SERVICE_SENT that sends it,
        reported with ``service_sent`` (or the actions that do, the last that Send, when its
        link is to be made first), True
        if it is held (its peer's link is made again), False if that life has ended (a life
        that ends here: what it takes is in ``deferred``)."""
        peer_id = life.partition("#")[0]
        known = self.lives.get(peer_id)
        peer = self.membership.peers.get(peer_id)
        if known is None or known.id != life or peer is None:
            return False
        numbering = peer.numbering
        message = ([wire.KIND_SVC, service.encode(), *frames] if numbering is None else
                   [wire.KIND_SVCN, numbering.next_tag(), service.encode(), *frames])
        held = self.held.get(peer_id)
        if held is not None:
            if held.add(message):  # after those, in order
                return True
            self._unreachable(peer_id, now)
            return False
        send = Send(peer.endpoint, message, SERVICE_SENT, peer_id)
        if peer.endpoint in self.links:
            return send
        out: list[Action] = []
        self._link(peer.endpoint, now, out)
        out.append(send)
        return out

    def service_sent(self, send: Send, ok: bool, now: float) -> bool:
        """The outcome of the Send ``send`` returned: it went (``ok``: True); or the link
        refused it: held, in order, for a numbered peer (True), else that peer is unreachable
        (False). What it takes is in ``deferred``."""
        if ok:
            self.membership.sent(send.peer, now)
            return True
        peer = self.membership.peers.get(send.peer)
        if peer is not None and peer.numbering is not None:  # its link is made again?
            held = self.held.get(send.peer)
            if held is None:
                held = self.held[send.peer] = Held(now)
                self.deferred.append(Wake(now + HOLD_RETRY))
            if held.add(send.frames):
                return True
        self._unreachable(send.peer, now)
        return False

    def _unreachable(self, peer_id: str, now: float) -> None:
        """The peer's life ends now; the services are told on the next turn (``deferred``),
        not from inside their own send."""
        self._apply(self.membership.bye(peer_id, now), now, self.deferred,
                    "unreachable (its send queue is full or its link is down)")

    # --- what is reported back -----------------------------------------------------------------

    def sent(self, send: Send, ok: bool, now: float, linked: bool = True) -> list[Action]:
        """The outcome of a Send that asked for it (``ok``: it went; ``linked``: its link was
        connected, for one ``if_writable``)."""
        if send.report == PEER_SENT:
            if ok:
                self.membership.sent(send.peer, now)
            else:
                self.membership.send_refused(send.peer, now)
            return []
        contact = self.membership.contacts.get(send.endpoint)
        if ok:
            if contact is not None:
                contact.last_said = now
        elif send.report == HELLO_RETRY and not linked and contact is not None \
                and contact.pinned and now - self.links.get(send.endpoint, now) > LINK_RETRY:
            # a configured or discovered peer's link (not one a HELLO named: those are given
            # up soon, and a flood of them must not churn sockets): made anew at the next turn
            out: list[Action] = []
            self._disconnect(send.endpoint, out)
            return out
        return []

    def held_sent(self, peer_id: str, done: bool, now: float) -> list[Action]:
        """What was held for ``peer_id`` all went (``done``), or not: a peer whose link stays
        down past HOLD_SECONDS is unreachable."""
        held = self.held.get(peer_id)
        out: list[Action] = []
        if held is None:
            return out
        if done:
            del self.held[peer_id]
            self.membership.sent(peer_id, now)
        elif now - held.since >= HOLD_SECONDS:
            del self.held[peer_id]
            self._apply(self.membership.bye(peer_id, now), now, out,
                        f"unreachable (its link stayed down for {now - held.since:.1f} s)")
        return out

    def connect_failed(self, endpoint: str, error: str, now: float) -> list[Action]:
        """Our link to ``endpoint`` could not be made: the contact is given up."""
        self.links.pop(endpoint, None)
        self.watched.discard(endpoint)
        out: list[Action] = [Log("warning", "cluster contact given up",
                                 {"contact": endpoint, "why": f"cannot connect: {error}"})]
        self._apply(self.membership.forget_contact(endpoint), now, out)
        return out

    def link_event(self, endpoint: str, connected: bool, now: float) -> list[Action]:
        """Our link to ``endpoint`` connected, or closed (the peer there is suspect)."""
        if connected:
            self.membership.connected(endpoint)
        else:
            self.membership.disconnected(endpoint, now)
        return [Log("debug", "cluster link", {"endpoint": endpoint,
                                              "link": "connected" if connected else "closed"})]

    def link_refused(self, endpoint: str, why: str, sure: bool, now: float) -> list[Action]:
        """Our link to ``endpoint`` failed its handshake: told, and closed, to be made anew
        when next used."""
        out = self.diagnosis.refused(endpoint, why, troubles.THEIRS, now, sure=sure)
        self._disconnect(endpoint, out, soon=True)
        return out

    # --- timers ----------------------------------------------------------------------------------

    def next_wake(self, now: float) -> float:
        """When ``tick`` is due next (inf: not until something happens)."""
        at = self.membership.next_deadline()
        if self.held:
            at = min(at, now + HOLD_RETRY)
        if self.membership.unanswered():
            at = min(at, now + CONTACT_RETRY)
        return at

    def flush_held(self, now: float) -> list[Action]:
        """Send what is held for peers whose links are back (before ``tick``)."""
        out: list[Action] = []
        for peer_id, held in list(self.held.items()):
            peer = self.membership.peers.get(peer_id)
            if peer is None:
                del self.held[peer_id]
                continue
            if peer.endpoint not in self.links:
                self._link(peer.endpoint, now, out)
            out.append(SendHeld(peer.endpoint, held, peer_id))
        return out

    def tick(self, now: float, mono: float) -> list[Action]:
        """Heartbeats: peers lost, PINGs due, gossip in turn, HELLOs to contacts that have not
        answered."""
        out: list[Action] = []
        to_ping, change = self.membership.due(now)
        if change.stalled:
            out.append(Log("warning", "broker did not run (paused, or its loop blocked): its "
                           "peers' silence meanwhile is not counted",
                           {"seconds": round(change.stalled, 2)}))
        ping = wire.ASK + wire.PING_CLOCK.pack(mono)
        for peer in to_ping:
            self._ping(peer, ping, now, out)
        told = self.membership.gossip_due(now)
        if told is not None:  # whom we know, to one peer in turn
            self._tell_members(told, now, out)
        for contact in self.membership.unanswered():
            if now - contact.last_said >= CONTACT_RETRY:
                self._say_hello(contact.endpoint, False, now, out, HELLO_RETRY)
        # the losses last: services told of one send at once, and a PING built above counts
        # the messages sent before it; sent after theirs, it would count too few
        self._apply(change, now, out)
        return out

    # --- messages from peers ---------------------------------------------------------------------

    def received(self, frames: Sequence[Frame], now: float, mono: float) -> list[Action]:
        """A message at our socket: ``frames[0]`` the sender's routing id."""
        out: list[Action] = []
        if len(frames) < 2:
            return out
        sender = frames[0].bytes.decode("ascii", "replace")
        kind = frames[1].bytes
        self.counters.bytes_received += sum(map(len, frames))
        membership = self.membership
        if kind == wire.KIND_SVCN and len(frames) >= 4:
            if membership.heard(sender, now):
                numbering = membership.peers[sender].numbering
                problem = numbering.take(frames[2].bytes) if numbering is not None \
                    else "it numbered a message though its HELLO did not say so"
                if problem is not None:
                    self._end_life(sender, problem, now, out)
                else:
                    out.append(Deliver(self.lives[sender],
                                       frames[3].bytes.decode("ascii", "replace"),
                                       [f.buffer for f in frames[4:]]))
        elif kind == wire.KIND_SVC and len(frames) >= 3:
            if membership.heard(sender, now):
                out.append(Deliver(self.lives[sender], frames[2].bytes.decode("ascii", "replace"),
                                   [f.buffer for f in frames[3:]]))
        elif kind == wire.KIND_PING:
            if membership.heard(sender, now) and len(frames) in (3, 4):
                numbering = membership.peers[sender].numbering
                problem = numbering.check_count(frames[3].bytes) \
                    if len(frames) == 4 and numbering is not None else None
                if problem is not None:
                    self._end_life(sender, problem, now, out)
                else:
                    self._echo(sender, frames[2].bytes, now, mono, out)
        elif kind == wire.KIND_HELLO and len(frames) == 3:
            self._hello(frames, now, out)
        elif kind == wire.KIND_BYE:
            why = frames[2].bytes[:wire.MAX_WHY].decode("utf-8", "replace") \
                if len(frames) > 2 else ""
            # (a BYE that says why ends the life, not the peer: one without is its stop)
            self._apply(membership.bye(sender, now), now, out,
                        f"it ended its life of us: {why}" if why else None,
                        alive=(sender,) if why else ())
        elif kind == wire.KIND_MEMBERS and len(frames) == 3:
            self._members(sender, frames[2], now, out)
        else:
            out.append(Log("warning", "invalid cluster message",
                           {"address": self.address_of(frames[1]),
                            "sender": wire.printable(sender[:40]), "kind": kind[:16]}))
        return out

    def _end_life(self, sender: str, why: str, now: float, out: list[Action]) -> None:
        """Our life of peer ``sender`` cannot go on (its messages did not all arrive): end
        it, and tell the peer so (it ends its own; both then start afresh)."""
        peer = self.membership.peers[sender]
        self._send(out, peer.endpoint, [wire.KIND_BYE, why.encode()], now)
        self._apply(self.membership.bye(sender, now), now, out, why, alive=(sender,))

    def _echo(self, sender: str, payload: bytes, now: float, mono: float,
              out: list[Action]) -> None:
        """A PING with a payload: answer the sender's "?t" with "!t"; our own "!t" come back
        is a round trip."""
        if payload[:1] == wire.ASK:
            peer = self.membership.peers.get(sender)
            if peer is not None:
                self._ping(peer, wire.ECHO + payload[1:], now, out)
        elif payload[:1] == wire.ECHO and len(payload) == 1 + wire.PING_CLOCK.size:
            rtt = mono - wire.PING_CLOCK.unpack(payload[1:])[0]
            if 0 <= rtt < 3600:
                self.counters.rtt.observe(rtt)
                self.counters.last_rtt[sender] = rtt

    def _hello(self, frames: Sequence[Frame], now: float, out: list[Action]) -> None:
        address = self.address_of(frames[2])
        try:
            hello = Hello.from_dict(json.loads(frames[2].bytes))
        except (ValueError, RecursionError):
            hello = None
        if hello is None:
            out.append(Log("warning", "invalid HELLO",
                           {"address": address, "sender": frames[0].bytes[:40]}))
            return
        if "://*:" in hello.endpoint and address:  # it listens on all interfaces: use the
            # address it came from
            hello = dataclasses.replace(hello,
                                        endpoint=hello.endpoint.replace("*", address, 1))
        self.diagnosis.heard_at_seed(hello)
        membership = self.membership
        own = membership.own_contact(hello)
        if own is not None:  # a contact that turned out to be ourselves
            self.diagnosis.static.discard(own)
            self._apply(membership.forget_contact(own), now, out)
            return
        sender = frames[0].bytes.decode("ascii", "replace")
        change = membership.hello(hello, now, sender)
        if change.refused:
            # where it came from identifies it; what it claims is its own choice
            out.append(Log("warning", "peer refused", {
                "address": address, "claimed_name": hello.name[:64],
                "claimed_endpoint": hello.endpoint[:80], "why": change.refused}))
            return
        if address:  # a peer's host: out of the strangers' pool
            out.append(Trust(address))
        if change.challenge:  # it is admitted once it answers there
            contact = membership.contacts.get(change.challenge)
            if contact is not None and now - contact.last_said >= CONTACT_RETRY:
                self._say_hello(change.challenge, False, now, out, HELLO_SENT)
        if change.reply_hello_to:  # first, so that it reaches the peer before what services
            self._say_hello(change.reply_hello_to, True, now, out, HELLO_SENT)  # send it
        # when it joins; a life of the sender that ends on its HELLO ends with the sender
        # running (it restarted its session with us), unlike that of an old start of it
        self._apply(change, now, out, address=address, alive=(hello.id,))

    def _members(self, sender: str, frame: Frame, now: float, out: list[Action]) -> None:
        """What a peer says of whom it knows: the members we did not know are said HELLO to."""
        address = self.address_of(frame)
        membership = self.membership
        peer = membership.peers.get(sender)
        if peer is None or not membership.heard(sender, now):
            out.append(Log("warning", "gossip refused", {
                "address": address, "sender": wire.printable(sender[:40]),
                "why": "not from a peer"}))
            return
        members, problem = gossip.decode(frame.buffer)
        if problem:
            out.append(Log("warning", "invalid gossip",
                           {"address": address, "peer": peer.label, "why": problem}))
        change = membership.learn(members, sender, now)
        if change.refused:
            out.append(Log("warning", "gossip partly ignored",
                           {"address": address, "peer": peer.label, "why": change.refused}))
        if change.learned:
            out.append(Log("info", "members learned", {
                "peer": peer.label, "id": peer.id, "contacts": len(change.learned),
                "first": change.learned[0]}))
            out.append(Wake(now))

    # --- what we send ----------------------------------------------------------------------------

    def _link(self, endpoint: str, now: float, out: list[Action]) -> None:
        """Our link to ``endpoint``, made now: followed if it is a seed's or a discovered
        one's (a refused handshake is told; one a HELLO named: not)."""
        self.links[endpoint] = now
        contact = self.membership.contacts.get(endpoint)
        watch = contact is not None and contact.pinned
        if watch:
            self.watched.add(endpoint)
        out.append(Connect(endpoint, watch))

    def _disconnect(self, endpoint: str, out: list[Action], linger: int = 0,
                    soon: bool = False) -> None:
        if self.links.pop(endpoint, None) is not None:
            self.watched.discard(endpoint)
            out.append(Disconnect(endpoint, linger, soon))

    def _send(self, out: list[Action], endpoint: str, frames: list[Any], now: float,
              report: int = 0, peer: str = "", if_writable: bool = False) -> None:
        if endpoint not in self.links:
            self._link(endpoint, now, out)
        out.append(Send(endpoint, frames, report, peer, if_writable))

    def _say_hello(self, endpoint: str, reply: bool, now: float, out: list[Action],
                   report: int) -> None:
        """Our HELLO to ``endpoint``; one that is not a reply goes only once our link there
        is connected."""
        hello = self.membership.greeting(endpoint, reply)
        self._send(out, endpoint, [wire.KIND_HELLO, json.dumps(hello.to_dict()).encode()], now,
                   report, if_writable=not reply)

    def _ping(self, peer: Peer, payload: bytes, now: float, out: list[Action]) -> None:
        """A PING to ``peer``: with the count of our messages if it numbers them (none while
        messages are held for it: they are counted, not sent yet)."""
        if peer.id in self.held:
            return
        frames = [wire.KIND_PING, payload]
        if peer.numbering is not None:
            frames.append(peer.numbering.count_tag())
        self._send(out, peer.endpoint, frames, now, PEER_SENT, peer.id)

    def _tell_members(self, peer: Peer, now: float, out: list[Action]) -> None:
        """Tell ``peer`` whom we have as peers (if it takes it)."""
        members = self.membership.members_for(peer.id)
        if peer.gossip and members:
            self._send(out, peer.endpoint, [wire.KIND_MEMBERS, gossip.encode(members)], now,
                       PEER_SENT, peer.id)

    # --- joins and losses ------------------------------------------------------------------------

    def _apply(self, change: Change, now: float, out: list[Action], reason: str | None = None,
               address: str = "", alive: Collection[str] = ()) -> None:
        """Act on ``change``; ``address``: where the message that made it came from;
        ``alive``: the ids of the peers whose lives end while they run (Left.alive)."""
        if change.dropped:
            # a flood of HELLOs gives contacts up one by one: logged by where the HELLOs come
            # from, so that the repeats are counted into one line
            out.append(Log("warning", "cluster contacts given up", {
                "contacts": len(change.dropped), "first": change.dropped[0][:80],
                **({"address": address} if address else {}),
                "why": self.diagnosis.dropped_why(change.dropped)}))
        for endpoint in change.dropped:
            self._disconnect(endpoint, out)
        counters = self.counters
        for peer, why in change.left:
            life = self.lives.pop(peer.id, None)
            self.held.pop(peer.id, None)
            counters.peer_losses += 1
            counters.last_rtt.pop(peer.id, None)
            out.append(Log("warning", "peer left", {
                "peer": peer.label, "id": peer.id, "life": peer.life, "endpoint": peer.endpoint,
                "why": reason or why}))
            if life is not None:
                out.append(Left(life, reason or why, alive=peer.id in alive))
        for peer in change.joined:
            life = PeerBroker(peer.life, peer.name, peer.endpoint, member=peer.id,
                              features=peer.features, numbered=peer.numbering is not None,
                              label=peer.label)
            self.lives[peer.id] = life
            if peer.endpoint in self.links and peer.endpoint not in self.watched:
                self.watched.add(peer.endpoint)
                out.append(Watch(peer.endpoint))
            fields: dict[str, Any] = {"peer": peer.label, "id": peer.id, "life": peer.life,
                                      "endpoint": peer.endpoint}
            if not self.keyed:  # said on every join: nothing proved who it is
                out.append(Log("warning", "peer joined", {
                    **fields, "insecure": "no cluster key: anyone who says the cluster's "
                                          "name joins"}))
            else:
                out.append(Log("info", "peer joined", fields))
            out.append(Joined(life))
            self._tell_members(peer, now, out)

    # --- for the status --------------------------------------------------------------------------

    def peers(self, now: float) -> list[dict[str, Any]]:
        last_rtt = self.counters.last_rtt
        return [{"id": p.id, "name": p.name, "host": p.host, "label": p.label,
                 "endpoint": p.endpoint, "last_heard_s": round(now - p.last_heard, 3),
                 **({"rtt_s": round(last_rtt[p.id], 6)} if p.id in last_rtt else {})}
                for p in self.membership.peers.values()]
