"""One pzq queue on its sockets: the I/O around QueueCore, on an asyncio loop.

    receive  ROUTER, bound: producers (DEALER) send messages, get ACKs; read by receiver.py,
             which can refuse a message before all of it has arrived (libzmq cannot)
    send     DEALER, bound: consumers (DEALER or ROUTER) get messages pushed, send ACKs
    monitor  ROUTER, bound: MONITOR requests (REQ)
    stream   ROUTER, bound, stream queues only: HEAD / RANGE / COMMIT requests (stream.py)

The send socket is a DEALER as in the original, so consumers need not say anything first.
libzmq spreads messages over the connected consumers and skips one whose connection is full;
each connection holds at most ``inflight_window`` unsent messages (SNDHWM), and the queue keeps
at most ``inflight_window`` x connected consumers unACKed (counted from the socket's connect and
disconnect events) and ``inflight_size`` bytes in flight.

Each readiness event drains a socket with non-blocking receives (up to a budget); the sockets'
FDs are edge-triggered, so every handler looks again at the socket's events before it returns.
The disk is the store's writer thread's; its reports come back through call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from zbroker.config import PzqQueueConfig

from . import wire
from .actions import Ack, Adopted, Append, BatchResult, Confirm, Move, Replicate, Reply, Unreplicate
from .placement import Placement
from .queue import CONSUMERS, Budget, Limits, QueueCore
from .receiver import FULL, EndpointError, Receiver
from .replication import (
    CLUSTER_COPY,
    CLUSTER_DELETE,
    CLUSTER_PEER,
    CONFIRM,
    NOT_CONFIGURED,
    RELEASE,
    REPLICA_ACK_HEADER,
    REPLICA_HEADER,
    TAKEN,
    ReplicaHolder,
    classify,
    copy_batches,
    copy_frames,
    delete_frames,
    is_node,
    key_batches,
    load_node_id,
    not_accepted,
    parse_copies,
    ping_frames,
)
from .store import Store
from .stream import StreamCore, load_committed, save_committed

DRAIN_BUDGET = 1000
STREAM_BUDGET = 100  # stream requests served per wake-up (a RANGE answer can be large)
MODES = ("push", "stream")
# The socket methods of pyzmq's backend, called with int flags: 3-4x cheaper per frame than
# the convenience layer's (which converts flag enums and checks arguments on every call).
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
ZERO_COPY_MIN = 1 << 16
#: frames up to max_message_size + this get an answer on the sockets libzmq reads; larger
#: ones are dropped with their connection
MAXMSG_SLACK = 1 << 20
STOP_TIMEOUT = 5.0
REPLY_HWM = 100_000  # messages queued to a static peer queue
MAX_HELD_REPLIES = 100_000  # ACKs held back for producers whose connection is full
#: what a producer's message may carry besides its body (id, headers, FRAME_COST a frame) on
#: top of the frames' own FRAME_COST: past max_message_size + this, the rest is discarded
ENVELOPE_ALLOWANCE = 64 << 10
REFUSAL_LOG_INTERVAL = 60.0  # seconds between two log lines about refused replica traffic


def send_frames(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Send a multipart message without blocking (zmq.Again if it cannot go now)."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        if i < last:
            _send(sock, f, _MORE_NOBLOCK, True)
        else:
            _send(sock, f, _NOBLOCK, len(f) < ZERO_COPY_MIN)


def recv_frames(sock: zmq.Socket) -> list[bytes]:
    """Receive a multipart message without blocking (zmq.Again if there is none). A Frame's
    ``more`` is cheaper than asking the socket for RCVMORE after each part."""
    frame = _recv(sock, _NOBLOCK, False)
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(sock, 0, False)
        # a big body stays in ZeroMQ's buffer (no copy): held, written, delivered from there
        frames.append(frame.buffer if len(frame) >= ZERO_COPY_MIN else frame.bytes)
    return frames


def receive_some(sock: zmq.Socket, budget: int = DRAIN_BUDGET) -> tuple[list[list[bytes]], bool]:
    """Up to ``budget`` waiting messages, without blocking, and whether more may wait (the
    budget was used up: look again soon, the socket's FD will not say so)."""
    messages = []
    for _ in range(budget):
        try:
            messages.append(recv_frames(sock))
        except zmq.Again:
            return messages, False
    return messages, True


class QueueError(Exception):
    """The queue cannot start; the message is for the operator."""


@dataclass(frozen=True)
class QueueSettings:
    """What one queue runs with (resolved: paths and endpoints are final)."""

    name: str
    receive_endpoint: str
    send_endpoint: str
    monitor_endpoint: str | None
    data_dir: Path
    sync: str = PzqQueueConfig.sync
    sync_window: float = PzqQueueConfig.sync_window
    sync_max_bytes: int = PzqQueueConfig.sync_max_bytes  # one fdatasync covers at most this
    segment_size: int = PzqQueueConfig.segment_size
    ack_timeout: float = PzqQueueConfig.ack_timeout
    reaper_frequency: float = PzqQueueConfig.reaper_frequency
    inflight_window: int = PzqQueueConfig.inflight_window
    inflight_size: int = PzqQueueConfig.inflight_size
    max_message_size: int = PzqQueueConfig.max_message_size
    max_backlog: int = PzqQueueConfig.max_backlog
    idempotence_window: int = PzqQueueConfig.idempotence_window
    idempotence_bytes: int = PzqQueueConfig.idempotence_bytes
    max_frames: int = PzqQueueConfig.max_frames
    replicas: int = PzqQueueConfig.replicas
    replication_timeout: float = PzqQueueConfig.replication_timeout
    #: receive endpoints of the peer queues copies go to
    peers: tuple[str, ...] = PzqQueueConfig.peers
    # (none, with replicas and a cluster: copies go to peers of the cluster, see placement.py)
    #: silence after which a peer's copies are taken over
    node_timeout: float = PzqQueueConfig.node_timeout
    mode: str = PzqQueueConfig.mode  # push: to consumers, ACKed one by one; stream: RANGE / COMMIT
    stream_endpoint: str = PzqQueueConfig.stream_endpoint  # stream requests (stream mode only)
    #: consumers that say READY with a window (ROUTER)
    credit_endpoint: str | None = PzqQueueConfig.credit_endpoint
    #: node ids whose copies this queue holds (static peers); none: REPLICA traffic refused
    replica_sources: tuple[str, ...] = PzqQueueConfig.replica_sources
    max_replica_origins: int = PzqQueueConfig.max_replica_origins

    def limits(self) -> Limits:
        return Limits(ack_timeout=self.ack_timeout, max_message_size=self.max_message_size,
                      max_backlog=self.max_backlog, idempotence_window=self.idempotence_window,
                      idempotence_bytes=self.idempotence_bytes, max_frames=self.max_frames,
                      inflight_window=self.inflight_window, inflight_size=self.inflight_size,
                      replicas=self.replicas, replication_timeout=self.replication_timeout)


class QueueServer:
    def __init__(self, settings: QueueSettings, zmq_context: zmq.Context,
                 loop: asyncio.AbstractEventLoop, log: Any, cluster: Any = None,
                 rejoin_grace: float = 0.0):
        """``cluster``: the broker's ClusterPort of the pzq service, if it is in a cluster;
        a queue with ``replicas`` and no static ``peers`` then replicates through it, and
        holds the messages it recovers at start for ``rejoin_grace`` seconds: long enough
        for the peers that took them over while it was gone to say so (TAKEN)."""
        self.settings = settings
        self.ctx = zmq_context
        self.loop = loop
        self.log = log
        self.store = Store(settings.data_dir, sync=settings.sync,
                           sync_window=settings.sync_window, segment_size=settings.segment_size,
                           max_batch_bytes=settings.sync_max_bytes, log=log)
        if settings.mode not in MODES:
            raise QueueError(f"queue {settings.name!r}: mode must be one of {MODES}, got "
                             f"{settings.mode!r}")
        self.budget = Budget()  # this queue's messages and the copies it holds, together
        self.core = QueueCore(settings.limits(), stream=settings.mode == "stream",
                              budget=self.budget)
        self.stream: StreamCore | None = None
        self.port = cluster  # to the pzq service of peer brokers: copies we make and hold
        replicate_in_cluster = bool(settings.replicas and not settings.peers)
        if settings.replicas > len(settings.peers) and not (replicate_in_cluster and cluster):
            raise QueueError(f"queue {settings.name!r}: replicas {settings.replicas} needs a "
                             f"cluster or at least as many peers (has {len(settings.peers)})")
        self.placement: Placement | None = None  # the cluster peers that hold our copies
        self.rejoin_grace = rejoin_grace
        self._release: asyncio.TimerHandle | None = None
        self._qname = settings.name.encode()
        self.node = ""
        self.holder = ReplicaHolder(settings.data_dir / "replicas", settings.limits(),
                                    {"sync": settings.sync, "sync_window": settings.sync_window,
                                     "segment_size": settings.segment_size},
                                    self._replica_batch_threadsafe, log, budget=self.budget,
                                    max_origins=settings.max_replica_origins)
        self._sources = frozenset(settings.replica_sources)
        self._refusal_logged = -REFUSAL_LOG_INTERVAL
        self._peers: list[zmq.Socket] = []
        self._next_housekeeping = float("inf")
        self.consumers = 0
        self._socks: list[zmq.Socket] = []
        self._receiver: Receiver | None = None
        self._send: zmq.Socket | None = None
        self._mon: zmq.Socket | None = None
        self._stream_sock: zmq.Socket | None = None
        self._credit: zmq.Socket | None = None
        self._events: zmq.Socket | None = None
        self._fds: list[int] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._last_reap = 0.0
        self._send_blocked = False
        self._credit_blocked: set[bytes] = set()
        self._running = False
        self._scheduled = False
        self._producers_scheduled = False
        self._held: deque[tuple[bytes, list[bytes]]] = deque()
        self._confirmations: list[Confirm] = []
        self._replica_out: list[Replicate | Unreplicate] = []
        self._retry_replies: asyncio.TimerHandle | None = None
        self.dropped_replies = 0
        self.dropped_confirmations = 0
        self.dropped_stream_replies = 0

    # --- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        try:
            recovered = await self.loop.run_in_executor(None, self.store.open)
        except OSError as exc:
            raise QueueError(f"queue {s.name!r}: cannot open its data directory "
                             f"{str(s.data_dir)!r}: {exc.strerror or exc}") from None
        try:
            await self._start(recovered)
        except BaseException:
            self.store.close()
            raise

    async def _start(self, recovered: Any) -> None:
        s = self.settings
        try:
            committed = load_committed(s.data_dir)
        except OSError as exc:
            raise QueueError(f"queue {s.name!r}: {exc}") from None
        messages, stale = recovered.messages, []
        if committed is not None:  # committed before a crash, not yet ACKed in the log
            stale = [m.seq for m in messages if m.seq < committed]
            messages = [m for m in messages if m.seq >= committed]
        hold = bool(s.replicas and not s.peers and self.rejoin_grace > 0)
        self.core.recover(messages, max(recovered.next_seq, committed or 0), hold=hold)
        if s.mode == "stream":
            if committed is None:
                committed = messages[0].seq if messages else self.core.next_seq
            self.stream = StreamCore(self.core, committed)
        self.node = load_node_id(s.data_dir)
        if s.replicas and not s.peers:
            self.placement = Placement(self.node, s.replicas)
            self.core.replica_targets = 0  # until peers of the cluster host this queue
        await self.loop.run_in_executor(None, self.holder.open_existing, self.loop.time(),
                                        self._accepts_origin)
        try:
            await self._listen()
            self._send = self._bind(zmq.DEALER, s.send_endpoint, "send",
                                    hwm=s.inflight_window)
            self._events = self._send.get_monitor_socket(
                zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
            self._socks.append(self._events)
            if s.monitor_endpoint:
                self._mon = self._bind(zmq.ROUTER, s.monitor_endpoint, "monitor")
            if self.stream is not None:
                self._stream_sock = self._bind(zmq.ROUTER, s.stream_endpoint, "stream")
            if s.credit_endpoint and self.stream is None:
                self._credit = self._bind(zmq.ROUTER, s.credit_endpoint, "credit")
                self._credit.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone consumer: an error
                self._credit.setsockopt(zmq.SNDHWM, wire.MAX_WINDOW)
            for endpoint in s.peers[:s.replicas]:
                peer = self.ctx.socket(zmq.DEALER)
                peer.setsockopt(zmq.LINGER, 500)
                peer.setsockopt(zmq.SNDHWM, REPLY_HWM)
                peer.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
                peer.connect(endpoint)
                self._socks.append(peer)
                self._peers.append(peer)
        except BaseException:
            self._close_sockets()
            self.holder.close()
            raise
        if self._peers or self.holder.origins:
            self._next_housekeeping = self.loop.time()
        self.store.start(self._batch_threadsafe)
        for seq in stale:
            self.store.ack(seq)
        self._running = True
        if self.core.held:
            self._release = self.loop.call_later(self.rejoin_grace, self._release_held)
        for sock in self._socks:
            fd = sock.getsockopt(zmq.FD)
            self._fds.append(fd)
            self.loop.add_reader(fd, self._wake)
        self._wake()
        self.log.info("pzq queue started", queue=s.name, receive=s.receive_endpoint,
                      send=s.send_endpoint, monitor=s.monitor_endpoint, mode=s.mode,
                      stream=s.stream_endpoint if self.stream is not None else None,
                      data_dir=str(s.data_dir), sync=s.sync, node=self.node,
                      recovered=len(messages), committed=committed,
                      truncated_bytes=recovered.truncated_bytes)

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        for fd in self._fds:
            self.loop.remove_reader(fd)
        self._fds.clear()
        if self._timer is not None:
            self._timer.cancel()
        if self._retry_replies is not None:
            self._retry_replies.cancel()
        if self._release is not None:
            self._release.cancel()
        await self.loop.run_in_executor(None, self.holder.close)
        stopped = await self.loop.run_in_executor(None, self.store.close, STOP_TIMEOUT)
        if not stopped:
            self.log.warning("pzq store did not stop in time", queue=self.settings.name)
        await asyncio.sleep(0)  # the writer's last reports
        await asyncio.sleep(0)
        self._flush_replies()
        self._send_confirmations()
        self._close_sockets()
        self.log.info("pzq queue stopped", queue=self.settings.name,
                      messages=len(self.core.messages))

    def counters(self) -> dict[str, int]:
        """The monitor's counters: the original's six, then ours."""
        core, store = self.core, self.store
        return {
            "messages": len(core.messages),
            "messages_inflight": core.dispatcher.inflight,
            "db_size": store.disk_bytes,
            "inflight_db_size": core.dispatcher.inflight_bytes,
            "syncs": store.syncs,
            "expired_messages": core.dispatcher.expired,
            "consumers": self.consumers,
            **(self._receiver.counters() if self._receiver is not None else {}),
            "credit_consumers": core.credit_consumers,
            **({"dropped_confirmations": self.dropped_confirmations}
               if self._credit is not None else {}),
            "redelivered": core.dispatcher.redelivered,
            "backlog_bytes": core.backlog_bytes,
            "dropped_replies": self.dropped_replies,
            **core.counters,
            **store.counters(),
            **self.holder.counters(),
            **({"replica_holders": len(self.placement), "held_recovered": len(core.held),
                # ^ recovered messages not delivered yet: peers may still say they did
                "recopy_backlog": sum(len(r.todo) + len(r.sent)
                                      for r in self.placement.recopies.values())}
               if self.placement is not None else {}),
            **(self.stream.counters() if self.stream is not None else {}),
            **({"dropped_stream_replies": self.dropped_stream_replies}
               if self.stream is not None else {}),
        }

    # --- sockets ---------------------------------------------------------------------------

    def _bind(self, kind: int, endpoint: str, role: str, hwm: int | None = None) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 500)
        sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_size + MAXMSG_SLACK)
        if hwm is not None:
            sock.setsockopt(zmq.SNDHWM, hwm)
        if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
            Path(endpoint[len("ipc://"):]).parent.mkdir(parents=True, exist_ok=True)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise QueueError(f"queue {self.settings.name!r}: cannot bind its {role} socket to "
                             f"{endpoint}: {exc.strerror}") from None
        self._socks.append(sock)
        return sock

    async def _listen(self) -> None:
        s = self.settings
        self._receiver = Receiver(
            self.loop, self._producers_waiting, max_frames=s.max_frames,
            max_bytes=s.max_message_size + ENVELOPE_ALLOWANCE + wire.FRAME_COST * s.max_frames,
            frame_cost=wire.FRAME_COST, keep_first=wire.MAX_ID + 1,
            max_held=max(s.max_backlog, 2 * s.max_message_size), log=self.log, name=s.name)
        if s.receive_endpoint.startswith("ipc://") and not s.receive_endpoint.startswith("ipc://@"):
            Path(s.receive_endpoint[len("ipc://"):]).parent.mkdir(parents=True, exist_ok=True)
        try:
            await self._receiver.start(s.receive_endpoint)
        except (OSError, EndpointError) as exc:
            self._receiver = None
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise QueueError(f"queue {s.name!r}: cannot bind its receive socket to "
                             f"{s.receive_endpoint}: {why}") from None

    def _close_sockets(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
        if self._send is not None and self._events is not None:
            try:
                self._send.disable_monitor()
            except zmq.ZMQError:
                pass
        for sock in reversed(self._socks):
            sock.close()
        self._socks.clear()
        self._send = self._mon = self._events = self._stream_sock = None
        self._credit = None
        self._peers.clear()

    # --- the loop --------------------------------------------------------------------------

    def _wake(self) -> None:
        """Any socket may have something: serve all, then look again (edge-triggered FDs)."""
        self._scheduled = False
        if not self._running:
            return
        again = False
        if self._drain_events():
            again = True
        if self._drain_consumer_acks():
            again = True
        if self._drain_producers():
            again = True
        if self._mon is not None:
            self._drain_monitor()
        if self._credit is not None and self._drain_credit():
            again = True
        if self._stream_sock is not None and self._drain_stream():
            again = True
        if self._peers and self._drain_peers():
            again = True
        self._flush_replies()
        self._send_confirmations()
        self._flush_replica_out()
        self._dispatch()
        self._schedule_timer()
        if again or self._pollin():
            self._schedule_wake()

    def _producers_waiting(self) -> None:
        """The receiver has messages: serve them without looking at every socket (a wake-up
        for each read of the producers' connections costs more than the messages)."""
        if not self._scheduled and not self._producers_scheduled:
            self._producers_scheduled = True
            self.loop.call_soon(self._serve_producers)

    def _serve_producers(self) -> None:
        self._producers_scheduled = False
        if not self._running or self._scheduled:
            return  # a whole wake-up comes anyway
        more = self._drain_producers()
        self._flush_replies()
        self._flush_replica_out()
        self._dispatch()
        self._schedule_timer()
        if self._pollin():  # sending may have taken the edge of a ZeroMQ socket's FD
            self._schedule_wake()
        elif more:
            self._producers_waiting()

    def _schedule_wake(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._wake)

    def _pollin(self) -> bool:
        if self._receiver is not None and self._receiver.inbox:
            return True
        for sock in (self._send, self._events, self._mon, self._stream_sock, self._credit,
                     *self._peers):
            if sock is not None and sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                return True
        return bool(self._send_blocked and self._send is not None
                    and self._send.getsockopt(zmq.EVENTS) & zmq.POLLOUT)

    def _drain_producers(self) -> bool:
        core, receiver = self.core, self._receiver
        if receiver is None or not receiver.inbox:
            return False
        now_us = time.time_ns() // 1000
        now = self.loop.time()
        for peer, frames, refused in receiver.take(DRAIN_BUDGET):
            if refused is not None:
                core.refuse(peer, frames[0][:wire.MAX_ID], refused)
            elif len(frames) > 2 and frames[1][:7] == b"REPLICA":
                self._replication_traffic(peer, frames)
            else:
                core.produce(peer, frames, now_us, now)
        return bool(receiver.inbox)

    def _replication_traffic(self, peer: bytes, rest: list[bytes]) -> None:
        """``rest``: [key][header...][""][body...]"""
        c = classify(rest)
        if c is None:  # a REPLICA header we do not know: an ordinary message then
            self.core.produce(peer, rest, time.time_ns() // 1000, self.loop.time())
            return
        kind, node = c
        if b"" not in rest[1:]:  # no delimiter: malformed, answered "0" as any producer's
            self.core.produce(peer, rest, time.time_ns() // 1000, self.loop.time())
            return
        if node == self.node:
            return  # our own copy came back (a peer list that names us)
        reason = (None if node in self._sources else
                  NOT_CONFIGURED if not self._sources else not_accepted(node))
        if reason is not None:  # creates nothing; only a copy is answered (as a producer)
            self._refuse_replica(kind, peer, rest[0], reason)
            return
        body = rest[rest.index(b"", 1) + 1:] if kind == REPLICA_HEADER else ()
        self._hold(kind, node, peer, rest[0], body)

    def _accepts_origin(self, node: str) -> bool:
        """Copies from ``node`` may be held here: it is a replica source, or this queue is in
        a cluster (whose peers are the cluster's to admit)."""
        return node in self._sources or self.port is not None

    def _refuse_replica(self, kind: bytes, peer: bytes, key: bytes, reason: str) -> None:
        self.holder.refused += 1
        if kind == REPLICA_HEADER:
            self._answer_holders([(peer, wire.producer_ack(key[:wire.MAX_ID], False, reason))])
        now = self.loop.time()
        if now - self._refusal_logged >= REFUSAL_LOG_INTERVAL:
            self._refusal_logged = now
            self.log.warning("pzq replica traffic refused", queue=self.settings.name,
                             reason=reason, refused=self.holder.refused)

    def _hold(self, kind: bytes, node: str, peer: bytes, key: bytes, body: Sequence[Any]
              ) -> None:
        """A copy of another queue's message (or its DELETE, or that queue's PING)."""
        if node == self.node:
            return  # our own copy came back (a peer list that names us)
        reason = self.holder.refusal(kind, node)
        if reason is not None:
            self._refuse_replica(kind, peer, key, reason)
            return
        now = self.loop.time()
        core = self.holder.handle(kind, node, peer, key, body, now, time.time_ns() // 1000)
        if self._next_housekeeping == float("inf") and self.holder.origins:
            self._next_housekeeping = now + self.settings.node_timeout / 4  # watch origins
        if core is not None:
            self._holder_replies(core)

    def _holder_replies(self, core: QueueCore) -> None:
        """A replica core's answers: to a static peer on the receive socket, to a cluster
        peer as CONFIRM."""
        self._pump()

    def _answer_holders(self, replies: list[tuple[bytes, list[bytes]]]) -> None:
        confirms: dict[tuple[bytes, bytes], list[bytes]] = {}
        for peer, frames in replies:
            if not peer.startswith(CLUSTER_PEER):
                self._held.append((peer, frames))
            else:
                confirms.setdefault((peer, frames[1]), []).append(frames[0])
        if self.port is None:
            return
        for (peer, status), keys in confirms.items():
            life = peer[len(CLUSTER_PEER):].decode()
            for frames in key_batches([CONFIRM, self._qname, status], keys):
                self.port.send(life, frames)

    def _drain_peers(self) -> bool:
        any_more = False
        for sock in self._peers:
            messages, more = receive_some(sock)
            for frames in messages:
                if len(frames) >= 2:
                    self.core.replica_confirmed(frames[0], frames[1] == wire.OK)
            any_more |= more
        return any_more

    def _flush_replica_out(self) -> None:
        self._pump()
        out = self._replica_out
        if not out:
            return
        self._replica_out = []
        if self.placement is not None:
            return self._send_to_holders(out)
        for a in out:
            frames = (copy_frames(a.key, self.node, a.body) if type(a) is Replicate
                      else delete_frames(a.key, self.node))
            for sock in self._peers:
                try:
                    send_frames(sock, frames)
                except zmq.ZMQError:
                    pass  # that peer is unreachable: the copy times out (REPLICATION_FAILED)

    def _housekeeping(self, now: float) -> None:
        """Every node_timeout / 4: tell peers we are alive; take over lost origins' copies."""
        self._next_housekeeping = now + self.settings.node_timeout / 4
        for sock in self._peers:
            try:
                send_frames(sock, ping_frames(self.node))
            except zmq.ZMQError:
                pass
        for origin in self.holder.lost(now, self.settings.node_timeout):
            n = self.holder.take_over(origin, self.core, time.time_ns() // 1000)
            self.log.warning("pzq replica origin lost: its messages taken over",
                             queue=self.settings.name, node=origin.node_id, messages=n)

    # --- replication over the cluster -------------------------------------------------------

    def peer_hosts(self, life: str, node: str) -> None:
        """A peer of the cluster (one life) hosts a queue of this name, whose node id is
        ``node``: a candidate holder of our copies, maybe an origin of copies we hold."""
        if not self._running or not is_node(node) or node == self.node:
            return
        self.holder.announced(life, node, self.loop.time())
        taken = self.holder.taken(node)
        if taken and self.port is not None:
            for i in range(0, len(taken), 1000):
                self.port.send(life, [TAKEN, self._qname, node.encode(), *taken[i:i + 1000]])
            self.holder.forget_taken(node)
            self.log.info("pzq told a returning queue what was delivered in its absence",
                          queue=self.settings.name, node=node, messages=len(taken))
        if self.port is not None:  # first: copies it holds from before are stale
            self.port.send(life, [RELEASE, self._qname, self.node.encode()])
        if self.placement is not None:
            self._flush_replica_out()  # what is pending goes to the holders of before
            self._holders_added(self.placement.available(life, node, self._backlog_keys()))

    def peer_gone(self, life: str) -> None:
        """A peer of the cluster left (or was lost): replace it as a holder of our copies;
        deliver the copies we hold for it."""
        if not self._running:
            return
        if self.placement is not None:
            was = life in self.placement.holders
            self._flush_replica_out()
            self._holders_added(self.placement.gone(life, self._backlog_keys()))
            if was:
                self.log.warning("pzq replica holder lost", queue=self.settings.name,
                                 peer=life, holders=len(self.placement))
        for origin in self.holder.left(life):
            n = self.holder.take_over(origin, self.core, time.time_ns() // 1000)
            self.log.warning("pzq replica origin lost: its messages taken over",
                             queue=self.settings.name, node=origin.node_id, messages=n)
        self._schedule_wake()

    def cluster_message(self, life: str, kind: bytes, frames: list[bytes]) -> bool:
        """A message of the cluster channel for this queue (``frames`` after the queue
        name). False if it is malformed."""
        if not self._running:
            return True
        peer = CLUSTER_PEER + life.encode()
        if kind in (CLUSTER_COPY, CLUSTER_DELETE):
            if len(frames) < 2:
                return False
            node = bytes(frames[0]).decode(errors="replace")
            if not is_node(node):
                return False
            if kind == CLUSTER_COPY:
                copies = parse_copies(frames[1:])
                if copies is None:
                    return False
                for key, body in copies:
                    self._hold(REPLICA_HEADER, node, peer, key, body)
            else:
                for key in frames[1:]:
                    self._hold(REPLICA_ACK_HEADER, node, peer, key, ())
        elif kind == CONFIRM:
            if len(frames) < 2:
                return False
            ok = frames[0] == wire.OK
            placement = self.placement
            for key in frames[1:]:
                self.core.replica_confirmed(key, ok)
                if placement is not None:
                    placement.confirmed(life, key)
            if placement is not None and placement.recopies:
                self._pump_recopies()
        elif kind == RELEASE:
            if len(frames) != 1 or not is_node(node := frames[0].decode(errors="replace")):
                return False
            dropped = self.holder.release(node)
            if dropped:
                self.log.info("pzq stale copies dropped", queue=self.settings.name, node=node,
                              copies=dropped)
        elif kind == TAKEN:
            if not frames or frames[0].decode(errors="replace") != self.node:
                return False
            dropped = sum(self.core.taken_back(key) for key in frames[1:])
            self.log.info("pzq messages delivered by a peer in our absence dropped",
                          queue=self.settings.name, peer=life, dropped=dropped,
                          listed=len(frames) - 1)
        else:
            return False
        self._schedule_wake()
        return True

    def _release_held(self) -> None:
        self._release = None
        if not self._running:
            return
        n = self.core.release_held()
        self.log.info("pzq recovered messages released to consumers", queue=self.settings.name,
                      messages=n, taken_back=self.core.counters["taken_back"])
        self._schedule_wake()

    def _backlog_keys(self) -> list[bytes]:
        return [m.key for m in self.core.messages.values()]

    def _holders_added(self, added: list[str]) -> None:
        placement = self.placement
        self.core.replica_targets = len(placement)
        for life in added:
            r = placement.recopies.get(life)
            self.log.info("pzq replica holder chosen", queue=self.settings.name, peer=life,
                          holders=len(placement), recopy=len(r.todo) if r else 0)
        if added:
            self._pump_recopies()

    def _send_to_holders(self, out: list[Replicate | Unreplicate]) -> None:
        placement, port, node = self.placement, self.port, self.node.encode()
        copies = [(a.key, a.body) for a in out if type(a) is Replicate]
        deleted = [a.key for a in out if type(a) is Unreplicate]
        # copies first: a key copied and ACKed within one turn is then deleted after its copy
        batches = [*copy_batches(self._qname, node, copies),
                   *key_batches([CLUSTER_DELETE, self._qname, node], deleted)]
        for key in deleted:
            placement.forget(key)
        for life in placement.holders:
            for frames in batches:
                port.send(life, frames)  # False: that peer is lost; peer_gone replaces it
        if placement.recopies:
            self._pump_recopies()

    def _pump_recopies(self) -> None:
        """Send the next part of each new holder's re-copy (a window at a time)."""
        placement, core = self.placement, self.core
        node = self.node.encode()
        for life, r in list(placement.recopies.items()):
            while True:
                keys = r.next_keys()
                if not keys:
                    break
                items = []
                for key in keys:
                    seq = core.keys.get(key)
                    m = core.messages.get(seq) if seq is not None else None
                    if m is None:  # ACKed meanwhile
                        r.confirmed(key)
                    else:
                        items.append((key, m.frames))
                if not all(self.port.send(life, frames)
                           for frames in copy_batches(self._qname, node, items)):
                    r.todo.clear()  # that peer is lost: peer_gone replaces it
                    r.sent.clear()
            if r.done:
                placement.recopies.pop(life, None)

    def _replica_batch_threadsafe(self, origin: Any, result: BatchResult) -> None:
        try:
            self.loop.call_soon_threadsafe(self._on_replica_batch, origin, result)
        except RuntimeError:
            pass

    def _on_replica_batch(self, origin: Any, result: BatchResult) -> None:
        origin.store.complete(result)
        origin.core.batch_done(result)
        if result.error is None:
            origin.core.compact(origin.store.to_compact(origin.core.backlog_bytes))
        self._holder_replies(origin.core)
        self._flush_replies()

    def _drain_consumer_acks(self) -> bool:
        messages, more = receive_some(self._send)
        for frames in messages:
            self.core.consumer_ack(frames)
        return more

    def _drain_events(self) -> bool:
        sock = self._events
        changed = False
        more = True
        for _ in range(DRAIN_BUDGET):
            try:
                msg = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                more = False
                break
            event = parse_monitor_message(msg)["event"]
            if event == zmq.EVENT_ACCEPTED:
                self.consumers += 1
                changed = True
            elif event == zmq.EVENT_DISCONNECTED:
                self.consumers = max(0, self.consumers - 1)
                changed = True
        if changed:
            self.core.consumers_changed(self.consumers)
            self.log.debug("pzq consumers", queue=self.settings.name, connected=self.consumers)
        return more

    def _drain_monitor(self) -> None:
        sock = self._mon
        for _ in range(100):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            envelope = wire.split_monitor_request(frames[1:])
            if envelope is None:
                continue
            try:
                sock.send_multipart([frames[0], *envelope, wire.monitor_text(self.counters())],
                                    zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _drain_stream(self) -> bool:
        """Serve HEAD and RANGE at once; a COMMIT waits for its offsets file write."""
        messages, more = receive_some(self._stream_sock, STREAM_BUDGET)
        for frames in messages:
            reply = self.stream.request(frames)
            if reply is not None:
                self._stream_reply(reply)
        self._write_committed()
        return more

    def _stream_reply(self, frames: list[bytes]) -> None:
        try:
            send_frames(self._stream_sock, frames)
        except zmq.ZMQError:  # that reader's connection is full or gone: it asks again
            self.dropped_stream_replies += 1

    def _write_committed(self) -> None:
        value = self.stream.to_write()
        if value is None:
            return
        future = self.loop.run_in_executor(None, save_committed, self.settings.data_dir, value)
        future.add_done_callback(functools.partial(self._committed_written, value))

    def _committed_written(self, value: int, future: asyncio.Future[None]) -> None:
        if not self._running or future.cancelled():
            return  # stopping: the offsets file holds it; the log is cleaned at the next start
        exc = future.exception()
        error = None
        if exc is not None:
            error = f"commit failed: {getattr(exc, 'strerror', None) or exc}"
            self.log.warning("pzq stream commit failed", queue=self.settings.name,
                             offset=value, error=error)
        for reply in self.stream.written(value, error):
            self._stream_reply(reply)
        self._write_committed()
        self._flush_replies()
        self._flush_replica_out()

    def _pump(self) -> None:
        """Carry out what the cores asked for."""
        holder = self.holder
        for a in self.core.take_replication():
            if type(a) is Adopted:
                holder.adopted(a.token, a.ok)
            else:
                self._replica_out.append(a)
        for origin in holder.origins.values():
            out = origin.core.take_output()
            if out:
                self._run(out, origin.store, holder=True)
        self._run(self.core.take_output(), self.store)

    def _run(self, actions: list[Any], store: Store, holder: bool = False) -> None:
        answers = []
        for a in actions:
            t = type(a)
            if t is Append:
                store.append(a.seq, a.key, a.msg_id, a.frames)
            elif t is Reply:
                if holder:
                    answers.append((a.peer, a.frames))
                else:
                    self._held.append((a.peer, a.frames))
            elif t is Ack:
                store.ack(a.seq)
            elif t is Move:
                store.move(a.seq, a.key, a.msg_id, a.frames)
            elif t is Confirm:
                self._confirmations.append(a)
        if answers:
            self._answer_holders(answers)

    def _flush_replies(self) -> None:
        """Send the producer ACKs. A producer that does not read them makes its connection
        fill up (EAGAIN): its ACKs wait (up to MAX_HELD_REPLIES) and are tried again soon."""
        self._pump()
        receiver = self._receiver
        if receiver is None:
            return
        held = self._held
        while held:
            peer, frames = held[0]
            if receiver.send(peer, frames) == FULL:
                break
            # GONE: the producer has gone; it will send again when back
            held.popleft()
        receiver.flush()
        if held:
            while len(held) > MAX_HELD_REPLIES:
                held.popleft()
                self.dropped_replies += 1
            if self._retry_replies is None and self._running:
                self._retry_replies = self.loop.call_later(0.01, self._on_retry_replies)

    def _on_retry_replies(self) -> None:
        self._retry_replies = None
        self._flush_replies()

    def _dispatch(self) -> None:
        sock, core = self._send, self.core
        if sock is None:
            return
        now = self.loop.time()
        now_us = time.time_ns() // 1000
        dispatcher, credit = core.dispatcher, self._credit
        if self._send_blocked:
            self._send_blocked = False
            dispatcher.pause(CONSUMERS, False)
        for cid in self._credit_blocked:
            dispatcher.pause(cid, False)
        self._credit_blocked.clear()
        while True:
            nxt = core.next_delivery(now, now_us)
            if nxt is None:
                return
            d, frames = nxt
            if d.consumer == CONSUMERS:
                try:
                    send_frames(sock, frames)
                except zmq.Again:
                    # every legacy consumer's connection is full (or none is there): the
                    # others may still take it; woken again when the socket is writable
                    core.unsent(d)
                    dispatcher.pause(CONSUMERS)
                    self._send_blocked = True
                continue
            try:
                _send(credit, d.consumer, _MORE_NOBLOCK, True)
                send_frames(credit, frames)
            except zmq.Again:  # its connection is full: tried again at the next wake-up
                core.unsent(d)
                dispatcher.pause(d.consumer)
                self._credit_blocked.add(d.consumer)
            except zmq.ZMQError:  # EHOSTUNREACH: it has gone; what it held is ready again
                core.unsent(d)
                n = core.consumer_gone(d.consumer)
                self.log.debug("pzq credit consumer gone", queue=self.settings.name,
                               requeued=n)

    def _send_confirmations(self) -> None:
        """[key][ACKED|UNKNOWN] to credit consumers (one that is gone or full: dropped, it
        learns nothing and may ACK again, which is answered UNKNOWN)."""
        sock = self._credit
        if not self._confirmations or sock is None:
            return
        confirmations, self._confirmations = self._confirmations, []
        for cid, key, status in ((c.consumer, c.key, c.status) for c in confirmations):
            try:
                _send(sock, cid, _MORE_NOBLOCK, True)
                _send(sock, key, _MORE_NOBLOCK, True)
                _send(sock, status, _NOBLOCK, True)
            except zmq.ZMQError:
                self.dropped_confirmations += 1

    def _drain_credit(self) -> bool:
        """The credit endpoint: READY (a consumer's window) and ACKs."""
        core = self.core
        messages, more = receive_some(self._credit)
        for frames in messages:
            if len(frames) < 2:
                continue
            ready = wire.decode_ready(frames[1:])
            if ready is None:
                core.consumer_ack(frames[1:], confirm_to=frames[0])
            elif isinstance(ready, wire.WireError):
                core.counters["malformed"] += 1
            elif not core.credit_consumer(frames[0], ready):
                self.log.warning("pzq too many credit consumers: READY ignored",
                                 queue=self.settings.name)
        return more

    def _batch_threadsafe(self, result: BatchResult) -> None:
        try:
            self.loop.call_soon_threadsafe(self._on_batch, result)
        except RuntimeError:
            pass  # the loop is closed

    def _on_batch(self, result: BatchResult) -> None:
        if result.error is not None:  # the store logs when writes start and stop failing
            self.log.debug("pzq store write failed", queue=self.settings.name,
                           error=result.error, messages=len(result.failed))
        self.store.complete(result)
        self.core.batch_done(result)
        if result.error is None:
            self.core.compact(self.store.to_compact(self.core.backlog_bytes))
        self._flush_replies()
        self._send_confirmations()
        if self._running:
            self._dispatch()
            if self._pollin():
                self._schedule_wake()

    def _schedule_timer(self) -> None:
        deadline = self.core.next_deadline()
        at = (float("inf") if deadline is None
              else max(deadline, self._last_reap + self.settings.reaper_frequency))
        replication = self.core.next_replication_deadline()
        if replication is not None:
            at = min(at, replication)
        at = min(at, self._next_housekeeping)
        if at == float("inf"):
            return
        if at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        if not self._running:
            return
        now = self.loop.time()
        if now >= self._next_housekeeping:
            self._housekeeping(now)
        deadline = self.core.next_deadline()
        if deadline is not None and deadline <= now:
            self._last_reap = now
        due = self.core.tick(now)
        self._flush_replies()
        self._flush_replica_out()
        if due:
            self.log.debug("pzq ack timeouts", queue=self.settings.name, messages=len(due))
        self._dispatch()
        self._schedule_timer()
        if self._pollin():
            self._schedule_wake()


def default_data_dir(broker: str, queue: str) -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "zbroker" / broker / "pzq" / queue
