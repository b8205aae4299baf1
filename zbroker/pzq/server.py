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

Each readiness event drains every socket with non-blocking receives (up to a budget); the
sockets' FDs are edge-triggered, so every handler looks again at their events before it returns.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from . import peering, wire
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
)
from .queue import CONSUMERS, MODES, Budget, QueueCore
from .receiver import FULL, EndpointError, Receiver
from .replica_files import forget_taken, load_node_id, load_taken, open_logs, remember_taken
from .replication import ReplicationCore, ReplicationSettings
from .settings import QueueError, QueueSettings
from .sockets import DRAIN_BUDGET, MORE_NOBLOCK, NOBLOCK, receive_some, send, send_frames
from .store import Store
from .stream import StreamCore, load_committed, save_committed

STREAM_BUDGET = 100  # stream requests served per wake-up (a RANGE answer can be large)
#: frames up to max_message_size + this get an answer on the sockets libzmq reads; larger
#: ones are dropped with their connection
MAXMSG_SLACK = 1 << 20
STOP_TIMEOUT = 5.0
REPLY_HWM = 100_000  # messages queued to a static peer queue
MAX_HELD_REPLIES = 100_000  # ACKs held back for producers whose connection is full
#: what a producer's message may carry besides its body (id, headers, FRAME_COST a frame) on
#: top of the frames' own FRAME_COST: past max_message_size + this, the rest is discarded
ENVELOPE_ALLOWANCE = 64 << 10


