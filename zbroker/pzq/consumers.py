"""A queue's consumers' sockets: the core's deliveries go out there, the ACKs come in.

    send     DEALER, bound: consumers (DEALER or ROUTER) get messages pushed, send ACKs
    credit   ROUTER, bound, optional: consumers that say READY with a window, send ACKs and
             get them confirmed (durable: ACKED, or UNKNOWN)

The send socket is a DEALER as in the original, so consumers need not say anything first.
libzmq spreads messages over the connected consumers and skips one whose connection is full;
each connection holds at most ``inflight_window`` unsent messages (SNDHWM), and the queue keeps
at most ``inflight_window`` x connected consumers unACKed (counted from the socket's connect and
disconnect events) and ``inflight_size`` bytes in flight. When every connection is full, the
send socket is tried again once it is writable: its reader's drain (its FD fires) flushes the
queue, or it is writable already when a round of deliveries ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from . import wire
from .actions import Confirm
from .counters import Dropped
from .queue import CONSUMERS, QueueCore
from .settings import QueueSettings
from .sockets import MORE_NOBLOCK, NOBLOCK, Sockets, send, send_frames


class Consumers:
    def __init__(self, core: QueueCore, settings: QueueSettings, sockets: Sockets,
                 flush: Callable[[], None], soon: Callable[[], None], log: Any,
                 dropped: Dropped):
        """``flush`` after each drain of their sockets; ``soon``: flush at the next turn."""
        s = settings
        self.core, self.loop, self.log, self.name = core, sockets.loop, log, s.name
        self.soon, self.dropped = soon, dropped
        self.connected = 0  # to the send socket
        self._blocked = False  # every send socket's connection was full
        self._credit_blocked: set[bytes] = set()  # credit consumers whose connection was full
        self.sock = sockets.bind(zmq.DEALER, s.send_endpoint, "send", hwm=s.inflight_window)
        self._reader = sockets.read(self.sock, core.consumer_ack, flush)
        events = sockets.monitor(self.sock, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        sockets.read(events, self._on_event, flush)
        self.credit = self._credit_reader = None
        if s.credit_endpoint and s.mode != "stream":
            self.credit = sockets.bind(zmq.ROUTER, s.credit_endpoint, "credit")
            self.credit.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone consumer: an error
            self.credit.setsockopt(zmq.SNDHWM, wire.MAX_WINDOW)
            self._credit_reader = sockets.read(self.credit, self._on_credit, flush)

    def _on_event(self, msg: list[bytes]) -> None:
        """A consumer connected to the send socket or left: the queue's window follows."""
        event = parse_monitor_message(msg)["event"]
        if event == zmq.EVENT_ACCEPTED:
            self.connected += 1
        elif event == zmq.EVENT_DISCONNECTED:
            self.connected = max(0, self.connected - 1)
        else:
            return
        self.core.consumers_changed(self.connected)
        self.log.debug("pzq consumers", queue=self.name, connected=self.connected)

    def _on_credit(self, frames: list[bytes]) -> None:
        """The credit endpoint: READY (a consumer's window) and ACKs."""
        if len(frames) < 2:
            return
        core, cid, body = self.core, frames[0], frames[1:]
        if len(body) == 3:
            acks = wire.decode_ack_batch(body)
            if acks is not None:
                if isinstance(acks, wire.WireError):
                    core.counters["malformed"] += 1
                else:
                    core.consumer_acks(acks[1], cid, acks[0])
                return
            ready = wire.decode_ready_batch(body)
        else:
            ready = wire.decode_ready(body)
        if ready is None:
            core.consumer_ack(body, confirm_to=cid)
        elif isinstance(ready, wire.WireError):
            core.counters["malformed"] += 1
        elif not (core.credit_consumer(cid, ready) if type(ready) is int
                  else core.credit_consumer(cid, *ready)):
            self.log.warning("pzq too many credit consumers: READY ignored", queue=self.name)

    def confirm(self, confirmations: list[Confirm]) -> None:
        """[key][ACKED|UNKNOWN] to credit consumers (one that is gone or full: dropped, it
        learns nothing and may ACK again, which is answered UNKNOWN)."""
        sock = self.credit
        if sock is None:
            return
        for c in confirmations:
            try:
                send(sock, c.consumer, MORE_NOBLOCK, True)
                send(sock, c.key, MORE_NOBLOCK, True)
                send(sock, c.status, NOBLOCK, True)
            except zmq.ZMQError:
                self.dropped.confirmations += 1
        self._credit_reader.recheck()

    def deliver(self) -> None:
        """Send what the core has ready for the consumers, as far as their connections take."""
        core, sock, credit = self.core, self.sock, self.credit
        dispatcher = core.dispatcher
        if self._blocked:
            self._blocked = False
            dispatcher.pause(CONSUMERS, False)
        for cid in self._credit_blocked:
            dispatcher.pause(cid, False)
        self._credit_blocked.clear()
        now, now_us = self.loop.time(), time.time_ns() // 1000
        if (nxt := core.next_delivery(now, now_us)) is None:
            return
        while nxt is not None:
            d, frames = nxt
            if d.consumer == CONSUMERS:
                try:
                    send_frames(sock, frames)
                except zmq.Again:
                    # every legacy consumer's connection is full (or none is there): the
                    # others may still take it; tried again when the socket is writable
                    core.unsent(d)
                    dispatcher.pause(CONSUMERS)
                    self._blocked = True
            else:
                try:
                    send(credit, d.consumer, MORE_NOBLOCK, True)
                    send_frames(credit, frames)
                except zmq.Again:  # its connection is full: tried again at the next flush
                    core.unsent(d)
                    dispatcher.pause(d.consumer)
                    self._credit_blocked.add(d.consumer)
                except zmq.ZMQError:  # EHOSTUNREACH: it has gone; what it held is ready again
                    core.unsent(d)
                    n = core.consumer_gone(d.consumer)
                    self.log.debug("pzq credit consumer gone", queue=self.name, requeued=n)
            nxt = core.next_delivery(now, now_us)
        # sending may have taken the edge of what came meanwhile, or of the socket's
        # becoming writable again
        self._reader.recheck()
        if self._credit_reader is not None:
            self._credit_reader.recheck()
        if self._blocked and sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
            self.soon()
