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

What a message means, the heartbeats, what is held for a peer and why hosts do not link are the
core's (core/node.py, no I/O): this module is the libzmq layer around it. It owns the sockets,
their monitors, the timers and the clocks, gives the core what happens, and carries out the
actions the core returns, in order.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from zbroker.runtime.limits import CLUSTER_CONNECTIONS, CLUSTER_PER_SOURCE
from zbroker.runtime.port_holder import held
from zbroker.runtime.zmq_reader import SocketReader
from zbroker.service import PeerBroker
from zbroker.zmtp.admission import Admission, ConnectionBudget
from zbroker.zmtp.libzmq_door import UNTRUSTED_LIMIT, LibzmqDoor
from zbroker.zmtp.refusals import Refusals

from . import handshake, tcp_table, troubles
from .core.actions import (
    NOT_REPORTED,
    Action,
    Clock,
    Connect,
    Deliver,
    Disconnect,
    Joined,
    Left,
    Log,
    LookUpClosed,
    Send,
    SendHeld,
    Then,
    Trust,
    Wake,
    Watch,
)
from .core.diagnosis import DIAGNOSE_EVERY
from .core.node import Counters, NodeCore
from .core.protocol import wildcard_host
from .membership import Hello
from .security import Guard, KeyFileError, cluster_keys

SEND_HWM = 100_000  # messages queued to one peer before it counts as unreachable
#: what our link to a peer may take in: the peer answers on its own link to us, never on
#: ours, so nothing but the handshake's and the heartbeat's small commands comes this way,
#: and what any listener a HELLO named sends us there is never read: kept to one small message
LINK_INBOUND_MAX = 1 << 16
MIN_MESSAGE_LIMIT = 64 << 20  # the least a peer's message may be (MAXMSGSIZE)
ZERO_COPY_MIN = 1 << 16
# pyzmq's backend socket methods with int flags: several times cheaper per frame than the
# convenience layer, which converts flag enums and checks arguments on every call
_send = zmq.backend.Socket.send
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_LINK_EVENTS = functools.reduce(int.__or__, handshake.HANDSHAKE_FAILED,
                                int(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED))


