"""The broker's place in the cluster: the peer socket, links to peers, heartbeats, and the
services' traffic between brokers.

Each broker binds one ROUTER (``cluster.bind``) and connects one DEALER to each peer it knows
of, so traffic from B to A always travels on B's DEALER into A's ROUTER, in order. Every
message is ``[kind, ...]``:

    HELLO  json(Hello)        admission (see membership.py): a broker is admitted once it
                              answers our HELLO at the endpoint it claims
    PING [?t | !t [count]]    sent only when nothing else went to that peer for a while;
                              "?" + the sender's clock asks for an echo, "!" + the same
                              is the echo (a PING too): the heartbeat's round trip. A
                              broker that knows no echo just takes a PING with more frames
                              as a PING. ``count``: to a peer whose HELLO says
                              "numbered", the service messages sent in this life
                              (numbering.py): those that did not all arrive were lost
    BYE [why]                 the sender is stopping, or ended its life of the receiver
                              (``why``): drop it now rather than at its timeout
    MEMBERS json(members)     whom the sender has as peers (gossip.py): to a peer that joins
                              it, and to one peer in turn every peer_timeout; only to peers
                              whose HELLO says they take it
    SVC    service, frames... a service's own message (e.g. ZPIPES pipe traffic)
    SVCN   tag, service, frames...   the same, numbered within the life, to a peer whose
                              HELLO says "numbered" (numbering.py): a message missing, or
                              one of a session the receiver did not admit, ends the life

Peers are found by zeroconf (discovery.py), by the static ``cluster.peers`` list (seeds: one is
enough, the others are learned from it), by what peers say of whom they know, and by the HELLOs
that reach us. Liveness comes only from what is heard (membership.py).

Each contact (an endpoint we say HELLO to) has a DEALER, and each peer's DEALER a monitor too.
Everything a contact opened is closed when membership gives it up (a HELLO's made-up endpoint
that never answers, the oldest beyond the limit of pending ones): a flood of HELLOs costs a
bounded number of sockets.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import errno
import functools
import hmac
import itertools
import json
import os
import socket
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from zbroker.runtime.limits import CLUSTER_CONNECTIONS, CLUSTER_PER_SOURCE
from zbroker.runtime.stats import LATENCY_BOUNDS, Buckets
from zbroker.runtime.zmq_reader import SocketReader
from zbroker.service import PeerBroker
from zbroker.zmtp.admission import Admission, ConnectionBudget
from zbroker.zmtp.libzmq_door import UNTRUSTED_LIMIT, LibzmqDoor
from zbroker.zmtp.refusals import Refusals

from . import gossip, tcp_table, troubles
from .membership import Change, Hello, Membership, Peer, endpoint_host

KIND_HELLO, KIND_PING, KIND_BYE, KIND_SVC = b"HELLO", b"PING", b"BYE", b"SVC"
KIND_MEMBERS, KIND_SVCN = b"MEMBERS", b"SVCN"
MAX_WHY = 200  # characters of a BYE's reason logged
CONTACT_RETRY = 0.25  # seconds between HELLOs to a contact that has not answered
#: seconds a link to a contact may stay unconnected before it is made anew: libzmq gives up
#: on a link after some handshake failures (e.g. the other side had a key and we have none),
#: and would never try again once the other side is fixed
LINK_RETRY = 2.0
_HANDSHAKE_FAILED = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake failed: another security mechanism "
                                         "(a key on one side only?)",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "handshake failed: our key was refused",
}
#: seconds between looks at what to tell of refusals and seeds (troubles.py), and how long
#: a refusal is shown in the status after the last of it
DIAGNOSE_EVERY = 1.0
REFUSAL_SHOWN = 30.0
#: seconds after a refusal at our socket before its peer is looked up (the refusals of that
#: while are looked up at once: a peer may retry ten times a second)
ATTRIBUTE_AFTER = 0.5
ATTRIBUTE_WITHIN = 2.0  # seconds a refusal at our socket may wait for its peer to be found
SEND_HWM = 100_000  # messages queued to one peer before it counts as unreachable
#: a numbered peer's messages refused while its link is made again (a reset connection) are
#: held, in order, for at most this long and this many (and bytes), then the peer counts as
#: unreachable; what the reset took is noticed by the numbers (numbering.py), not by a
#: refused send
HOLD_SECONDS = 1.0
HOLD_MESSAGES = 10_000
HOLD_BYTES = 64 << 20
HOLD_RETRY = 0.01  # seconds between tries to send what is held
MIN_MESSAGE_LIMIT = 64 << 20  # the least a peer's message may be (MAXMSGSIZE)
ZERO_COPY_MIN = 1 << 16
# pyzmq's backend socket methods with int flags: several times cheaper per frame than the
# convenience layer, which converts flag enums and checks arguments on every call
_send = zmq.backend.Socket.send
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)


class ClusterError(Exception):
    pass


@dataclasses.dataclass
class _Held:
    """A peer's messages refused while its link was made again, in order."""

    since: float
    messages: collections.deque[list[Any]] = dataclasses.field(
        default_factory=collections.deque)
    size: int = 0  # their bytes

    def add(self, message: list[Any]) -> bool:
        """Hold ``message`` after the others; False if that is past the bounds."""
        if len(self.messages) >= HOLD_MESSAGES or self.size >= HOLD_BYTES:
            return False
        self.messages.append(message)
        self.size += sum(map(len, message))
        return True

    def send(self, send: Callable[[list[Any]], bool]) -> bool:
        """Hand the held messages, oldest first, to ``send`` until it refuses one; True if
        none is left."""
        messages = self.messages
        while messages and send(messages[0]):
            self.size -= sum(map(len, messages.popleft()))
        return not messages