class QueueServer:
    def __init__(self, settings: QueueSettings, zmq_context: zmq.Context,
                 loop: asyncio.AbstractEventLoop, log: Any, cluster: Any = None,
                 rejoin_grace: float = 0.0):
        """``cluster``: the broker's ClusterPort of the pzq service, if it is in a cluster;
        a queue with ``replicas`` and no static ``peers`` then replicates through it, and
        holds the messages it recovers at start for ``rejoin_grace`` seconds: long enough
        for the peers that took them over while it was gone to say so (TAKEN)."""
        s = self.settings = settings
        self.ctx, self.loop, self.log = zmq_context, loop, log
        if s.mode not in MODES:
            raise QueueError(f"queue {s.name!r}: mode must be one of {MODES}, got {s.mode!r}")
        if s.replicas > len(s.peers) and not (s.replicas and not s.peers and cluster):
            raise QueueError(f"queue {s.name!r}: replicas {s.replicas} needs a "
                             f"cluster or at least as many peers (has {len(s.peers)})")
        self.store = Store(s.data_dir, sync=s.sync, sync_window=s.sync_window,
                           segment_size=s.segment_size, max_batch_bytes=s.sync_max_bytes, log=log)
        # this queue's messages and the copies it holds share one Budget
        self.core = QueueCore(s.limits(), stream=s.mode == "stream", budget=Budget())
        self.replication: ReplicationCore | None = None  # at start (it needs the node id)
        self.stream: StreamCore | None = None
        self.port = cluster  # to the pzq service of peer brokers: copies we make and hold
        self.rejoin_grace = rejoin_grace
        self.node = ""
        self._replicas_dir = s.data_dir / "replicas"
        self._logs: dict[str | None, Store] = {None: self.store}  # by the name actions use
        self.consumers = 0
        self._socks: list[zmq.Socket] = []
        self._peers: list[zmq.Socket] = []
        self._receiver: Receiver | None = None
        self._send = self._mon = self._stream_sock = self._credit = self._events = None
        self._fds: list[int] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._last_reap = 0.0
        self._send_blocked = False
        self._credit_blocked: set[bytes] = set()
        self._running = self._scheduled = self._producers_scheduled = False
        self._held: deque[tuple[bytes, list[bytes]]] = deque()
        self._confirmations: list[Confirm] = []
        self._retry_replies: asyncio.TimerHandle | None = None
        self.dropped_replies = self.dropped_confirmations = self.dropped_stream_replies = 0

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
        rep = self.replication = ReplicationCore(self.core, ReplicationSettings(
            name=s.name, node_id=self.node, replicas=s.replicas,
            static_peers=len(s.peers[:s.replicas]), cluster=self.port is not None,
            sources=frozenset(s.replica_sources), node_timeout=s.node_timeout,
            max_origins=s.max_replica_origins, rejoin_grace=self.rejoin_grace),
            taken=load_taken(self._replicas_dir))
        now = self.loop.time()
        self._logs.update(await self.loop.run_in_executor(
            None, open_logs, self._replicas_dir, s.max_replica_origins,
            lambda node, r: rep.restore(node, r.messages, r.next_seq, now), self._replica_log,
            self.log))
        try:
            await self._listen()
            self._send = self._bind(zmq.DEALER, s.send_endpoint, "send", hwm=s.inflight_window)
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
            raise
        for log, store in self._logs.items():
            store.start(functools.partial(self._batch_threadsafe, log))
        for seq in stale:
            self.store.ack(seq)
        self._running = True
        rep.started(self.loop.time())
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

    def _replica_log(self, node: str) -> Store:
        s = self.settings
        return Store(self._replicas_dir / node, sync=s.sync, sync_window=s.sync_window,
                     segment_size=s.segment_size, log=self.log)

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        for fd in self._fds:
            self.loop.remove_reader(fd)
        self._fds.clear()
        for handle in (self._timer, self._retry_replies):
            if handle is not None:
                handle.cancel()
        replica_logs = [store for log, store in self._logs.items() if log is not None]
        for store in replica_logs:
            await self.loop.run_in_executor(None, store.close)
        stopped = await self.loop.run_in_executor(None, self.store.close, STOP_TIMEOUT)
        if not stopped:
            self.log.warning("pzq store did not stop in time", queue=self.settings.name)
        await asyncio.sleep(0)  # the writer's last reports
        await asyncio.sleep(0)
        self._flush()
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
            **(self.replication.counters() if self.replication is not None else {}),
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
        self._send = self._mon = self._events = self._stream_sock = self._credit = None
        self._peers.clear()

    # --- the loop --------------------------------------------------------------------------

    def _wake(self) -> None:
        """Any socket may have something: serve all, then look again (edge-triggered FDs)."""
        self._scheduled = False
        if not self._running:
            return
        again = False
        for drain in (self._drain_events, self._drain_consumer_acks, self._drain_producers,
                      self._drain_monitor, self._drain_credit, self._drain_stream,
                      self._drain_peers):
            again |= drain()
        self._flush(again)

    def _flush(self, again: bool = False) -> None:
        """Carry out what the cores asked for, send what waits, deliver; look again soon if
        ``again`` or a socket has input (sending may take the edge of its FD)."""
        if self.replication is not None:
            self._execute(self.replication.take_output())
        self._flush_replies()
        self._send_confirmations()
        if self._running:
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
        self._flush()
        if more and not self._scheduled:
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
            elif t is Confirm:
                self._confirmations.append(a)
            elif t is Move:
                logs[a.log].move(a.seq, a.key, a.msg_id, a.frames)
            elif t is OpenLog:  # a new origin's: empty (origins are never dropped at run time)
                store = logs[a.log] = self._replica_log(a.log)
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

    # --- one drain per kind of socket ------------------------------------------------------

    def _drain_producers(self) -> bool:
        core, receiver, rep = self.core, self._receiver, self.replication
        if receiver is None or not receiver.inbox:
            return False
        now_us = time.time_ns() // 1000
        now = self.loop.time()
        for peer, frames, refused in receiver.take(DRAIN_BUDGET):
            if refused is not None:
                core.refuse(peer, frames[0][:wire.MAX_ID], refused)
            elif len(frames) > 2 and frames[1][:7] == b"REPLICA":
                rep.receive(peer, frames, now, now_us)
            else:
                core.produce(peer, frames, now_us, now)
        return bool(receiver.inbox)

    def _drain_consumer_acks(self) -> bool:
        messages, more = receive_some(self._send)
        for frames in messages:
            self.core.consumer_ack(frames)
        return more

    def _drain_peers(self) -> bool:
        """Static peers' answers to our copies."""
        any_more = False
        for sock in self._peers:
            messages, more = receive_some(sock)
            for frames in messages:
                self.replication.answer(frames)
            any_more |= more
        return any_more

    def _drain_credit(self) -> bool:
        """The credit endpoint: READY (a consumer's window) and ACKs."""
        core = self.core
        if self._credit is None:
            return False
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

    def _drain_monitor(self) -> bool:
        sock = self._mon
        for _ in range(100 if sock is not None else 0):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            envelope = wire.split_monitor_request(frames[1:])
            if envelope is None:
                continue
            try:
                sock.send_multipart([frames[0], *envelope, wire.monitor_text(self.counters())],
                                    zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        return False

    def _drain_stream(self) -> bool:
        """Serve HEAD and RANGE at once; a COMMIT waits for its offsets file write."""
        if self._stream_sock is None:
            return False
        messages, more = receive_some(self._stream_sock, STREAM_BUDGET)
        for frames in messages:
            reply = self.stream.request(frames)
            if reply is not None:
                self._stream_reply(reply)
        self._write_committed()
        return more

    # --- stream commits --------------------------------------------------------------------

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
        self._flush()

    # --- what goes out ---------------------------------------------------------------------

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

    def _send_confirmations(self) -> None:
        """[key][ACKED|UNKNOWN] to credit consumers (one that is gone or full: dropped, it
        learns nothing and may ACK again, which is answered UNKNOWN)."""
        sock = self._credit
        if not self._confirmations or sock is None:
            return
        confirmations, self._confirmations = self._confirmations, []
        for c in confirmations:
            try:
                send(sock, c.consumer, MORE_NOBLOCK, True)
                send(sock, c.key, MORE_NOBLOCK, True)
                send(sock, c.status, NOBLOCK, True)
            except zmq.ZMQError:
                self.dropped_confirmations += 1

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
                send(credit, d.consumer, MORE_NOBLOCK, True)
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

    def _schedule_timer(self) -> None:
        deadline = self.core.next_deadline()
        at = (float("inf") if deadline is None
              else max(deadline, self._last_reap + self.settings.reaper_frequency))
        replication = self.replication.next_deadline()
        if replication is not None:
            at = min(at, replication)
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
        deadline = self.core.next_deadline()
        if deadline is not None and deadline <= now:
            self._last_reap = now
        self.replication.tick(now, time.time_ns() // 1000)
        due = self.core.tick(now)
        if due:
            self.log.debug("pzq ack timeouts", queue=self.settings.name, messages=len(due))
        self._flush()

    # --- the cluster (service.py) ----------------------------------------------------------

    def peer_hosts(self, life: str, node: str) -> None:
        """A peer of the cluster (one life) hosts a queue of this name (node id ``node``)."""
        if self._running:
            self.replication.peer_hosts(life, node, self.loop.time())
            self._schedule_wake()

    def peer_gone(self, life: str) -> None:
        """A peer of the cluster left (or was lost)."""
        if self._running:
            self.replication.peer_gone(life, time.time_ns() // 1000)
            self._schedule_wake()

    def cluster_message(self, life: str, frames: list[Any]) -> bool:
        """A message of the cluster channel for this queue (kind and queue name first).
        False if it is malformed."""
        if not self._running:
            return True
        ok = self.replication.cluster_message(life, frames, self.loop.time(),
                                              time.time_ns() // 1000)
        self._schedule_wake()
        return ok

