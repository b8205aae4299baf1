"""A queue's consumers' endpoints: the core's deliveries go out there, the ACKs come in.

    send     DEALER, bound: consumers (DEALER or ROUTER) get messages pushed, send ACKs
    credit   ROUTER, bound, optional: consumers that say READY with a window, send ACKs and
             get them confirmed (durable: ACKED, or UNKNOWN)

Both are served over the queue's own ZMTP codec (endpoints.py), as the receive
endpoint is: what a consumer sends is limited as it arrives, and a round of deliveries leaves
in one write per connection.

The send endpoint is a DEALER as in the original, so consumers need not say anything first.
Messages go to the connected consumers in turn, skipping one whose connection is full (more
than a few MiB waiting to be written to it); the queue keeps at most ``inflight_window`` x
connected consumers unACKed (counted as their handshakes finish and their connections close)
and ``inflight_size`` bytes in flight. When every connection is full, deliveries wait until
one drains.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pzq import wire
from zbroker.runtime.zmq_reader import DRAIN_BUDGET
from zbroker.services.pzq.core.actions import Confirm
from zbroker.services.pzq.core.counters import Dropped
from zbroker.services.pzq.core.queue import CONSUMERS, QueueCore

from .endpoints import RouterEndpoint, SendEndpoint, bind
from .receiver import FULL, GONE, SENT
from .settings import QueueSettings


class Consumers:
    def __init__(self, core: QueueCore, settings: QueueSettings, loop: Any,
                 flush: Callable[[], None], soon: Callable[[], None], log: Any,
                 dropped: Dropped):
        """``flush`` after what consumers sent is taken; ``soon``: flush at the next turn.
        The endpoints are bound by :meth:`start`."""
        s = settings
        self.settings = s
        self.core, self.loop, self.log, self.name = core, loop, log, s.name
        self.flush, self.soon, self.dropped = flush, soon, dropped
        self._blocked = False  # every send endpoint's connection was full
        self._credit_blocked: set[bytes] = set()  # credit consumers whose connection was full
        self._taking = False
        self.send = SendEndpoint(loop, self._arrived, soon, self._connected, log=log,
                                 name=s.name)
        self.credit: RouterEndpoint | None = None
        if s.credit_endpoint and s.mode != "stream":
            self.credit = RouterEndpoint(loop, self._arrived, soon, log=log, name=s.name,
                                         on_gone=self._credit_gone)

    @property
    def connected(self) -> int:
        """Consumers connected to the send endpoint."""
        return self.send.connected

    async def start(self) -> None:
        """Bind the endpoints (QueueError if one cannot be)."""
        s = self.settings
        await bind(self.send, s.send_endpoint, "send", s.name)
        if self.credit is not None:
            await bind(self.credit, s.credit_endpoint, "credit", s.name)

    def close(self) -> None:
        self.send.close()
        if self.credit is not None:
            self.credit.close()

    def counters(self) -> dict[str, int]:
        """Malformed or oversized messages are the core's ``malformed``; connections hung
        up on for breaking the protocol are counted here."""
        hung = self.send.hung_up + (self.credit.hung_up if self.credit is not None else 0)
        return {"consumers_hung_up": hung}

    def _connected(self, n: int) -> None:
        """A consumer connected to the send endpoint or left: the queue's window follows."""
        self.core.consumers_changed(n)
        self.log.debug("pzq consumers", queue=self.name, connected=n)
        self.soon()

    def _credit_gone(self, cid: bytes) -> None:
        """A credit consumer's connection closed: what it held is ready again at once (its
        ACKs can only come on a new connection, which is honoured all the same)."""
        if cid in self.core.dispatcher.consumers:
            n = self.core.consumer_gone(cid)
            self.log.debug("pzq credit consumer gone", queue=self.name, requeued=n)
            self.soon()

    def _arrived(self) -> None:
        if not self._taking:
            self._taking = True
            self.loop.call_soon(self._take)

    def _take(self) -> None:
        """Carry out what consumers sent, then flush (deliveries and confirmations)."""
        self._taking = False
        core = self.core
        for _, frames, refused in self.send.take(DRAIN_BUDGET):
            if refused is None:
                core.consumer_ack(frames)
            else:
                core.counters["malformed"] += 1
        more = bool(self.send.inbox)
        if self.credit is not None:
            for cid, frames, refused in self.credit.take(DRAIN_BUDGET):
                if refused is None:
                    self._on_credit(cid, frames)
                else:
                    core.counters["malformed"] += 1
            more = more or bool(self.credit.inbox)
        self.flush()
        if more:
            self._arrived()

    def _on_credit(self, cid: bytes, body: list[bytes]) -> None:
        """The credit endpoint: READY (a consumer's window) and ACKs."""
        if not body:
            return
        core = self.core
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
            # what consumers cause: a budget of lines (zbroker/logs/budget.py)
            self.log.warning("pzq too many credit consumers: READY ignored",
                             budget=f"lines:ready ignored queue={self.name}", queue=self.name)

    def confirm(self, confirmations: list[Confirm]) -> None:
        """[key][ACKED|UNKNOWN] to credit consumers (one that is gone or full: dropped, it
        learns nothing and may ACK again, which is answered UNKNOWN)."""
        credit = self.credit
        if credit is None:
            return
        for c in confirmations:
            if credit.send(c.consumer, [c.key, c.status]) is not SENT:
                self.dropped.confirmations += 1
        # not flushed here: the caller delivers (or flushes) next, so that a consumer's
        # confirmations and its next batch leave in one write

    def write_out(self) -> None:
        """Write what was sent to the consumers' connections."""
        self.send.flush()
        if self.credit is not None:
            self.credit.flush()

    def deliver(self) -> None:
        """Send what the core has ready for the consumers, as far as their connections take,
        and flush."""
        core, send, credit = self.core, self.send, self.credit
        dispatcher = core.dispatcher
        if self._blocked:
            self._blocked = False
            dispatcher.pause(CONSUMERS, False)
        for cid in self._credit_blocked:
            dispatcher.pause(cid, False)
        self._credit_blocked.clear()
        now, now_us = self.loop.time(), time.time_ns() // 1000
        nxt = core.next_delivery(now, now_us)
        while nxt is not None:
            d, frames = nxt
            if d.consumer == CONSUMERS:
                if not send.send_any(frames):
                    # every consumer's connection is full (or none is there): credit
                    # consumers may still take it; tried again when one drains
                    core.unsent(d)
                    dispatcher.pause(CONSUMERS)
                    self._blocked = True
            else:
                status = credit.send(d.consumer, frames)
                if status is FULL:  # tried again when its connection drains
                    core.unsent(d)
                    dispatcher.pause(d.consumer)
                    self._credit_blocked.add(d.consumer)
                elif status is GONE:  # what it held is ready again
                    core.unsent(d)
                    n = core.consumer_gone(d.consumer)
                    self.log.debug("pzq credit consumer gone", queue=self.name, requeued=n)
            nxt = core.next_delivery(now, now_us)
        self.write_out()  # with any confirmations sent before

