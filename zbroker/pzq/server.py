"""One pzq queue on its sockets and logs: the I/O around the pzq cores, on an asyncio loop.

    receive  ROUTER, bound: producers (DEALER) send messages, get ACKs; read by receiver.py,
             which can refuse a message before all of it has arrived (libzmq cannot)
    send     DEALER, bound: consumers (DEALER or ROUTER) get messages pushed, send ACKs
    monitor  ROUTER, bound: MONITOR requests (REQ)
    stream   ROUTER, bound, stream queues only: HEAD / RANGE / COMMIT requests (stream.py)
    credit   ROUTER, bound, optional: consumers that say READY with a window
    peers    DEALER, connected: the static peers our copies go to (replication.py)

The decisions are the cores' (queue.py, stream.py, replication.py): the server feeds them what
arrives, the clock and what the logs wrote, and carries out the actions they return
(actions.py). The logs are the store's writer threads' (one for the queue, one for the copies
of each origin it holds); their reports come back through call_soon_threadsafe.

The send socket is a DEALER as in the original, so consumers need not say anything first.
libzmq spreads messages over the connected consumers and skips one whose connection is full;
each connection holds at most ``inflight_window`` unsent messages (SNDHWM), and the queue keeps
at most ``inflight_window`` x connected consumers unACKed (counted from the socket's connect and
disconnect events) and ``inflight_size`` bytes in flight.

Each ZeroMQ socket has a reader (zbroker.zmq_reader) that drains it when its edge-triggered FD
fires, then has what came carried out (``_flush``). Sending on a socket may take the edge of a
message that came meanwhile: after sending, the server has the socket's reader look again
(``recheck``), and a full send socket that is writable by then is tried again at once.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from ..zmq_reader import DRAIN_BUDGET, SocketReader
from . import peering, stream, wire
from .actions import (
    Ack,
    Append,
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
from .counters import Dropped, queue_counters
from .queue import CONSUMERS, Budget, QueueCore
from .receiver import FULL, EndpointError, Receiver
from .replica_files import forget_taken, load_node_id, load_taken, open_logs, remember_taken
from .replication import ReplicationCore
from .settings import QueueError, QueueSettings
from .sockets import MORE_NOBLOCK, NOBLOCK, bind, connect_peer, make_ipc_dir, send, send_frames
from .store import Store

STREAM_BUDGET = 100  # stream requests served per turn of the loop (a RANGE answer can be large)
MONITOR_BUDGET = 100
STOP_TIMEOUT = 5.0
MAX_HELD_REPLIES = 100_000  # ACKs held back for producers whose connection is full
REPLY_RETRY = 0.01  # seconds before held ACKs are tried again


class QueueServer:
    def __init__(self, settings: QueueSettings, zmq_context: zmq.Context,
                 loop: asyncio.AbstractEventLoop, log: Any, cluster: Any = None,
                 rejoin_grace: float = 0.0):
        """``cluster``: the broker's ClusterPort of the pzq service, if it is in a cluster;
        a queue with ``replicas`` and no static ``peers`` then replicates through it, and
        holds the messages it recovers at start for ``rejoin_grace`` seconds: long enough
        for the peers that took them over while it was gone to say so (TAKEN)."""
        settings.check(cluster=cluster is not None)
        self.settings, self.ctx, self.loop, self.log = settings, zmq_context, loop, log
        self.store = settings.store(log)
        # this queue's messages and the copies it holds share one Budget
        self.core = QueueCore(settings.limits(), stream=settings.mode == "stream",
                              budget=Budget())
        self.replication: ReplicationCore | None = None  # at start (it needs the node id)
        self.stream: stream.StreamCore | None = None
        self.port = cluster  # to the pzq service of peer brokers: copies we make and hold
        self.rejoin_grace = rejoin_grace
        self.node = ""
        self.consumers = 0
        self.dropped = Dropped()
        self._replicas_dir = settings.data_dir / "replicas"
        self._logs: dict[str | None, Store] = {None: self.store}  # by the name actions use
        self._receiver: Receiver | None = None
        self._socks: list[zmq.Socket] = []
        self._readers: list[SocketReader] = []
        self._send = self._events = self._mon = self._credit = self._stream_sock = None
        self._peers: list[zmq.Socket] = []
        self._to_recheck: set[SocketReader] = set()  # sent on outside their drain
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._last_reap = 0.0
        self._send_blocked = False
        self._credit_blocked: set[bytes] = set()
        self._running = self._serving = False
        self._held: deque[tuple[bytes, list[bytes]]] = deque()
        self._confirmations: list[Confirm] = []
        self._retry_replies: asyncio.TimerHandle | None = None

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
            for store in self._logs.values():
                store.close()
            raise

    async def _start(self, recovered: Any) -> None:
        s = self.settings
        try:
            committed = stream.load_committed(s.data_dir)
        except OSError as exc:
            raise QueueError(f"queue {s.name!r}: {exc}") from None
        self.stream, stale = stream.recover(
            self.core, recovered.messages, recovered.next_seq, committed,
            stream=s.mode == "stream", hold=bool(s.replicas and not s.peers
                                                 and self.rejoin_grace > 0))
        self.node = load_node_id(s.data_dir)
        rep = self.replication = ReplicationCore(
            self.core, s.replication(self.node, self.port is not None, self.rejoin_grace),
            taken=load_taken(self._replicas_dir))
        now = self.loop.time()
        self._logs.update(await self.loop.run_in_executor(
            None, open_logs, self._replicas_dir, s.max_replica_origins,
            lambda node, r: rep.restore(node, r.messages, r.next_seq, now),
            functools.partial(s.store, self.log), self.log))
        try:
            await self._listen()
            self._open_sockets()
        except BaseException:
            self._close_sockets()
            raise
        for log, store in self._logs.items():
            store.start(functools.partial(self._batch_threadsafe, log))
        for seq in stale:
            self.store.ack(seq)
        self._running = True
        rep.started(self.loop.time())
        for reader in self._readers:
            reader.start()
        self._flush()
        self.log.info("pzq queue started", queue=s.name, receive=s.receive_endpoint,
                      send=s.send_endpoint, monitor=s.monitor_endpoint, mode=s.mode,
                      stream=s.stream_endpoint if self.stream is not None else None,
                      data_dir=str(s.data_dir), sync=s.sync, node=self.node,
                      recovered=len(recovered.messages) - len(stale),
                      committed=self.stream.committed if self.stream is not None else committed,
                      truncated_bytes=recovered.truncated_bytes)

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        for reader in self._readers:
            reader.stop()
        for handle in (self._timer, self._retry_replies):
            if handle is not None:
                handle.cancel()
        for log, store in self._logs.items():
            if log is not None:
                await self.loop.run_in_executor(None, store.close)
        if not await self.loop.run_in_executor(None, self.store.close, STOP_TIMEOUT):
            self.log.warning("pzq store did not stop in time", queue=self.settings.name)
        await asyncio.sleep(0)  # the writer's last reports
        await asyncio.sleep(0)
        self._flush()
        self._close_sockets()
        self.log.info("pzq queue stopped", queue=self.settings.name,
                      messages=len(self.core.messages))

    def counters(self) -> dict[str, int]:
        """The monitor's counters: the original's six, then ours."""
        return queue_counters(self.core, self.store, self.dropped, consumers=self.consumers,
                              receiver=self._receiver, replication=self.replication,
                              stream=self.stream, credit=self._credit is not None)

    # --- sockets ---------------------------------------------------------------------------

    async def _listen(self) -> None:
        s = self.settings
        self._receiver = s.receiver(self.loop, self._soon, self.log)
        make_ipc_dir(s.receive_endpoint)
        try:
            await self._receiver.start(s.receive_endpoint)
        except (OSError, EndpointError) as exc:
            self._receiver = None
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise QueueError(f"queue {s.name!r}: cannot bind its receive socket to "
                             f"{s.receive_endpoint}: {why}") from None

    def _open_sockets(self) -> None:
        """Bind and connect the ZeroMQ sockets, each with its reader (started later)."""
        s, core = self.settings, self.core
        self._send = self._bind(zmq.DEALER, s.send_endpoint, "send", hwm=s.inflight_window)
        self._send_reader = self._reader(self._send, core.consumer_ack)
        self._events = self._send.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._socks.append(self._events)
        self._reader(self._events, self._on_connection_event)
        if s.monitor_endpoint:
            self._mon = self._bind(zmq.ROUTER, s.monitor_endpoint, "monitor")
            self._reader(self._mon, self._on_monitor, flush=False, budget=MONITOR_BUDGET)
        if self.stream is not None:
            self._stream_sock = self._bind(zmq.ROUTER, s.stream_endpoint, "stream")
            self._stream_reader = self._reader(self._stream_sock, self.stream.serve,
                                               budget=STREAM_BUDGET)
        if s.credit_endpoint and self.stream is None:
            self._credit = self._bind(zmq.ROUTER, s.credit_endpoint, "credit")
            self._credit.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone consumer: an error
            self._credit.setsockopt(zmq.SNDHWM, wire.MAX_WINDOW)
            self._credit_reader = self._reader(self._credit, self._on_credit)
        for endpoint in s.peers[:s.replicas]:
            self._peers.append(connect_peer(self.ctx, endpoint))
            self._socks.append(self._peers[-1])
            self._reader(self._peers[-1], self.replication.answer)  # answers to our copies
        self._peer_readers = self._readers[-len(self._peers):] if self._peers else []

    def _bind(self, kind: int, endpoint: str, role: str, hwm: int | None = None) -> zmq.Socket:
        try:
            sock = bind(self.ctx, kind, endpoint, self.settings.max_message_size, hwm)
        except zmq.ZMQError as exc:
            raise QueueError(f"queue {self.settings.name!r}: cannot bind its {role} socket to "
                             f"{endpoint}: {exc.strerror}") from None
        self._socks.append(sock)
        return sock

    def _reader(self, sock: zmq.Socket, handle: Any, flush: bool = True,
                budget: int = DRAIN_BUDGET) -> SocketReader:
        reader = SocketReader(self.loop, sock, handle, after=self._flush if flush else None,
                              budget=budget)
        self._readers.append(reader)
        return reader

    def _close_sockets(self) -> None:
        for reader in self._readers:
            reader.stop()
        self._readers.clear()
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
        self._send = self._mon = self._events = self._stream_sock = self._credit = None
        self._peers.clear()

    # --- what comes in: one handler per kind of socket ---------------------------------------

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
            core, rep = self.core, self.replication
            now_us, now = time.time_ns() // 1000, self.loop.time()
            for peer, frames, refused in receiver.take(DRAIN_BUDGET):
                if refused is not None:
                    core.refuse(peer, frames[0][:wire.MAX_ID], refused)
                elif len(frames) > 2 and frames[1][:7] == b"REPLICA":
                    rep.receive(peer, frames, now, now_us)
                else:
                    core.produce(peer, frames, now_us, now)
        self._flush()
        if receiver.inbox:
            self._soon()

    def _on_connection_event(self, msg: list[bytes]) -> None:
        """A consumer connected to the send socket or left: the queue's window follows."""
        event = parse_monitor_message(msg)["event"]
        if event not in (zmq.EVENT_ACCEPTED, zmq.EVENT_DISCONNECTED):
            return
        self.consumers = self.consumers + 1 if event == zmq.EVENT_ACCEPTED \
            else max(0, self.consumers - 1)
        self.core.consumers_changed(self.consumers)
        self.log.debug("pzq consumers", queue=self.settings.name, connected=self.consumers)

    def _on_monitor(self, frames: list[bytes]) -> None:
        envelope = wire.split_monitor_request(frames[1:])
        if envelope is not None:
            try:
                self._mon.send_multipart([frames[0], *envelope, wire.monitor_text(self.counters())],
                                         zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _on_credit(self, frames: list[bytes]) -> None:
        """The credit endpoint: READY (a consumer's window) and ACKs."""
        if len(frames) < 2:
            return
        core = self.core
        ready = wire.decode_ready(frames[1:])
        if ready is None:
            core.consumer_ack(frames[1:], confirm_to=frames[0])
        elif isinstance(ready, wire.WireError):
            core.counters["malformed"] += 1
        elif not core.credit_consumer(frames[0], ready):
            self.log.warning("pzq too many credit consumers: READY ignored",
                             queue=self.settings.name)

    # --- what goes out ---------------------------------------------------------------------

    def _flush(self) -> None:
        """Carry out what the cores asked for, send what waits, deliver."""
        if self.replication is not None:
            self._execute(self.replication.take_output())
        if self.stream is not None:
            self._execute(self.stream.take_output())
        self._flush_replies()
        if self._confirmations:
            self._send_confirmations()
        if self._running:
            self._dispatch()
            self._schedule_timer()
        if self._to_recheck:
            for reader in self._to_recheck:
                reader.recheck()
            self._to_recheck.clear()

    def _execute(self, actions: list[Any]) -> None:
        """Carry out the cores' actions (actions.py), in order."""
        logs, held = self._logs, self._held
        for a in actions:
            t = type(a)
            if t is Append:
                logs[a.log].append(a.seq, a.key, a.msg_id, a.frames)
            elif t is Reply:
                held.append((a.peer, a.frames))
            elif t is Ack:
                logs[a.log].ack(a.seq)
            elif t is SendCluster:
                if not self.port.send(a.life, peering.encode(a.message)) and a.recopy:
                    self.replication.peer_unreachable(a.life)
            elif t is SendStatic:
                frames = peering.encode_replica(a.message)
                for sock in self._peers:
                    try:
                        send_frames(sock, frames)
                    except zmq.ZMQError:
                        pass  # unreachable: a copy times out (REPLICATION_FAILED)
                self._to_recheck.update(self._peer_readers)
            elif t is Confirm:
                self._confirmations.append(a)
            elif t is Move:
                logs[a.log].move(a.seq, a.key, a.msg_id, a.frames)
            elif t is StreamReply:
                try:
                    send_frames(self._stream_sock, a.frames)
                except zmq.ZMQError:  # that reader's connection is full or gone: it asks again
                    self.dropped.stream_replies += 1
                self._to_recheck.add(self._stream_reader)
            elif t is WriteCommitted:
                future = self.loop.run_in_executor(None, stream.save_committed,
                                                   self.settings.data_dir, a.offset)
                future.add_done_callback(functools.partial(self._committed_written, a.offset))
            elif t is OpenLog:  # a new origin's: empty (origins are never dropped at run time)
                store = logs[a.log] = self.settings.store(self.log, a.log)
                store.open()
                store.start(functools.partial(self._batch_threadsafe, a.log))
            elif t is Log:
                getattr(self.log, a.level)(a.event, **a.fields)
            elif t is RememberTaken:
                try:
                    remember_taken(self._replicas_dir, a.node_id, a.keys)
                except OSError as exc:  # only costs duplicates if the origin comes back
                    self.log.warning("pzq cannot record taken-over keys", node=a.node_id,
                                     error=str(exc))
            elif t is ForgetTaken:
                forget_taken(self._replicas_dir, a.node_id)

    def _flush_replies(self) -> None:
        """Send the producer ACKs. A producer that does not read them makes its connection
        fill up (EAGAIN): its ACKs wait (up to MAX_HELD_REPLIES) and are tried again soon."""
        receiver, held = self._receiver, self._held
        if receiver is None:
            return
        while held:
            peer, frames = held[0]
            if receiver.send(peer, frames) == FULL:
                break
            held.popleft()  # sent, or GONE: the producer will send again when back
        receiver.flush()
        if held:
            while len(held) > MAX_HELD_REPLIES:
                held.popleft()
                self.dropped.replies += 1
            if self._retry_replies is None and self._running:
                self._retry_replies = self.loop.call_later(REPLY_RETRY, self._on_retry_replies)

    def _on_retry_replies(self) -> None:
        self._retry_replies = None
        self._flush_replies()

    def _send_confirmations(self) -> None:
        """[key][ACKED|UNKNOWN] to credit consumers (one that is gone or full: dropped, it
        learns nothing and may ACK again, which is answered UNKNOWN)."""
        sock = self._credit
        confirmations, self._confirmations = self._confirmations, []
        if sock is None:
            return
        for c in confirmations:
            try:
                send(sock, c.consumer, MORE_NOBLOCK, True)
                send(sock, c.key, MORE_NOBLOCK, True)
                send(sock, c.status, NOBLOCK, True)
            except zmq.ZMQError:
                self.dropped.confirmations += 1
        self._to_recheck.add(self._credit_reader)

    def _dispatch(self) -> None:
        sock, core = self._send, self.core
        if sock is None:
            return
        dispatcher, credit = core.dispatcher, self._credit
        if self._send_blocked:
            self._send_blocked = False
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
                    self._send_blocked = True
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
                    self.log.debug("pzq credit consumer gone", queue=self.settings.name,
                                   requeued=n)
                self._to_recheck.add(self._credit_reader)
            nxt = core.next_delivery(now, now_us)
        self._send_reader.recheck()
        if self._send_blocked and sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
            self._soon()  # writable again meanwhile: its FD will not say so

    # --- the logs and the clock ------------------------------------------------------------

    def _batch_threadsafe(self, log: str | None, result: BatchResult) -> None:
        try:
            self.loop.call_soon_threadsafe(self._on_batch, log, result)
        except RuntimeError:
            pass  # the loop is closed

    def _on_batch(self, log: str | None, result: BatchResult) -> None:
        if log is None and result.error is not None:  # the store logs when writes fail
            self.log.debug("pzq store write failed", queue=self.settings.name,
                           error=result.error, messages=len(result.failed))
        store, core = self._logs[log], self.replication.log_core(log)
        store.complete(result)
        if core is not None:
            core.batch_done(result)
            if result.error is None:
                core.compact(store.to_compact(core.backlog_bytes))
        self._flush()

    def _committed_written(self, value: int, future: asyncio.Future[None]) -> None:
        if not self._running or future.cancelled():
            return  # stopping: the offsets file holds it; the log is cleaned at the next start
        error = None
        if (exc := future.exception()) is not None:
            error = f"commit failed: {getattr(exc, 'strerror', None) or exc}"
            self.log.warning("pzq stream commit failed", queue=self.settings.name,
                             offset=value, error=error)
        self.stream.committed_written(value, error)
        self._flush()

    def _schedule_timer(self) -> None:
        deadline = self.core.next_deadline()
        at = (float("inf") if deadline is None
              else max(deadline, self._last_reap + self.settings.reaper_frequency))
        replication = self.replication.next_deadline()
        if replication is not None:
            at = min(at, replication)
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
        deadline = self.core.next_deadline()
        if deadline is not None and deadline <= now:
            self._last_reap = now
        self.replication.tick(now, time.time_ns() // 1000)
        if due := self.core.tick(now):
            self.log.debug("pzq ack timeouts", queue=self.settings.name, messages=len(due))
        self._flush()

    # --- the cluster (service.py) ----------------------------------------------------------

    def peer_hosts(self, life: str, node: str) -> None:
        """A peer of the cluster (one life) hosts a queue of this name (node id ``node``)."""
        if self._running:
            self.replication.peer_hosts(life, node, self.loop.time())
            self._soon()

    def peer_gone(self, life: str) -> None:
        """A peer of the cluster left (or was lost)."""
        if self._running:
            self.replication.peer_gone(life, time.time_ns() // 1000)
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
