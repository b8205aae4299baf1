"""One pzq queue on its sockets and logs: the I/O around the pzq cores, on an asyncio loop.

    receive  ROUTER, bound: producers (DEALER) send messages, get ACKs; read by receiver.py,
             which can refuse a message before all of it has arrived (libzmq cannot)
    send     DEALER, bound: consumers get messages pushed, send ACKs (consumers.py)
    credit   ROUTER, bound, optional: consumers that say READY with a window (consumers.py)
    monitor  ROUTER, bound: MONITOR requests (REQ; monitor.py)
    stream   ROUTER, bound, stream queues only: HEAD / RANGE / COMMIT (stream_endpoint.py)
             (these four are served over zmtp.py too: endpoints.py)
    peers    DEALER, connected: the static peers our copies go to (sockets.StaticPeers)

The decisions are the cores' (queue.py, stream.py, replication.py): the server feeds them what
arrives, the clock and what the logs wrote, and carries out the actions they return
(actions.py). The logs (queue_logs.py: one for the queue, one for the copies of each origin
it holds) write in their writer threads and report back on the loop.

Each ZeroMQ socket has a reader (zbroker.runtime.zmq_reader, made in sockets.py) that drains it when
its edge-triggered FD fires; what came is then carried out (``_flush``). Sending on a socket
may take the edge of a message that came meanwhile, so after sending the server has that
socket's reader look again (``recheck``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import zmq

from zbroker.runtime.zmq_reader import DRAIN_BUDGET
from zbroker.services.pzq.core import peering, stream
from zbroker.services.pzq.core.actions import (
    AckMany,
    Append,
    AppendBatch,
    BatchResult,
    Confirm,
    ForgetTaken,
    Log,
    Move,
    OpenLog,
    RememberTaken,
    Reply,
    SendCluster,
    SendStatic,
    StreamReply,
    WriteCommitted,
)
from zbroker.services.pzq.core.counters import Dropped, queue_counters
from zbroker.services.pzq.core.queue import Budget, QueueCore
from zbroker.services.pzq.core.replication import ReplicationCore

from .consumers import Consumers
from .endpoints import bind
from .monitor import Monitor
from .offsets_file import load_offsets
from .queue_logs import QueueLogs
from .receiver import Receiver
from .replica_files import forget_taken, load_node_id, load_taken, remember_taken
from .settings import QueueError, QueueSettings
from .sockets import Sockets, StaticPeers
from .stream_endpoint import StreamEndpoint

STOP_TIMEOUT = 5.0


class QueueServer:
    def __init__(self, settings: QueueSettings, zmq_context: zmq.Context,
                 loop: asyncio.AbstractEventLoop, log: Any, cluster: Any = None,
                 rejoin_grace: float = 0.0, lease: float = 0.0,
                 name_hosts: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        """``cluster``: the broker's ClusterPort of the pzq service, if it is in a cluster;
        a queue with ``replicas`` and no static ``peers`` then replicates through it, and
        holds the messages it recovers at start for ``rejoin_grace`` seconds: long enough
        for the peers that took them over while it was gone to say so (TAKEN)."""
        settings.check(cluster=cluster is not None)
        self.settings, self.loop, self.log = settings, loop, log
        self.logs = QueueLogs(settings, loop, log, self._on_batch)
        self.store = self.logs.own
        # this queue's messages and the copies it holds share one Budget
        self.core = QueueCore(settings.limits(), stream=settings.mode == "stream",
                              budget=Budget())
        self.core.clock_us = _clock_us  # for the producer ACK latency (metrics)
        self.replication: ReplicationCore | None = None  # at start (it needs the node id)
        self.stream: stream.StreamCore | None = None
        self.port = cluster  # to the pzq service of peer brokers: copies we make and hold
        self.rejoin_grace = rejoin_grace
        self.lease = lease  # (ReplicationSettings.lease)
        self.name_hosts = name_hosts
        self.node_id = ""  # this queue's, 32 hex digits (replica_files.py)
        self.dropped = Dropped()
        self._replicas_dir = settings.data_dir / "replicas"
        self._receiver: Receiver | None = None
        self._sockets = Sockets(zmq_context, loop, settings.name)
        self._consumers: Consumers | None = None
        self._stream_endpoint: StreamEndpoint | None = None
        self._monitor: Monitor | None = None
        self._peers = StaticPeers()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._running = self._serving = False
        self._confirmations: list[Confirm] = []

    # --- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        recovered = await self.logs.open_own()
        try:
            await self._start(recovered)
        except BaseException:
            self.logs.close_now()
            raise

    async def _start(self, recovered: Any) -> None:
        s = self.settings
        try:
            offsets = load_offsets(s.data_dir)
        except OSError as exc:
            raise QueueError(f"queue {s.name!r}: {exc}") from None
        self.stream, stale = stream.recover(
            self.core, recovered.messages, recovered.next_seq, offsets,
            stream=s.mode == "stream", hold=bool(s.replicas and not s.peers
                                                 and self.rejoin_grace > 0),
            retention=stream.Retention(s.retention_bytes, s.retention_seconds))
        self.node_id = load_node_id(s.data_dir)
        rep = self.replication = ReplicationCore(
            self.core, s.replication(self.node_id, self.port is not None, self.rejoin_grace,
                                     self.lease),
            taken=load_taken(self._replicas_dir))
        now = self.loop.time()
        await self.logs.open_copies(
            self._replicas_dir, lambda node, r: rep.restore(node, r.messages, r.next_seq, now))
        try:
            await self._open_sockets()
        except BaseException:
            self._close_sockets()
            raise
        self.logs.start()
        for seq in stale:
            self.store.ack(seq)
        self._running = True
        rep.started(self.loop.time())
        self._sockets.start()
        self._flush()
        self.log.info("pzq queue started", queue=s.name, receive=s.receive_endpoint,
                      send=s.send_endpoint, monitor=s.monitor_endpoint, mode=s.mode,
                      stream=s.stream_endpoint if self.stream is not None else None,
                      data_dir=str(s.data_dir), sync=s.sync, node=self.node_id,
                      recovered=len(recovered.messages) - len(stale),
                      committed=self.stream.committed if self.stream is not None else None,
                      truncated_bytes=recovered.truncated_bytes)

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        self._sockets.stop()
        if self._timer is not None:
            self._timer.cancel()
        if self._stream_endpoint is not None:
            self._stream_endpoint.running = False
        if not await self.logs.close(STOP_TIMEOUT):
            self.log.warning("pzq store did not stop in time", queue=self.settings.name)
        await asyncio.sleep(0)  # the writer's last reports
        await asyncio.sleep(0)
        self._flush()
        self._close_sockets()
        self.log.info("pzq queue stopped", queue=self.settings.name,
                      messages=len(self.core.messages))

    def metrics(self) -> dict[str, Any]:
        """What metrics read besides the counters: histograms and refusals by kind."""
        return {"ack_latency": self.core.ack_latency.snapshot(),
                "sync_batches": self.store.sync_batches.snapshot(),
                "refusals": dict(self.core.refusals)}

    def counters(self) -> dict[str, int]:
        """The monitor's counters: the original's six, then ours."""
        c = self._consumers
        return queue_counters(self.core, self.store, self.dropped, receiver=self._receiver,
                              consumers=c.connected if c is not None else 0,
                              consumer_endpoints=c,
                              replication=self.replication, stream=self.stream,
                              credit=c is not None and c.credit is not None)

    # --- sockets ---------------------------------------------------------------------------

    async def _open_sockets(self) -> None:
        """Bind and connect the sockets; their readers start with the queue."""
        s, socks = self.settings, self._sockets
        receiver = s.receiver(self.loop, self._soon, self.log)
        await bind(receiver, s.receive_endpoint, "receive", s.name)
        self._receiver = receiver
        self._consumers = Consumers(self.core, s, self.loop, self._flush, self._soon,
                                    self.log, self.dropped)
        await self._consumers.start()
        if s.monitor_endpoint:
            self._monitor = Monitor(self.loop, self.counters, self.log, s.name)
            await self._monitor.start(s.monitor_endpoint)
        if self.stream is not None:
            self._stream_endpoint = StreamEndpoint(self.stream, s, self.loop, self._flush,
                                                   self.log, self.dropped)
            await self._stream_endpoint.start()
        self._peers.connect(socks, s.peers[:s.replicas], self.replication.answer, self._flush)

    def _close_sockets(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
        for endpoint in (self._consumers, self._monitor, self._stream_endpoint):
            if endpoint is not None:
                endpoint.close()
        self._sockets.close()
        self._consumers = self._stream_endpoint = self._monitor = None
        self._peers.clear()

    # --- what comes in ---------------------------------------------------------------------

    def _soon(self) -> None:
        """Serve the producers' messages and carry out what waits, at the next turn of the
        loop (one turn for all the reads of the producers' connections meanwhile)."""
        if not self._serving:
            self._serving = True
            self.loop.call_soon(self._serve)

    def _serve(self) -> None:
        self._serving = False
        receiver = self._receiver
        if not self._running or receiver is None:
            return
        if receiver.inbox:
            self.replication.received(receiver.take(DRAIN_BUDGET), self.loop.time(),
                                      time.time_ns() // 1000)
        self._flush()
        if receiver.inbox:
            self._soon()

    # --- what goes out ---------------------------------------------------------------------

    def _flush(self) -> None:
        """Carry out what the cores asked for, send what waits, deliver."""
        if self.replication is not None:
            rep = self.replication
            while actions := rep.take_output():  # carrying them out may make more
                self._execute(actions)
        if self.stream is not None:
            self.stream.enforce_retention(time.time_ns() // 1000)
            self._execute(self.stream.take_output())
        if self._receiver is not None:
            self._receiver.flush()
        consumers = self._consumers
        if consumers is not None:
            if self._confirmations:
                consumers.confirm(self._confirmations)
                self._confirmations = []
            if self._running:
                consumers.deliver()  # (and flushes the confirmations)
            else:
                consumers.write_out()
        if self._running:
            self._schedule_timer()

    def _execute(self, actions: list[Any]) -> None:
        """Carry out the cores' actions (actions.py), in order."""
        logs, receiver = self.logs, self._receiver
        appends: list[Append] = []  # a run of them: queued together (QueueLogs.append)
        for a in actions:
            t = type(a)
            if t is Append:
                appends.append(a)
                continue
            if appends:
                logs.append(appends)
                appends = []
            if t is AppendBatch:
                logs[a.log].append_batch(a.first_seq, a.count, a.key_base, a.packed)
            elif t is Reply:
                if receiver is not None:
                    receiver.answer(a.peer, a.frames)
            elif t is AckMany:
                if (dropped := logs[a.log].ack_many(a.seqs)):
                    core = self.replication.log_core(a.log)
                    if core is not None:
                        for unwritten in dropped:
                            core.unwritten(unwritten)  # answers: taken by _flush's next round
            elif t is SendCluster:
                if not self.port.send(a.life, peering.encode(a.message)) and a.recopy:
                    self.replication.peer_unreachable(a.life)
            elif t is SendStatic:
                self._peers.send(peering.encode_replica(a.message))
            elif t is Confirm:
                self._confirmations.append(a)
            elif t is Move:
                logs[a.log].move(a.seq, a.key, a.msg_id, a.frames)
            elif t is StreamReply:
                self._stream_endpoint.reply(a.frames)
            elif t is WriteCommitted:
                self._stream_endpoint.write_committed(a.offsets)
            elif t is OpenLog:
                logs.open_origin(a.log)
            elif t is Log:
                fields = a.fields if self.name_hosts is None else self.name_hosts(a.fields)
                getattr(self.log, a.level)(a.event, **fields)
            elif t is RememberTaken:
                remember_taken(self._replicas_dir, a.node_id, a.keys, self.log)
            elif t is ForgetTaken:
                forget_taken(self._replicas_dir, a.node_id)
        if appends:
            logs.append(appends)

    # --- the logs and the clock ------------------------------------------------------------

    def _on_batch(self, log: str | None, result: BatchResult) -> None:
        if log is None and result.error is not None:  # the store logs when writes fail
            self.log.debug("pzq store write failed", queue=self.settings.name,
                           error=result.error, messages=len(result.failed))
        store, core = self.logs[log], self.replication.log_core(log)
        store.complete(result)
        if core is not None:
            core.batch_done(result)
            if result.error is None:
                core.compact(store.to_compact(core.backlog_bytes))
        self._flush()

    def _schedule_timer(self) -> None:
        at = self.replication.next_wakeup(self.settings.reaper_frequency)
        if self._stream_endpoint is not None and (
                stream_at := self._stream_endpoint.next_wakeup()) is not None:
            at = stream_at if at is None else min(at, stream_at)
        if at is not None and at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        if self._running:
            if due := self.replication.wakeup(self.loop.time(), time.time_ns() // 1000):
                self.log.debug("pzq ack timeouts", queue=self.settings.name, messages=len(due))
            self._flush()

    # --- the cluster (service.py) ----------------------------------------------------------

    def peer_hosts(self, life: str, node_id: str) -> None:
        """A peer of the cluster (one life) hosts a queue of this name (its ``node_id``)."""
        if self._running:
            self.replication.peer_hosts(life, node_id, self.loop.time())
            self._soon()

    def peer_gone(self, life: str, alive: bool = False) -> None:
        """A peer of the cluster left (or was lost; ``alive``: it ended that life itself and
        runs on)."""
        if self._running:
            self.replication.peer_gone(life, self.loop.time(), time.time_ns() // 1000, alive)
            self._soon()

    def cluster_message(self, life: str, frames: list[Any]) -> bool:
        """A message of the cluster channel for this queue (kind and queue name first).
        False if it is malformed."""
        if not self._running:
            return True
        ok = self.replication.cluster_message(life, frames, self.loop.time(),
                                              time.time_ns() // 1000)
        self._soon()
        return ok


def _clock_us() -> int:
    return time.time_ns() // 1000