class ClusterError(Exception):
    pass


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
                 on_leave: Callable[[PeerBroker, str, bool], None],
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
        self._core: NodeCore | None = None
        self._router: zmq.Socket | None = None
        self._reader: SocketReader | None = None
        self._dealers: dict[str, zmq.Socket] = {}  # endpoint -> DEALER
        self._monitors: dict[str, SocketReader] = {}  # endpoint -> its DEALER's events
        self._monitor_ids = itertools.count()
        self._static: tuple[str, ...] = (*config.peers, *seeds)  # and a join token's seeds
        self._timer: asyncio.Handle | None = None
        self._timer_at = float("inf")
        self._deferred: asyncio.Handle | None = None
        self.discovery: Any = None
        self.endpoint = ""
        self.advertised = ""
        self._keys: tuple[bytes, bytes] | None = None  # CURVE (public, secret)
        self.key_file: str | None = None
        self._guard: Any = None
        # for metrics (read at scrape time): service traffic, losses, heartbeat round trips
        self.counters = Counters()
        # why hosts do not link (troubles.py): refusals by peer and cause
        self.refusals = troubles.Refusals()
        #: our peer socket's connections, in the process's budget; and its failed handshakes
        self._door: LibzmqDoor | None = None
        self._diagnose_timer: asyncio.TimerHandle | None = None
        self._attribute_timer: asyncio.TimerHandle | None = None

    @property
    def core(self) -> NodeCore | None:
        """What this node knows and decides (None until it started)."""
        return self._core

    last_rtt = property(lambda self: self.counters.last_rtt)  # (what services read)

    # --- life cycle ----------------------------------------------------------------------------

    async def start(self, keys: Any = None, bind_wait: float = 0.0) -> None:
        """Start: load the cluster key (or take ``keys``, what security.cluster_keys gave),
        bind the peer socket (waiting up to ``bind_wait`` seconds for its port to be free),
        say HELLO to the seeds, start discovery. ClusterError if it cannot."""
        cfg = self.config
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
            self._guard.on_refused = self._not_our_key
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
                raise ClusterError(f"cannot bind the cluster socket (cluster.bind) to "
                                   f"{cfg.bind}: {os.strerror(exc.errno)}{held(cfg.bind)}"
                                   ) from None
        self._router = router
        self._watch_socket(router)
        self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        advertised = cfg.advertise or wildcard_host(self.endpoint)
        self.advertised = advertised
        me = Hello(self.id, self.broker_name, cfg.name, advertised, features=self.features,
                   host=socket.gethostname()[:64])
        now = self._loop.time()
        self._core = NodeCore(me, cfg.peer_timeout, now, seeds=self._static,
                              bound=self.endpoint, keyed=self._keys is not None,
                              key_file=self.key_file, counters=self.counters,
                              address_of=_address,
                              refusals=self.refusals)
        self._reader = SocketReader(self._loop, router, self._on_message_frames,
                                    after=self._schedule_next, copy=False)
        self._run(self._core.start(now))
        if cfg.discovery:
            from .discovery import Discovery

            self.discovery = Discovery(self, self._log)
            await self.discovery.start()
        self._log.info("cluster started", cluster=cfg.name, id=self.id, endpoint=self.endpoint,
                       advertised=advertised, discovery=cfg.discovery, curve=bool(self._keys),
                       static_peers=len(set(self._static)), peer_timeout=cfg.peer_timeout)
        self._reader.start()
        self._diagnose_timer = self._loop.call_later(DIAGNOSE_EVERY, self._diagnose)

    async def stop(self, why: str | None = None) -> None:
        """Stop: say BYE to every peer and close every socket. With ``why`` (the broker goes
        on: a new node takes this one's place), the BYEs say it and every peer's life ends
        here too, the services told as of a loss."""
        for handle in (self._timer, self._diagnose_timer, self._attribute_timer):
            if handle is not None:
                handle.cancel()
        self._timer = self._diagnose_timer = self._attribute_timer = None
        if self._door is not None:
            self._door.stop()
            self._door = None
        if self.discovery is not None:
            await self.discovery.stop()
        if self._core is not None:
            self._run(self._core.stop(why, self._loop.time()))
            # what a service's send ended (a life, told on the next turn) is told now: the
            # services would keep that life for ever, the core no longer has it to end
            if self._deferred is not None:
                self._deferred.cancel()
            self._run_deferred()
        if self._timer is not None:  # (a Wake among them, or one asked for meanwhile)
            self._timer.cancel()
            self._timer = None
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
        in order, for a numbered peer (see core/held.py); a peer of before is declared lost at
        once: nothing is dropped silently."""
        core = self._core
        if core is None:
            return False
        now = self._loop.time()
        got = core.send(life, service, frames, now)
        if got.__class__ is Send:
            return self._send_service(core, got, now)  # type: ignore[arg-type]
        if got is True or got is False:
            if core.deferred:
                self._defer()
            return got
        *first, send = got  # type: ignore[misc]
        self._run(first)  # (the link, made first)
        return self._send_service(core, send, now)

    def _send_service(self, core: NodeCore, send: Send, now: float) -> bool:
        taken = core.service_sent(send, self._send_raw(send.endpoint, send.frames), now)
        if core.deferred:
            self._defer()
        return taken

    def set_max_message(self, max_message: int) -> None:
        """The largest message a peer may send (see message_limit), from now on: for links
        that peers make from now on (libzmq gives each connection the limit it had then)."""
        self.max_message = max_message
        if self._router is not None:
            self._router.setsockopt(zmq.MAXMSGSIZE, max_message)

    def peers(self) -> list[dict[str, Any]]:
        return self._core.peers(self._loop.time()) if self._core is not None else []

    def metrics(self) -> dict[str, Any]:
        """Counters for metrics, as plain data."""
        now = self._loop.time()
        peers = self._core.membership.peers.values() if self._core is not None else []
        c = self.counters
        return {"peers": len(peers),
                "peer_list": [{"label": p.label, "endpoint": p.endpoint,
                               "last_heard_s": round(now - p.last_heard, 3)} for p in peers],
                "peer_losses": c.peer_losses, "bytes_sent": c.bytes_sent,
                "bytes_received": c.bytes_received, "rtt": c.rtt.snapshot(),
                "refused": dict(self.refusals.total),
                "not_answering": self.pending_contacts()}

    def add_contact(self, endpoint: str, pinned: bool = True) -> None:
        """An endpoint where a peer may listen: said HELLO to for good (static list,
        discovery), or unpinned (a peer of the node before this one) until given up."""
        if self._core is not None:
            self._run(self._core.add_contact(endpoint, pinned, self._loop.time()))

    def keys(self) -> tuple[bytes, bytes] | None:
        """The cluster's CURVE key pair (public, secret) this node runs with; None: none."""
        return self._keys

    def carry_counters(self, before: ClusterNode) -> None:
        """Go on counting from the node this one takes the place of (a new cluster key)."""
        c, b = self.counters, before.counters
        c.bytes_sent, c.bytes_received = b.bytes_sent, b.bytes_received
        c.peer_losses, c.rtt = b.peer_losses, b.rtt

    def security(self) -> dict[str, Any]:
        """For the status: the key file (none: insecure) and the handshakes refused (ours
        and theirs)."""
        return {"key_file": self.key_file, "insecure": self._keys is None,
                "refused": sum(self.refusals.total.values()),
                "port": self._door.status() if self._door is not None else None}

    def pending_contacts(self) -> int:
        """Contacts no peer answers at (for the status)."""
        return len(self._core.diagnosis.unanswered()) if self._core is not None else 0

    def diagnosis(self) -> dict[str, Any]:
        """For the status: each contact not answering and each peer refused, since when
        (wall clock, seconds since the epoch) and for how long."""
        if self._core is None:
            return {"not_answering": [], "refusals": []}
        return self._core.diagnosis.status(self._loop.time(), time.time())

    def hint(self) -> str:
        """A line for a client whose wait timed out, when links to other brokers are what
        may be missing: no peers, or peers refused ("" when nothing is wrong here)."""
        return self._core.diagnosis.hint(self._loop.time()) if self._core is not None else ""

    # --- carrying out the core's actions -------------------------------------------------------

    def _run(self, actions: list[Action]) -> None:
        do = self._actions
        for action in actions:
            do[action.__class__](self, action)

    def _do_send(self, action: Send) -> None:
        core = self._core
        assert core is not None
        dealer = self._dealer(action.endpoint)
        # (IMMEDIATE: writable once connected)
        linked = dealer is not None and (not action.if_writable or bool(
            dealer.getsockopt(zmq.EVENTS) & zmq.POLLOUT))
        ok = linked and self._send_raw(action.endpoint, action.frames)
        if action.report != NOT_REPORTED:
            self._run(core.sent(action, ok, self._loop.time(), linked))

    def _do_send_held(self, action: SendHeld) -> None:
        assert self._core is not None
        done = action.held.send(functools.partial(self._send_raw, action.endpoint))
        self._run(self._core.held_sent(action.peer, done, self._loop.time()))

    def _do_deliver(self, action: Deliver) -> None:
        self._on_message(action.life, action.service, action.frames)

    def _do_log(self, action: Log) -> None:
        fields = {k: self._written(v) if v.__class__ in (Clock, Then) else v
                  for k, v in action.fields.items()}
        getattr(self._log, action.level)(action.event, **fields)

    def _written(self, when: float) -> str:
        """A Clock or a Then field as the log's reader reads it (local time of day)."""
        if when.__class__ is Then:
            when = time.time() - (self._loop.time() - when)
        return _clock(when)

    def _do_connect(self, action: Connect) -> None:
        """Make our link to an endpoint (and follow it: ``watch``)."""
        if self._dealer(action.endpoint) is not None and action.watch:
            self._watch(action.endpoint)

    def _do_disconnect(self, action: Disconnect) -> None:
        self._close_link(action.endpoint, action.linger, action.soon)

    def _do_trust(self, action: Trust) -> None:
        if self._door is not None:  # a peer's host: out of the strangers' pool
            self._door.trust(("host", action.address))

    def _do_look_up_closed(self, action: LookUpClosed) -> None:
        if self._attribute_timer is None:
            self._attribute_timer = self._loop.call_later(action.after, self._attribute)

    _actions: dict[type, Callable[[ClusterNode, Any], None]] = {
        Send: _do_send,
        SendHeld: _do_send_held,
        Deliver: _do_deliver,
        Log: _do_log,
        Connect: _do_connect,
        Disconnect: _do_disconnect,
        Joined: lambda self, action: self._on_join(action.life),
        Left: lambda self, action: self._on_leave(action.life, action.why, action.alive),
        Watch: lambda self, action: self._watch(action.endpoint),
        Trust: _do_trust,
        Wake: lambda self, action: self._schedule(action.at - self._loop.time()),
        LookUpClosed: _do_look_up_closed,
    }

    def _defer(self) -> None:
        """What a service's send took (core.deferred), on the next turn of the loop."""
        if self._deferred is None:
            self._deferred = self._loop.call_soon(self._run_deferred)

    def _run_deferred(self) -> None:
        self._deferred = None
        if self._core is not None:
            actions, self._core.deferred = self._core.deferred, []
            self._run(actions)

    # --- links -----------------------------------------------------------------------------------

    def _dealer(self, endpoint: str) -> zmq.Socket | None:
        """Our link to ``endpoint``, made on first use; None if it cannot be made."""
        dealer = self._dealers.get(endpoint)
        if dealer is None:
            dealer = self._ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.ROUTING_ID, self.id.encode())
            dealer.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a peer we cannot reach
            dealer.setsockopt(zmq.SNDHWM, SEND_HWM)
            dealer.setsockopt(zmq.RCVHWM, 1)
            dealer.setsockopt(zmq.MAXMSGSIZE, LINK_INBOUND_MAX)
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
                core = self._core
                if core is not None and endpoint in core.links:  # (told once: it gives up)
                    self._run(core.connect_failed(endpoint, str(exc), self._loop.time()))
                return None
            self._dealers[endpoint] = dealer
        return dealer

    def _watch(self, endpoint: str) -> None:
        """Follow our link to a peer: its connection closing makes the peer suspect; a failed
        handshake closes it, to be made anew when next used."""
        dealer = self._dealers.get(endpoint)
        if dealer is None or endpoint in self._monitors:
            return
        monitor = dealer.get_monitor_socket(_LINK_EVENTS,
                                            addr=f"inproc://zbroker.cluster.link."
                                                 f"{self.id}.{next(self._monitor_ids)}")
        reader = SocketReader(self._loop, monitor,
                              functools.partial(self._on_link_event, endpoint),
                              after=self._schedule_next)
        self._monitors[endpoint] = reader
        reader.start()

    def _close_link(self, endpoint: str, linger: int = 0, soon: bool = False) -> None:
        """Close everything our link to ``endpoint`` opened: its DEALER, its monitor and the
        monitor's reader; ``soon``: on the next turn of the loop (from inside the monitor's
        own reader), though the link is gone at once (the next one is made anew)."""
        reader = self._monitors.pop(endpoint, None)
        dealer = self._dealers.pop(endpoint, None)
        if soon:
            self._loop.call_soon(_close_sockets, reader, dealer, linger)
        else:
            _close_sockets(reader, dealer, linger)

    def _on_link_event(self, endpoint: str, frames: list[bytes]) -> None:
        """Our link to ``endpoint`` connected, closed, or failed its handshake."""
        if self._core is None:
            return
        message = parse_monitor_message(frames)
        event, now = message["event"], self._loop.time()
        if event in handshake.HANDSHAKE_FAILED:
            why = handshake.cause(event, message["value"], self._keys is not None,
                                  troubles.THEIRS)
            self._run(self._core.link_refused(endpoint, why, handshake.sure(event), now))
        elif event in (zmq.EVENT_CONNECTED, zmq.EVENT_DISCONNECTED):
            self._run(self._core.link_event(endpoint, event == zmq.EVENT_CONNECTED, now))

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
            self.counters.bytes_sent += sent
        except zmq.Again:
            return False
        return True

    def _on_message_frames(self, frames: list[zmq.Frame]) -> None:
        if self._router is not None and self._core is not None:
            self._run(self._core.received(frames, self._loop.time(), time.monotonic()))

    # --- why hosts do not link (troubles.py) ------------------------------------------------

    def _watch_socket(self, router: zmq.Socket) -> None:
        """Keep our peer socket's connections in the process's budget (libzmq_door.py), and
        follow the handshakes it refuses (with a key or without one)."""
        events = functools.reduce(int.__or__, handshake.HANDSHAKE_FAILED, 0)
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
        if self._core is None:
            return
        why = handshake.cause(event["event"], event["value"], self._keys is not None,
                              troubles.OURS)
        self._run(self._core.diagnosis.socket_refused(why, handshake.sure(event["event"]),
                                                      self._loop.time()))

    def _not_our_key(self, address: str) -> None:
        """Our ZAP handler refused a connection from ``address``: not the cluster key."""
        if self._core is not None:
            self._run(self._core.diagnosis.refused(address, troubles.NOT_OUR_KEY,
                                                   troubles.OURS, self._loop.time()))

    def _attribute(self) -> None:
        self._attribute_timer = None
        if self._core is not None:
            self._run(self._core.diagnosis.attribute(self._closed_here(), self._loop.time()))

    def _diagnose(self) -> None:
        """Say what went on since: refusals that go on (counted), seeds that do not answer
        (or answer now)."""
        self._diagnose_timer = None
        if self._core is None or self._router is None:
            return
        self._run(self._core.diagnosis.diagnose(self._loop.time(), time.time()))
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
        if self._core is None:
            return
        now = self._loop.time()
        at = self._core.next_wake(now)
        if at != float("inf"):
            self._schedule(max(0.0, at - now))

    def _on_timer(self) -> None:
        self._timer = None
        core = self._core
        if core is None or self._router is None:
            return
        now = self._loop.time()
        self._run(core.flush_held(now))
        self._run(core.tick(now, time.monotonic()))
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


def _close_sockets(reader: SocketReader | None, dealer: zmq.Socket | None, linger: int) -> None:
    """Close a link's DEALER (``linger``: ms to let what was sent go), its monitor and the
    monitor's reader."""
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


def _clock(wall: float) -> str:
    """A wall-clock time as the log's reader reads it (local time of day)."""
    return time.strftime("%H:%M:%S", time.localtime(wall))


def _address(frame: zmq.Frame) -> str:
    """The network address a message came from ("" if unknown)."""
    try:
        return frame.get("Peer-Address") or ""
    except zmq.ZMQError:
        return ""