def message_limit(largest_payload: int) -> int:
    """The largest message a peer may send us (libzmq drops a connection whose message claims
    more, as its head arrives): twice the largest payload a service here takes (a pipe's chunk,
    a queue's message), with room for headers, and at least MIN_MESSAGE_LIMIT, so that peers
    whose limits were raised a little more than ours are still heard; without it, anything
    that reaches the peer socket could have the broker hold a message of any size."""
    return max(MIN_MESSAGE_LIMIT, 2 * largest_payload + (1 << 20))


class ClusterNode:
    def __init__(self, config: Any, broker_name: str, zmq_context: zmq.Context,
                 loop: asyncio.AbstractEventLoop, log: Any,
                 on_join: Callable[[PeerBroker], None],
                 on_leave: Callable[[PeerBroker, str], None],
                 on_message: Callable[[PeerBroker, str, list[Any]], None],
                 max_message: int = MIN_MESSAGE_LIMIT,
                 features: dict[str, dict[str, Any]] | None = None,
                 seeds: tuple[str, ...] = ()) -> None:
        self.config = config
        self.features = dict(features or {})  # our services' (Service.features), by service
        self.max_message = max_message
        self.id = uuid.uuid4().hex
        self.broker_name = broker_name
        self._ctx, self._loop, self._log = zmq_context, loop, log
        self._on_join, self._on_leave, self._on_message = on_join, on_leave, on_message
        self.membership: Membership | None = None
        self._router: zmq.Socket | None = None
        self._reader: SocketReader | None = None
        self._dealers: dict[str, zmq.Socket] = {}  # endpoint -> DEALER
        self._monitors: dict[str, SocketReader] = {}  # endpoint -> its DEALER's events
        self._monitor_ids = itertools.count()
        self._link_made: dict[str, float] = {}  # endpoint -> when our link there was made
        self._static: set[str] = {*config.peers, *seeds}  # and a join token's seeds
        self._lives: dict[str, PeerBroker] = {}  # peer id -> the life services know
        self._held: dict[str, _Held] = {}  # peer id -> what waits for its link
        self._timer: asyncio.Handle | None = None
        self._timer_at = float("inf")
        self.discovery: Any = None
        self.endpoint = ""
        self.advertised = ""
        self._keys: tuple[bytes, bytes] | None = None  # CURVE (public, secret)
        self.key_file: str | None = None
        self._guard: Any = None
        # for metrics (read at scrape time): service traffic, losses, heartbeat round trips
        self.bytes_sent = 0
        self.bytes_received = 0
        self.peer_losses = 0
        self.rtt = Buckets(LATENCY_BOUNDS)
        self.last_rtt: dict[str, float] = {}  # peer id -> its last round trip (seconds)
        # why hosts do not link (troubles.py): refusals by peer and cause, seeds not answering
        self.refusals = troubles.Refusals()
        self._seeds: troubles.Seeds | None = None
        #: our peer socket's connections, in the process's budget; and its failed handshakes
        self._door: LibzmqDoor | None = None
        #: their causes (whether sure, and when), until their peers are looked up
        self._unattributed: list[tuple[str, bool, float]] = []
        self._closed_seen: set[tuple[str, int]] = set()  # connections we closed, looked at
        self._diagnose_timer: asyncio.TimerHandle | None = None
        #: seed -> id of the broker that answered there under another endpoint (its host's
        #: other address, a name): its seed answers, though no peer has that endpoint
        self._seed_answered: dict[str, str] = {}
        self._attribute_timer: asyncio.TimerHandle | None = None

    # --- life cycle ----------------------------------------------------------------------------

    async def start(self, keys: Any = None, bind_wait: float = 0.0) -> None:
        """Start: load the cluster key (or take ``keys``, what security.cluster_keys gave),
        bind the peer socket (waiting up to ``bind_wait`` seconds for its port to be free),
        say HELLO to the seeds, start discovery. ClusterError if it cannot."""
        cfg = self.config
        from .security import Guard, KeyFileError, cluster_keys

        if keys is None:
            try:
                keys = cluster_keys(cfg)
            except KeyFileError as exc:
                raise ClusterError(str(exc)) from None
        self._keys, path, made = keys
        if self._keys is not None:
            self.key_file = str(path)
            if made:
                self._log.warning("cluster key made: copy this file to every broker of the "
                                  "cluster (or name one in cluster.key_file)",
                                  key_file=self.key_file, cluster=cfg.name)
            self._guard = Guard(self._ctx, self._loop, self._log, self._keys[0])
            self._guard.on_refused = functools.partial(self._refused, why=troubles.NOT_OUR_KEY,
                                                       side=troubles.OURS)
        else:
            self._log.warning("cluster without a key (cluster.insecure): any host that says "
                              "the cluster's name can join and reach every pipe and queue",
                              cluster=cfg.name)
        router = self._ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVHWM, 0)
        router.setsockopt(zmq.MAXMSGSIZE, self.max_message)
        # a peer's connection silent for peer_timeout is dropped here too, not only by the
        # peer: a partition then leaves none for what was in flight on it (HELLOs the peer said
        # once it had lost us, that the kernel sends again when the link returns) to arrive on
        timeout_ms = int(cfg.peer_timeout * 1000)
        router.setsockopt(zmq.HEARTBEAT_IVL, max(100, timeout_ms // 3))
        router.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
        self._secure(router, server=True)
        self._door = LibzmqDoor(
            self._loop, Admission("cluster", Refusals(self._log), budget=ConnectionBudget(
                CLUSTER_CONNECTIONS, CLUSTER_PER_SOURCE)), untrusted_limit=UNTRUSTED_LIMIT)
        self._door.prepare(router)
        # a port let go by this process a moment ago (the node of before a new key) is free
        # again within milliseconds: libzmq closes its listener in its own thread
        deadline = self._loop.time() + bind_wait
        while True:
            try:
                router.bind(cfg.bind)
                break
            except zmq.ZMQError as exc:
                if exc.errno == errno.EADDRINUSE and self._loop.time() < deadline:
                    await asyncio.sleep(0.01)
                    continue
                router.close(linger=0)
                if self._guard is not None:
                    self._guard.close()
                from zbroker.runtime.port_holder import held

                raise ClusterError(f"cannot bind the cluster socket (cluster.bind) to "
                                   f"{cfg.bind}: {os.strerror(exc.errno)}{held(cfg.bind)}"
                                   ) from None
        self._router = router
        self._watch_socket(router)
        self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        advertised = cfg.advertise or _wildcard_host(self.endpoint)
        self.advertised = advertised
        me = Hello(self.id, self.broker_name, cfg.name, advertised, features=self.features,
                   host=socket.gethostname()[:64])
        self.membership = Membership(me, cfg.peer_timeout)
        self._reader = SocketReader(self._loop, router, self._on_message_frames,
                                    after=self._schedule_next, copy=False)
        for endpoint in self._static:
            self.add_contact(endpoint)
        if cfg.discovery:
            from .discovery import Discovery

            self.discovery = Discovery(self, self._log)
            await self.discovery.start()
        self._log.info("cluster started", cluster=cfg.name, id=self.id, endpoint=self.endpoint,
                       advertised=advertised, discovery=cfg.discovery, curve=bool(self._keys),
                       static_peers=len(self._static), peer_timeout=cfg.peer_timeout)
        self._seeds = troubles.Seeds(sorted(self._static), self._loop.time())
        self._schedule(0.0)
        self._reader.start()
        self._diagnose_timer = self._loop.call_later(DIAGNOSE_EVERY, self._diagnose)

    async def stop(self, why: str | None = None) -> None:
        """Stop: say BYE to every peer and close every socket. With ``why`` (the broker goes
        on: a new node takes this one's place), the BYEs say it and every peer's life ends
        here too, the services told as of a loss."""
        if self._timer is not None:
            self._timer.cancel()
        for timer in (self._diagnose_timer, self._attribute_timer):
            if timer is not None:
                timer.cancel()
        self._diagnose_timer = self._attribute_timer = None
        if self._door is not None:
            self._door.stop()
            self._door = None
        if self.discovery is not None:
            await self.discovery.stop()
        if self.membership is not None:
            for peer in list(self.membership.peers.values()):
                self._send_raw(peer.endpoint, [KIND_BYE, *([why.encode()] if why else [])])
                if why is not None:
                    self._apply(self.membership.bye(peer.id, self._loop.time()), why)
        if self._router is not None:
            self._reader.stop()
            self._router.close(linger=0)
            self._router = None
        for endpoint in list(self._dealers):
            self._close_link(endpoint, linger=200)  # let the BYEs go
        if self._guard is not None:
            self._guard.close()
            self._guard = None

    # --- what services use -----------------------------------------------------------------------

    def send(self, life: str, service: str, frames: list[Any]) -> bool:
        """Send a service message to one life of a peer. False if that life has ended. A
        message that cannot be queued (the link is down, or the peer's queue full) is held,
        in order, for a numbered peer (see HOLD_SECONDS); a peer of before is declared lost at
        once: nothing is dropped silently."""
        peer_id = life.partition("#")[0]
        known = self._lives.get(peer_id)
        # (a send refused earlier in this turn of the loop ended the life in membership; the
        # services learn of it on the next turn)
        peer = self.membership.peers.get(peer_id)
        if known is None or known.id != life or peer is None:
            return False
        numbering = peer.numbering
        message = ([KIND_SVC, service.encode(), *frames] if numbering is None else
                   [KIND_SVCN, numbering.next_tag(), service.encode(), *frames])
        held = self._held.get(peer_id)
        if held is None:
            if self._send_raw(peer.endpoint, message):
                self.membership.sent(peer_id, self._loop.time())
                return True
            if numbering is not None:  # its link is being made again?
                held = self._held[peer_id] = _Held(self._loop.time())
                held.add(message)
                self._schedule(HOLD_RETRY)
                return True
        elif held.add(message):  # after those, in order
            return True
        # tell the services on the next turn of the loop, not from inside their own send
        self._loop.call_soon(self._apply, self.membership.bye(peer_id, self._loop.time()),
                             "unreachable (its send queue is full or its link is down)")
        return False

    def set_max_message(self, max_message: int) -> None:
        """The largest message a peer may send (see message_limit), from now on: for links
        that peers make from now on (libzmq gives each connection the limit it had then)."""
        self.max_message = max_message
        if self._router is not None:
            self._router.setsockopt(zmq.MAXMSGSIZE, max_message)

    def peers(self) -> list[dict[str, Any]]:
        now = self._loop.time()
        return [{"id": p.id, "name": p.name, "host": p.host, "label": p.label,
                 "endpoint": p.endpoint,
                 "last_heard_s": round(now - p.last_heard, 3),
                 **({"rtt_s": round(self.last_rtt[p.id], 6)} if p.id in self.last_rtt
                    else {})}
                for p in (self.membership.peers.values() if self.membership else [])]

    def metrics(self) -> dict[str, Any]:
        """Counters for metrics, as plain data."""
        now = self._loop.time()
        return {"peers": len(self.membership.peers) if self.membership else 0,
                "peer_list": [{"label": p.label, "endpoint": p.endpoint,
                               "last_heard_s": round(now - p.last_heard, 3)}
                              for p in (self.membership.peers.values() if self.membership
                                        else [])],
                "peer_losses": self.peer_losses, "bytes_sent": self.bytes_sent,
                "bytes_received": self.bytes_received, "rtt": self.rtt.snapshot(),
                "refused": dict(self.refusals.total),
                "not_answering": self.pending_contacts() if self.membership else 0}

    def add_contact(self, endpoint: str, pinned: bool = True) -> None:
        """An endpoint where a peer may listen: said HELLO to for good (static list,
        discovery), or unpinned (a peer of the node before this one) until given up."""
        if endpoint != self.endpoint and endpoint not in self.membership.contacts:
            self._apply(self.membership.add_contact(endpoint, self._loop.time(),
                                                    pinned=pinned))
            self._schedule(0.0)

    def keys(self) -> tuple[bytes, bytes] | None:
        """The cluster's CURVE key pair (public, secret) this node runs with; None: none."""
        return self._keys

    def carry_counters(self, before: ClusterNode) -> None:
        """Go on counting from the node this one takes the place of (a new cluster key)."""
        self.bytes_sent, self.bytes_received = before.bytes_sent, before.bytes_received
        self.peer_losses, self.rtt = before.peer_losses, before.rtt

    def security(self) -> dict[str, Any]:
        """For the status: the key file (none: insecure) and the handshakes refused (ours
        and theirs)."""
        return {"key_file": self.key_file, "insecure": self._keys is None,
                "refused": sum(self.refusals.total.values()),
                "port": self._door.status() if self._door is not None else None}

    def pending_contacts(self) -> int:
        """Contacts no peer answers at (for the status)."""
        return len(self._unanswered())

    def _unanswered(self) -> list[Any]:
        """Contacts no peer answers at: not those of a seed a peer answered at under
        another endpoint."""
        if self.membership is None:
            return []
        answered = self._answering_seeds()
        return [c for c in self.membership.unanswered() if c.endpoint not in answered]

    def _answering_seeds(self) -> set[str]:
        peers = self.membership.peers if self.membership else {}
        return {seed for seed, peer in self._seed_answered.items() if peer in peers}

    def diagnosis(self) -> dict[str, Any]:
        """For the status: each contact not answering and each peer refused, since when
        (wall clock, seconds since the epoch) and for how long."""
        now, wall = self._loop.time(), time.time()
        contacts = self._unanswered()
        return {
            "not_answering": [
                {"endpoint": c.endpoint, "since": round(wall - (now - c.since), 3),
                 "seconds": round(now - c.since, 3), "seed": c.endpoint in self._static}
                for c in contacts],
            "refusals": [
                {"peer": r.peer, "why": r.why, "refused_by": "us" if r.side == troubles.OURS
                 else "the peer", "since": round(wall - (now - r.since), 3),
                 "seconds": round(now - r.since, 3), "times": r.times,
                 "last_s": round(now - r.last, 3)}
                for r in self.refusals.current(now, REFUSAL_SHOWN)],
        }

    def hint(self) -> str:
        """A line for a client whose wait timed out, when links to other brokers are what
        may be missing: no peers, or peers refused ("" when nothing is wrong here)."""
        if self.membership is None:
            return ""
        current = self.refusals.current(self._loop.time(), REFUSAL_SHOWN)
        # one host, whether named by its address or by its endpoint, is one broker
        hosts = sorted({endpoint_host(r.peer) for r in current})
        named = ", ".join(hosts[:3]) + (f" and {len(hosts) - 3} more" if len(hosts) > 3
                                        else "")
        why = current[0].why if current else ""
        if not self.membership.peers:
            what = "this broker has no peers"
            if hosts:
                what += f"; it and {named} refuse each other ({why})"
        elif hosts:
            what = f"this broker and {named} refuse each other ({why})"
        else:
            return ""
        return f"{what}: see zbroker status"

    # --- I/O ---------------------------------------------------------------------------------

    def _dealer(self, endpoint: str) -> zmq.Socket | None:
        """Our link to ``endpoint``, made on first use; None if it cannot be made."""
        dealer = self._dealers.get(endpoint)
        if dealer is None:
            dealer = self._ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.ROUTING_ID, self.id.encode())
            dealer.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a peer we cannot reach
            dealer.setsockopt(zmq.SNDHWM, SEND_HWM)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RECONNECT_IVL, 100)
            dealer.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            dealer.setsockopt(zmq.CONNECT_TIMEOUT, 1000)
            timeout_ms = int(self.config.peer_timeout * 1000)
            dealer.setsockopt(zmq.HEARTBEAT_IVL, max(100, timeout_ms // 3))
            dealer.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
            self._secure(dealer, server=False)
            try:
                dealer.connect(endpoint)
            except zmq.ZMQError as exc:
                dealer.close(linger=0)
                self._log.warning("cluster contact given up", contact=endpoint,
                                  why=f"cannot connect: {exc}")
                self._apply(self.membership.forget_contact(endpoint))
                return None
            self._dealers[endpoint] = dealer
            self._link_made[endpoint] = self._loop.time()
            contact = self.membership.contacts.get(endpoint)
            if contact is not None and contact.pinned:  # a seed's or a discovered one's: a
                self._watch(endpoint)  # refused handshake is told (one a HELLO named: not)
        return dealer

    def _watch(self, endpoint: str) -> None:
        """Follow our link to a peer: its connection closing makes the peer suspect; a failed
        handshake closes it, to be made anew when next used."""
        dealer = self._dealers.get(endpoint)
        if dealer is None or endpoint in self._monitors:
            return
        events = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
        for event in _HANDSHAKE_FAILED:
            events |= event
        monitor = dealer.get_monitor_socket(events,
                                            addr=f"inproc://zbroker.cluster.link."
                                                 f"{self.id}.{next(self._monitor_ids)}")
        reader = SocketReader(self._loop, monitor,
                              functools.partial(self._on_link_event, endpoint),
                              after=self._schedule_next)
        self._monitors[endpoint] = reader
        reader.start()

    def _close_link(self, endpoint: str, linger: int = 0) -> None:
        """Close everything our link to ``endpoint`` opened: its DEALER, its monitor and the
        monitor's reader."""
        reader = self._monitors.pop(endpoint, None)
        dealer = self._dealers.pop(endpoint, None)
        self._link_made.pop(endpoint, None)
        if reader is not None:
            reader.stop()
            if dealer is not None:
                try:
                    dealer.disable_monitor()
                except zmq.ZMQError:
                    pass
            reader.sock.close(linger=0)
        if dealer is not None:
            dealer.close(linger=linger)

    def _on_link_event(self, endpoint: str, frames: list[bytes]) -> None:
        """Our link to ``endpoint`` connected or closed."""
        if self.membership is None:
            return
        event = parse_monitor_message(frames)["event"]
        failed = _HANDSHAKE_FAILED.get(event)
        if failed is not None:
            value = parse_monitor_message(frames)["value"]
            self._refused(endpoint, troubles.cause(event, value, self._keys is not None,
                                                   troubles.THEIRS), troubles.THEIRS,
                          sure=troubles.sure(event))
            self._loop.call_soon(self._close_link, endpoint)
            return
        self._log.debug("cluster link", endpoint=endpoint,
                        link="closed" if event == zmq.EVENT_DISCONNECTED else "connected")
        if event == zmq.EVENT_DISCONNECTED:
            self.membership.disconnected(endpoint, self._loop.time())
        elif event == zmq.EVENT_CONNECTED:
            self.membership.connected(endpoint)

    def _send_raw(self, endpoint: str, frames: list[Any]) -> bool:
        dealer = self._dealer(endpoint)
        if dealer is None:
            return False
        try:
            last = len(frames) - 1
            sent = 0
            for i, frame in enumerate(frames):
                size = len(frame)
                _send(dealer, frame, _MORE_NOBLOCK if i < last else _NOBLOCK,
                      size < ZERO_COPY_MIN)
                sent += size
            self.bytes_sent += sent
        except zmq.Again:
            return False
        return True

    def _send_held(self, now: float) -> None:
        """Send what is held for peers whose links are back; a peer whose link stays down
        past HOLD_SECONDS is unreachable (as is one past the bounds: see send)."""
        for peer_id, held in list(self._held.items()):
            peer = self.membership.peers.get(peer_id)
            if peer is None:
                del self._held[peer_id]
                continue
            if held.send(functools.partial(self._send_raw, peer.endpoint)):
                del self._held[peer_id]
                self.membership.sent(peer_id, now)
            elif now - held.since >= HOLD_SECONDS:
                del self._held[peer_id]
                self._apply(self.membership.bye(peer_id, now),
                            f"unreachable (its link stayed down for "
                            f"{now - held.since:.1f} s)")

    def _writable(self, endpoint: str) -> bool:
        """True once our link to ``endpoint`` is connected (IMMEDIATE: no queue before)."""
        dealer = self._dealer(endpoint)
        return dealer is not None and bool(dealer.getsockopt(zmq.EVENTS) & zmq.POLLOUT)

    def _say_hello(self, endpoint: str, reply: bool) -> None:
        hello = self.membership.greeting(endpoint, reply)
        if self._send_raw(endpoint, [KIND_HELLO, json.dumps(hello.to_dict()).encode()]):
            contact = self.membership.contacts.get(endpoint)
            if contact is not None:
                contact.last_said = self._loop.time()

    def _on_message_frames(self, frames: list[zmq.Frame]) -> None:
        if self._router is not None:
            self._handle(frames, self._loop.time())

    def _handle(self, frames: list[zmq.Frame], now: float) -> None:
        if len(frames) < 2:
            return
        sender = frames[0].bytes.decode("ascii", "replace")
        kind = frames[1].bytes
        self.bytes_received += sum(map(len, frames))
        if kind == KIND_SVCN and len(frames) >= 4:
            if self.membership.heard(sender, now):
                numbering = self.membership.peers[sender].numbering
                problem = numbering.take(frames[2].bytes) if numbering is not None \
                    else "it numbered a message though its HELLO did not say so"
                if problem is not None:
                    self._end_life(sender, problem, now)
                    return
                self._on_message(self._lives[sender], frames[3].bytes.decode("ascii", "replace"),
                                 [f.buffer for f in frames[4:]])
        elif kind == KIND_SVC and len(frames) >= 3:
            if self.membership.heard(sender, now):
                peer = self._lives[sender]
                self._on_message(peer, frames[2].bytes.decode("ascii", "replace"),
                                 [f.buffer for f in frames[3:]])
        elif kind == KIND_PING:
            if self.membership.heard(sender, now) and len(frames) in (3, 4):
                numbering = self.membership.peers[sender].numbering
                if len(frames) == 4 and numbering is not None:
                    problem = numbering.check_count(frames[3].bytes)
                    if problem is not None:
                        self._end_life(sender, problem, now)
                        return
                self._echo(sender, frames[2].bytes, now)
        elif kind == KIND_HELLO and len(frames) == 3:
            self._hello(frames, now)
        elif kind == KIND_BYE:
            why = frames[2].bytes[:MAX_WHY].decode("utf-8", "replace") if len(frames) > 2 \
                else ""
            self._apply(self.membership.bye(sender, now),
                        f"it ended its life of us: {why}" if why else None)
        elif kind == KIND_MEMBERS and len(frames) == 3:
            self._members(sender, frames[2], now)
        else:
            self._log.warning("invalid cluster message", address=_address(frames[1]),
                              sender=_printable(sender[:40]), kind=kind[:16])

    def _end_life(self, sender: str, why: str, now: float) -> None:
        """Our life of peer ``sender`` cannot go on (its messages did not all arrive): end
        it, and tell the peer so (it ends its own; both then start afresh)."""
        peer = self.membership.peers[sender]
        self._send_raw(peer.endpoint, [KIND_BYE, why.encode()])
        self._apply(self.membership.bye(sender, now), why)

    def _ping(self, peer: Peer, payload: bytes) -> bool:
        """Send a PING to ``peer``: with the count of our messages if it numbers them (none
        while messages are held for it: they are counted, not sent yet)."""
        if peer.id in self._held:
            return False
        frames = [KIND_PING, payload]
        if peer.numbering is not None:
            frames.append(peer.numbering.count_tag())
        return self._send_raw(peer.endpoint, frames)

    def _echo(self, sender: str, payload: bytes, now: float) -> None:
        """A PING with a payload: answer the sender's "?t" with "!t"; our own "!t" come back
        is a round trip."""
        if payload[:1] == b"?":
            peer = self.membership.peers.get(sender)
            if peer is not None and self._ping(peer, b"!" + payload[1:]):
                self.membership.sent(sender, now)
        elif payload[:1] == b"!" and len(payload) == 9:
            # (time.monotonic: a loop's clock may tick in whole milliseconds, as libuv's does)
            rtt = time.monotonic() - struct.unpack("<d", payload[1:])[0]
            if 0 <= rtt < 3600:
                self.rtt.observe(rtt)
                self.last_rtt[sender] = rtt

    def _hello(self, frames: list[zmq.Frame], now: float) -> None:
        address = _address(frames[2])
        try:
            hello = Hello.from_dict(json.loads(frames[2].bytes))
        except (ValueError, RecursionError):
            hello = None
        if hello is None:
            self._log.warning("invalid HELLO", address=address, sender=frames[0].bytes[:40])
            return
        if "://*:" in hello.endpoint and address:  # it listens on all interfaces: use the
            # address it came from
            hello = dataclasses.replace(hello,
                                        endpoint=hello.endpoint.replace("*", address, 1))
        self._heard_at_seed(hello)
        own = self.membership.own_contact(hello)
        if own is not None:  # a contact that turned out to be ourselves
            self._static.discard(own)
            self._apply(self.membership.forget_contact(own))
            return
        sender = frames[0].bytes.decode("ascii", "replace")
        change = self.membership.hello(hello, now, sender)
        if change.refused:
            # where it came from identifies it; what it claims is its own choice
            self._log.warning("peer refused", address=address, claimed_name=hello.name[:64],
                              claimed_endpoint=hello.endpoint[:80], why=change.refused)
            return
        if address and self._door is not None:  # a peer's host: out of the strangers' pool
            self._door.trust(("host", address))
        if change.challenge:  # it is admitted once it answers there
            contact = self.membership.contacts.get(change.challenge)
            if contact is not None and now - contact.last_said >= CONTACT_RETRY \
                    and self._writable(change.challenge):
                self._say_hello(change.challenge, reply=False)
        if change.reply_hello_to:  # first, so that it reaches the peer before what services
            self._say_hello(change.reply_hello_to, reply=True)  # send it when it joins
        self._apply(change, address=address)

    def _members(self, sender: str, frame: zmq.Frame, now: float) -> None:
        """What a peer says of whom it knows: the members we did not know are said HELLO to."""
        address = _address(frame)
        peer = self.membership.peers.get(sender)
        if peer is None or not self.membership.heard(sender, now):
            self._log.warning("gossip refused", address=address, sender=_printable(sender[:40]),
                              why="not from a peer")
            return
        members, problem = gossip.decode(frame.buffer)
        if problem:
            self._log.warning("invalid gossip", address=address, peer=peer.label,
                              why=problem)
        change = self.membership.learn(members, sender, now)
        if change.refused:
            self._log.warning("gossip partly ignored", address=address, peer=peer.label,
                              why=change.refused)
        if change.learned:
            self._log.info("members learned", peer=peer.label, id=peer.id,
                           contacts=len(change.learned), first=change.learned[0])
            self._schedule(0.0)

    def _tell_members(self, peer: Peer, now: float) -> None:
        """Tell ``peer`` whom we have as peers (if it takes it)."""
        members = self.membership.members_for(peer.id)
        if peer.gossip and members and self._send_raw(
                peer.endpoint, [KIND_MEMBERS, gossip.encode(members)]):
            self.membership.sent(peer.id, now)

    def _apply(self, change: Change, reason: str | None = None, address: str = "") -> None:
        """Act on ``change``; ``address``: where the message that made it came from."""
        if change.dropped:
            # a flood of HELLOs gives contacts up one by one: logged by where the HELLOs come
            # from, so that the repeats are counted into one line
            refusing = {endpoint_host(r.peer) for r in self.refusals.kept.values()}
            answered = [e for e in change.dropped if endpoint_host(e) in refusing]
            why = ("its broker answered, but the handshake is refused (see zbroker status)"
                   if len(answered) == len(change.dropped) else
                   "no broker answered there in time, or more than "
                   f"{self.membership.max_pending} were waiting")
            self._log.warning("cluster contacts given up", contacts=len(change.dropped),
                              first=change.dropped[0][:80], **({"address": address} if address
                                                               else {}), why=why)
        for endpoint in change.dropped:
            self._close_link(endpoint)
        for peer, why in change.left:
            life = self._lives.pop(peer.id, None)
            self._held.pop(peer.id, None)
            self.peer_losses += 1
            self.last_rtt.pop(peer.id, None)
            self._log.warning("peer left", peer=peer.label, id=peer.id, life=peer.life,
                              endpoint=peer.endpoint, why=reason or why)
            if life is not None:
                self._on_leave(life, reason or why)
        for peer in change.joined:
            life = PeerBroker(peer.life, peer.name, peer.endpoint, member=peer.id,
                              features=peer.features, numbered=peer.numbering is not None,
                              label=peer.label)
            self._lives[peer.id] = life
            self._watch(peer.endpoint)
            if self._keys is None:  # said on every join: nothing proved who it is
                self._log.warning("peer joined", peer=peer.label, id=peer.id, life=peer.life,
                                  endpoint=peer.endpoint,
                                  insecure="no cluster key: anyone who says the cluster's "
                                           "name joins")
            else:
                self._log.info("peer joined", peer=peer.label, id=peer.id, life=peer.life,
                               endpoint=peer.endpoint)
            self._on_join(life)
            if peer.id in self._lives:  # still a peer once the services were told
                self._tell_members(peer, self._loop.time())

    # --- why hosts do not link (troubles.py) ------------------------------------------------

    def _watch_socket(self, router: zmq.Socket) -> None:
        """Keep our peer socket's connections in the process's budget (libzmq_door.py), and
        follow the handshakes it refuses (with a key or without one)."""
        events = 0
        for event in _HANDSHAKE_FAILED:
            events |= event
        self._closed_seen = self._closed_here()
        self._door.watch(router, f"inproc://zbroker.cluster.socket.{self.id}", also=events,
                         on_other=self._on_socket_event)

    def _closed_here(self) -> set[tuple[str, int]]:
        port = self.endpoint.rpartition(":")[2] if self.endpoint else ""
        return tcp_table.closed_at(int(port)) if port.isdigit() else set()

    def _on_socket_event(self, event: dict[str, Any]) -> None:
        """Our peer socket refused a handshake: which peer it was is looked up soon after
        (the event does not say; see tcp_table.py)."""
        if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH and self._guard is not None:
            return  # our ZAP handler refused it, and told us from where
        self._unattributed.append((troubles.cause(event["event"], event["value"],
                                                  self._keys is not None, troubles.OURS),
                                   troubles.sure(event["event"]), self._loop.time()))
        if self._attribute_timer is None:
            self._attribute_timer = self._loop.call_later(ATTRIBUTE_AFTER, self._attribute)

    def _attribute(self) -> None:
        """Give the refusals at our socket to the peers whose connections we closed since
        the last look, one connection each. A refusal whose connection is not in the table
        yet waits for the next look; one still not found after ATTRIBUTE_WITHIN is given to
        no one."""
        self._attribute_timer = None
        now = self._loop.time()
        closed = self._closed_here()
        hosts = collections.Counter(host for host, _ in closed - self._closed_seen)
        self._closed_seen = closed
        waiting = []
        for why, sure, when in self._unattributed:
            if not sure:  # the other side closed it first: no trace of it here, counted
                self.refusals.count(troubles.OURS)
                continue
            host = next((h for h, left in hosts.items() if left > 0), None)
            if host is not None:
                hosts[host] -= 1
                self._refused(self._peer_at(host), why, troubles.OURS)
            elif now - when < ATTRIBUTE_WITHIN:
                waiting.append((why, sure, when))
            else:
                self._refused("(address unknown)", why, troubles.OURS)
        self._unattributed = waiting
        if waiting:
            self._attribute_timer = self._loop.call_later(ATTRIBUTE_AFTER, self._attribute)

    def _heard_at_seed(self, hello: Hello) -> None:
        """A HELLO that echoes our nonce for a seed comes from the broker that answered
        there, whatever endpoint it says it has (the seed may name its host by another
        address, or by a name)."""
        if not hello.echo or self.membership is None:
            return
        for seed in self._static:
            if seed != hello.endpoint and hmac.compare_digest(hello.echo,
                                                              self.membership.nonce(seed)):
                self._seed_answered[seed] = hello.id

    def _peer_at(self, host: str) -> str:
        """A contact's endpoint on ``host``, if we have one, else the host."""
        for endpoint in self.membership.contacts if self.membership else ():
            if endpoint.partition("://")[2].rpartition(":")[0].strip("[]") == host:
                return endpoint
        return host

    def _refused(self, peer: str, why: str, side: str, times: int = 1,
                 sure: bool = True) -> None:
        first = self.refusals.note(peer, why, side, self._loop.time(), times, sure)
        if first is not None:
            self._say_refused(first)

    def _say_refused(self, r: troubles.Refusal) -> None:
        """The first line of a refusal (or the one of the cause found after a guess)."""
        event = ("cluster connection refused" if r.side == troubles.OURS
                 else "cluster link refused")
        # (a cause found after a guess was said: a line of its own name, so that the log's
        # repeat filter does not hold it back as a repeat of the guess)
        self._log.warning(f"{event}, cause found" if r.corrected else event, peer=r.peer,
                          why=r.why, fix=troubles.advice(r.why, self.key_file))

    def _diagnose(self) -> None:
        """Say what went on since: refusals that go on (counted), seeds that do not answer
        (or answer now)."""
        self._diagnose_timer = None
        if self.membership is None or self._router is None:
            return
        now, wall = self._loop.time(), time.time()
        up = {p.endpoint for p in self.membership.peers.values()}
        self.refusals.linked(up | {e.partition("://")[2].rpartition(":")[0] for e in up}, now,
                             2 * DIAGNOSE_EVERY)
        for r in self.refusals.due(now):
            if r.told_at is None:
                self._say_refused(r)
                continue
            self._log.warning("cluster connection still refused" if r.side == troubles.OURS
                              else "cluster link still refused", peer=r.peer, why=r.why,
                              times=r.times, since=_clock(wall - (now - r.since)))
        if self._seeds is not None:
            self._seeds.retain(self._static)  # (a seed that is this broker is none)
            for endpoint, what, since in self._seeds.check(up | self._answering_seeds(), now):
                fields = {"seed": endpoint, "since": _clock(wall - (now - since)),
                          "seconds": round(now - since, 1)}
                if what == troubles.Seeds.ANSWERS:
                    self._log.info("cluster seed answers", **fields)
                else:
                    refused = [r.why for r in self.refusals.current(now, REFUSAL_SHOWN)
                               if r.peer == endpoint]
                    self._log.warning(f"cluster seed {what}", **fields,
                                      why=f"refused: {refused[0]}" if refused else
                                      "no broker of this cluster answers there (is it "
                                      "running? cluster.bind and a firewall on its host?)")
        self._diagnose_timer = self._loop.call_later(DIAGNOSE_EVERY, self._diagnose)

    # --- timers ----------------------------------------------------------------------------------

    def _schedule(self, delay: float) -> None:
        at = self._loop.time() + delay
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        # (the time is kept here: a loop may return a handle without when() for a time past)
        self._timer, self._timer_at = self._loop.call_at(at, self._on_timer), at

    def _schedule_next(self) -> None:
        if self.membership is None:
            return
        at = self.membership.next_deadline()
        if self._held:
            at = min(at, self._loop.time() + HOLD_RETRY)
        if self.membership.unanswered():
            at = min(at, self._loop.time() + CONTACT_RETRY)
        if at != float("inf"):
            self._schedule(max(0.0, at - self._loop.time()))

    def _on_timer(self) -> None:
        self._timer = None
        if self.membership is None or self._router is None:
            return
        now = self._loop.time()
        self._send_held(now)
        to_ping, change = self.membership.due(now)
        if change.stalled:
            self._log.warning("broker did not run (paused, or its loop blocked): its peers' "
                              "silence meanwhile is not counted",
                              seconds=round(change.stalled, 2))
        self._apply(change)
        ping = b"?" + struct.pack("<d", time.monotonic())
        for peer in to_ping:
            if self._ping(peer, ping):
                self.membership.sent(peer.id, now)
        told = self.membership.gossip_due(now)
        if told is not None:  # whom we know, to one peer in turn
            self._tell_members(told, now)
        for contact in self.membership.unanswered():
            if now - contact.last_said < CONTACT_RETRY:
                continue
            if self._writable(contact.endpoint):
                self._say_hello(contact.endpoint, reply=False)
            elif contact.pinned and now - self._link_made.get(contact.endpoint, now) > LINK_RETRY:
                # a configured or discovered peer's link (not one a HELLO named: those are
                # given up soon, and a flood of them must not churn sockets)
                self._close_link(contact.endpoint)  # made anew at the next turn
        self._schedule_next()

    # --- security ----------------------------------------------------------------------------

    def _secure(self, sock: zmq.Socket, server: bool) -> None:
        if self._keys is None:
            return
        public, secret = self._keys
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        if server:
            sock.setsockopt(zmq.CURVE_SERVER, 1)
        else:
            sock.setsockopt(zmq.CURVE_SERVERKEY, public)


def _clock(wall: float) -> str:
    """A wall-clock time as the log's reader reads it (local time of day)."""
    return time.strftime("%H:%M:%S", time.localtime(wall))


def _printable(text: str) -> str:
    """A routing id (any bytes a stranger chose) as a log line can carry it: control and
    other unprintable characters as \\xNN escapes."""
    return text if text.isprintable() else "".join(
        c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _address(frame: zmq.Frame) -> str:
    """The network address a message came from ("" if unknown)."""
    try:
        return frame.get("Peer-Address") or ""
    except zmq.ZMQError:
        return ""


def _wildcard_host(endpoint: str) -> str:
    """tcp://0.0.0.0:5670 -> tcp://*:5670 (peers then use the address our HELLO came from)."""
    transport, _, address = endpoint.partition("://")
    host, _, port = address.rpartition(":")
    if transport == "tcp" and host in ("0.0.0.0", "*", "[::]", "::"):
        return f"tcp://*:{port}"
    return endpoint
