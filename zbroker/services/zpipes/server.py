"""The ZPIPES server core: clients, their state machines and the pipe table. No I/O.

The caller (the broker's ZPIPES service) feeds it what arrives and what time it is::

    server.receive(routing_id, frames, now)   # a message from a client
    server.tick(now)                          # at server.next_deadline(): timeouts, expiry
    server.disconnected(routing_id, now)      # the client's connection is gone
    server.unreachable(routing_id, now)       # a reply could not be delivered
    server.shutdown(now)                      # the broker is stopping

and sends what collects in ``server.outbox``: ``(routing_id, frame)`` pairs, in order.

Each client runs the table of machine.py; the actions below are the table's verbs.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from logging import DEBUG as _DEBUG
from typing import Any

from zpipes import protocol as p

from . import peering
from .directory import OPPOSITE, SELF, Directory, home_of, score
from .machine import IDLE_STATES, Event, State, rule_for
from .pipes import DEFAULT_CAPACITY, PEER_LOST, WRITER_LOST, PipeTable, ReadEnd, WriteResult


@dataclass(frozen=True)
class ServerConfig:
    capacity: int = DEFAULT_CAPACITY  # bytes buffered per reader before writers wait
    client_timeout: float = 60.0  # seconds of silence, with nothing of it held, before expiry
    max_chunk: int = 16 << 20  # the largest chunk a WRITE may carry
    max_buffered: int = 256 << 20  # bytes of pipe data the broker holds for all its clients
    max_clients: int = 10_000
    max_pipelined: int = 64  # commands queued behind a pending one
    max_pipelined_bytes: int = 8 << 20  # WRITE data queued behind a pending one
    animate: bool = False  # log every transition


_EVENT_OF: dict[type, Event] = {
    p.Input: Event.INPUT,
    p.Output: Event.OUTPUT,
    p.Read: Event.READ,
    p.Write: Event.WRITE,
    p.Close: Event.CLOSE,
    p.Ping: Event.PING,
    p.DecodeError: Event.MALFORMED,
}

# Why a pending or queued request fails, by the event that made it fail.
_REASONS: dict[Event, str] = {
    Event.CLOSE: "pipe closed by client",
    Event.SHUTDOWN: "broker stopping",
    Event.NO_READERS: "no readers",
}

# Why a writer's end went without a CLOSE, by the event that ended it: its readers fail with
# "writer lost: <this>". Any other event that detaches an end is a command that did not fit
# the client's state.
_END_LOST: dict[Event, str] = {
    Event.EXPIRED: "expired",
    Event.DISCONNECTED: "disconnected",
    Event.SHUTDOWN: "broker stopping",
}

_WRITE_EVENT = {
    WriteResult.ACCEPTED: Event.ACCEPTED,
    WriteResult.WAIT: Event.WAIT,
    WriteResult.NO_READERS: Event.NO_READERS,
    WriteResult.FAILED: Event.FAILED,
}

_FAILED_REPLY: dict[Event, Callable[[str], Any]] = {
    Event.INPUT: p.InputFailed,
    Event.OUTPUT: p.OutputFailed,
    Event.READ: p.ReadFailed,
    Event.WRITE: p.WriteFailed,
}

# Both only need to span the time an introduction takes to arrive (a round trip or so), and are
# kept only while a peer speaks the directory (only those introduce).
MAX_TOMBS = 16384  # remote ends detached, remembered against late introductions of them
MAX_GONE = 16384  # our own ends closed, remembered to answer late introductions of them
#: chunks smaller than this go to peers as they are, not in their WRITE frame: the reader's
#: broker copies a READ_OK that small into ZeroMQ's message anyway
FRAMED_MIN = 1 << 16
#: A remote reader's window (bytes in flight to it) is sized to its link: twice the round trip
#: to its broker at LINK_RATE, at least the capacity and at most MAX_WINDOW, which bounds what
#: a reader that does not read costs its broker. So a stream may reach twice LINK_RATE on links
#: of 2 to 32 ms, and on a LAN (a round trip under 2 ms) the window is the capacity: larger
#: ones were measured to cost the reader's broker CPU there (data going cold between hops)
#: and to gain nothing.
LINK_RATE = 256 << 20  # bytes a second
MAX_WINDOW = 16 << 20
#: the round trip taken is the least of the last few reported: a heartbeat's echo also waits
#: for both brokers' event loops, which a busy host delays by milliseconds (measured here: 0.4
#: to 5 ms over one veth link), while the least is close to the link's own
RTT_SAMPLES = 16
MAX_WAITING = 10_000  # introductions to brokers we do not have as peers yet, kept a while
INTRO_WAIT = 30.0  # seconds such an introduction is kept
_UNKNOWN = "gone"  # what a late introduction of one of our writers we forgot is answered

_ENCODED = {cls: p.encode(cls()) for cls in (p.InputOk, p.OutputOk, p.ReadEnd, p.ReadTimeout,
                                             p.WriteOk, p.WriteTimeout, p.CloseOk, p.PingOk,
                                             p.Invalid)}


@dataclass(eq=False)
class Client:
    routing_id: bytes
    id: int  # a short number for logs
    last_seen: float
    state: State = State.START
    end: int | None = None  # id of the pipe end this client has open
    pipe: bytes | None = None
    queue: deque[tuple[Event, Any]] = field(default_factory=deque)
    queued_bytes: int = 0
    request: Any = None  # the active READ or WRITE
    request_event: Event | None = None
    request_serial: int = 0
    budget_serial: int = -1  # the request last checked against the broker-wide budget
    dequeued: bool = False  # the command being handled came from the client's queue
    deadline: float | None = None  # when the active request times out
    timer_armed: bool = False
    # the event being handled and what the actions pass along
    event: Event | None = None
    msg: Any = None
    reason: str = ""
    next_event: Event | None = None
    read_data: list[memoryview] | None = None
    terminated: bool = False
    failed_end: int | None = None  # the end whose failure was counted (once per end)
    #: why the stream of the writer end it just closed broke (its CLOSE answers CLOSE_FAILED)
    close_failure: str | None = None
    #: the writer end it closed, while its CLOSE waits for ``awaiting``: the peers (lives)
    #: with readers of its stream that are to confirm they have its end
    closing_end: int | None = None
    awaiting: set[str] = field(default_factory=set)


class ZpipesServer:
    def __init__(self, config: ServerConfig | None = None, log: Any = None) -> None:
        self.config = config or ServerConfig()
        self.log = log if log is not None else _NullLog()
        self.pipes = PipeTable(self.config.capacity)
        self.clients: dict[bytes, Client] = {}
        self.outbox: list[tuple[bytes, bytes]] = []
        self._by_end: dict[int, Client] = {}
        self._client_ids = itertools.count(1)
        self._end_ids = itertools.count(1)
        self._timers: list[tuple[float, int, bytes]] = []  # (deadline, request serial, client)
        self._woken: deque[int] = deque()
        self._now = 0.0
        self._next_sweep = 0.0
        self.peers: set[str] = set()
        self.peer_outbox: list[tuple[str, list[bytes | memoryview]]] = []
        self.held = 0  # bytes of WRITE data in requests waiting or queued, all clients
        #: bytes answered to clients that have not taken them yet (their connections are
        #: backed up): the I/O layer's count, asked for when a WRITE meets the budget
        self.unsent_bytes: Callable[[], int] = lambda: 0
        #: bytes of messages still arriving from clients (the I/O layer's count): budgeted too
        self.incoming_bytes: Callable[[], int] = lambda: 0
        self._proxies: dict[tuple[str, int], int] = {}  # (peer, its end) -> our stand-in end
        #: cumulative counts for metrics (zbroker.metrics reads them at scrape time)
        self.clients_expired = 0  # clients expired (silent for client_timeout)
        self.clients_disconnected = 0  # clients whose connection went (or unreachable)
        self.closed_bytes_written = 0  # bytes written by local writers whose end is gone
        self.closed_bytes_read = 0  # bytes read by local readers whose end is gone
        self.ends_failed: dict[tuple[str, str], int] = {}  # (role, failure_kind) -> count
        self._proxy_of: dict[int, tuple[str, int]] = {}
        self._fanout: set[str] = set()  # peers that take a DATA or CREDIT for several readers
        self._write_frames: set[str] = set()  # peers that take a chunk in its WRITE frame
        self._confirming: set[str] = set()  # peers that answer CONFIRM (and number messages)
        self._closing: dict[int, Client] = {}  # writer end closed -> its client, awaiting
        self._windows: dict[str, int] = {}  # peer -> window of its readers, if sized to its link
        self._rtts: dict[str, deque[float]] = {}  # peer -> the round trips last reported
        #: what crossed the links to and from peer brokers (for status and metrics): DATA
        #: messages and the bytes of their chunks, CREDIT messages
        self.data_sent = self.data_bytes_sent = self.credit_sent = 0
        self.data_received = self.data_bytes_received = 0
        # the pipe directory (directory.py): peers that speak it, and what we hold
        self.member_id = ""  # this broker's id among the members (set by set_member)
        self.directory = Directory()  # the ends registered with us as their pipes' home
        self._members: dict[str, str] = {}  # member id -> life, of peers speaking the directory
        self._member_of: dict[str, str] = {}  # life -> member id
        self._legacy: set[str] = set()  # lives of peers that do not: told of every end
        self._registered: dict[int, tuple[str, str, bytes]] = {}  # end -> (home, role, pipe)
        self._homes: dict[bytes, tuple[int, str]] = {}  # pipe of our ends -> (score, home)
        self._known_at: dict[int, set[str]] = {}  # our end -> lives introduced to it
        self._gone: OrderedDict[int, str | None] = OrderedDict()  # our ends closed -> failure
        # remote ends detached: (life, end) -> (was attached here, failure)
        self._tombs: OrderedDict[tuple[str, int], tuple[bool, str | None]] = OrderedDict()
        # introductions naming a broker we do not have yet: member -> [(until, group)]
        self._waiting: OrderedDict[str, list[tuple[float, peering.Group]]] = OrderedDict()
        self._waiting_count = 0
        # our ends whose home is to say REGISTERED: end -> pipe (held: pipes.hold)
        self._awaiting: dict[int, bytes] = {}
        self._actions: dict[str, Callable[[Client], None]] = {
            "open pipe reader": self._open_pipe_reader,
            "open pipe writer": self._open_pipe_writer,
            "send INPUT_OK": self._reply(p.InputOk),
            "send INPUT_FAILED": self._reply_failed(p.InputFailed),
            "send OUTPUT_OK": self._reply(p.OutputOk),
            "send OUTPUT_FAILED": self._reply_failed(p.OutputFailed),
            "start request": self._start_request,
            "try read": self._try_read,
            "try write": self._try_write,
            "wait for pipe": self._wait_for_pipe,
            "finish request": self._finish_request,
            "send READ_OK": self._send_read_ok,
            "send READ_END": self._reply(p.ReadEnd),
            "send READ_TIMEOUT": self._reply(p.ReadTimeout),
            "send READ_FAILED": self._reply_failed(p.ReadFailed, "reader"),
            "send WRITE_OK": self._reply(p.WriteOk),
            "send WRITE_TIMEOUT": self._reply(p.WriteTimeout),
            "send WRITE_FAILED": self._reply_failed(p.WriteFailed, "writer"),
            "answer CLOSE": self._answer_close,
            "await confirmation": self._await_confirmation,
            "stop awaiting": self._stop_awaiting,
            "send PING_OK": self._reply(p.PingOk),
            "send INVALID": self._reply(p.Invalid),
            "queue command": self._queue_command,
            "fail queued commands": self._fail_queued_commands,
            "close pipe end": self._close_pipe_end,
            "cut pipe end": self._cut_pipe_end,
            "terminate": self._terminate,
        }

    # --- inputs ------------------------------------------------------------------------------

    def receive(self, routing_id: bytes, frames: Sequence[bytes | memoryview], now: float) -> None:
        """A message from a client (the frames after the routing id)."""
        self._take(routing_id, p.decode_command(frames), now)

    def receive_withheld_write(self, routing_id: bytes, size: int, now: float,
                               reason: str | None = None) -> None:
        """A WRITE of ``size`` bytes that the transport let go as it arrived, being over the
        limit (``max_chunk``), or for ``reason`` (it did not fit the budget): it is refused in
        its turn, as if it had arrived whole, and holds nothing meanwhile."""
        self._take(routing_id, p.Write(p.Withheld(size, reason), 0), now)

    def _take(self, routing_id: bytes, msg: Any, now: float) -> None:
        self._now = now
        client = self.clients.get(routing_id)
        if client is None:
            if len(self.clients) >= self.config.max_clients:
                self._refuse(routing_id, msg, "too many clients")
                return
            client = Client(routing_id, next(self._client_ids), now)
            self.clients[routing_id] = client
        client.last_seen = now
        if isinstance(msg, p.DecodeError):
            self.log.warning("invalid frame", client=client.id, pipe=_name(client.pipe),
                             error=msg.reason)
        self._execute(client, _EVENT_OF[type(msg)], msg)
        self._wake()

    def tick(self, now: float) -> None:
        """Fire what is due at ``now``: request timeouts and client expiry."""
        self._now = now
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, serial, routing_id = heapq.heappop(timers)
            client = self.clients.get(routing_id)
            if client is not None and client.request_serial == serial and client.request:
                client.timer_armed = False
                self._execute(client, Event.TIMEOUT)
        if now >= self._next_sweep:
            self._next_sweep = now + min(1.0, self.config.client_timeout / 4)
            limit = now - self.config.client_timeout
            # a client with a request held by us is waiting for us, not silent
            for client in [c for c in self.clients.values()
                           if c.last_seen <= limit and c.request is None]:
                self.log.info("client expired", client=client.id, pipe=_name(client.pipe),
                              silent_s=round(now - client.last_seen, 3))
                self.clients_expired += 1
                self._execute(client, Event.EXPIRED)
        self._wake()

    def next_deadline(self) -> float:
        """When ``tick`` should next be called (monotonic seconds)."""
        if self._timers:
            return min(self._timers[0][0], self._next_sweep)
        return self._next_sweep

    def disconnected(self, routing_id: bytes, now: float) -> None:
        """The client's connection is gone (the transport says so): detach its end as lost,
        so that its readers fail, or its writers learn they have no readers."""
        self._now = now
        client = self.clients.get(routing_id)
        if client is not None:
            # a client that had closed its end and then went is the normal case
            log = self.log.info if client.end is not None else self.log.debug
            log("client disconnected", client=client.id, pipe=_name(client.pipe),
                state=str(client.state))
            self.clients_disconnected += 1
            self._execute(client, Event.DISCONNECTED)
            self._wake()

    def unreachable(self, routing_id: bytes, now: float) -> None:
        """A reply to this client could not be delivered: it has gone, or stopped reading its
        replies. Clean up as on a disconnect."""
        self._now = now
        client = self.clients.get(routing_id)
        if client is not None:
            self.log.info("client unreachable", client=client.id, pipe=_name(client.pipe))
            self.clients_disconnected += 1
            self._execute(client, Event.DISCONNECTED)
            self._wake()

    def shutdown(self, now: float) -> None:
        """Answer every pending request (*_FAILED "broker stopping") and detach every end."""
        self._now = now
        for client in list(self.clients.values()):
            self._execute(client, Event.SHUTDOWN)
        self._wake()

    # --- the engine --------------------------------------------------------------------------

    def _execute(self, client: Client, event: Event, msg: Any = None) -> None:
        before = _held_by(client)
        try:
            self._run(client, event, msg)
        finally:
            self.held += _held_by(client) - before

    def _run(self, client: Client, event: Event, msg: Any) -> None:
        client.dequeued = False
        while True:
            while event is not None:
                rule = rule_for(client.state, event)
                if self.config.animate:
                    self.log.info("animate", client=client.id, pipe=_name(client.pipe),
                                  state=str(client.state), on=str(event),
                                  actions=list(rule.actions), next=str(rule.next))
                client.event, client.msg, client.next_event = event, msg, None
                if event in _REASONS:
                    client.reason = _REASONS[event]
                for action in rule.actions:
                    self._actions[action](client)
                client.state = rule.next
                event, msg = client.next_event, None
            if client.terminated or client.state not in IDLE_STATES or not client.queue:
                return
            event, msg = client.queue.popleft()  # pipelining: next queued command
            client.dequeued = True
            if event is Event.WRITE:
                client.queued_bytes -= len(msg.chunk)

    def _wake(self) -> None:
        """Retry the pending requests of ends that the pipe table says may now be answered."""
        woken = self._woken
        while woken:
            client = self._by_end.get(woken.popleft())
            if client is not None and client.state not in IDLE_STATES:
                self._execute(client, Event.PIPE_CHANGED)
        if self.pipes.outgoing or self.pipes.credits:
            self._to_peers()

    # --- actions -----------------------------------------------------------------------------

    def _open_pipe_reader(self, client: Client) -> None:
        self._open(client, "reader", self.pipes.attach_reader)

    def _open_pipe_writer(self, client: Client) -> None:
        self._open(client, "writer", self.pipes.attach_writer)

    def _open(self, client: Client, role: str, attach: Callable[[bytes, int], set[int]]) -> None:
        name = bytes(client.msg.pipename)
        problem = pipe_name_problem(name)
        if problem:
            client.reason = problem
            client.next_event = Event.ERROR
            self.log.info("pipe open refused", client=client.id, pipe=_name(name), role=role,
                          reason=problem)
            return
        end = next(self._end_ids)
        self._woken.extend(attach(name, end))
        client.end, client.pipe = end, name
        self._by_end[end] = client
        client.next_event = Event.OK
        self._announce(role, end, name)
        pipe = self.pipes.pipes[name]
        self.log.info("pipe opened", client=client.id, pipe=_name(name), role=role,
                      readers=len(pipe.readers), writers=len(pipe.writers))

    def _cut_pipe_end(self, client: Client) -> None:
        self._close_pipe_end(client, "closed with a WRITE pending")

    def _close_pipe_end(self, client: Client, cut: str | None = None) -> None:
        end = client.end
        if end is None:
            return
        pipe = self.pipes.pipe_of(end)
        if pipe is not None and end in pipe.readers:
            r = pipe.readers[end]
            role, sizes = "reader", {"bytes_read": r.bytes_out, "bytes_discarded": r.queued}
            self.closed_bytes_read += r.bytes_out
        else:
            role, sizes = "writer", {"bytes_written": self.pipes.writer(end).bytes_in}
            self.closed_bytes_written += sizes["bytes_written"]
        lost = cut or (None if client.event is Event.CLOSE
                       else _END_LOST.get(client.event, "invalid command"))
        # the other brokers' readers of a writer's stream learn that it broke; a reader's loss
        # only shrinks its writers' audience, wherever they are
        failure = (lost or self.pipes.writer(end).failure) if role == "writer" else None
        if failure is not None and client.event is Event.CLOSE and not cut \
                and client.failed_end != end:  # (a WRITE_FAILED told it already)
            client.close_failure = failure  # its stream never reached its end: say so
        told = self._told_of(end)
        confirming = (self._readers_brokers(end) & self._confirming
                      if role == "writer" and failure is None else set())
        self._woken.extend(self.pipes.detach(end, lost))
        del self._by_end[end]
        frames = peering.encode(peering.Detach(end, failure))
        for peer in told:
            self.peer_outbox.append((peer, frames))
        if confirming:  # its CLOSE waits until the brokers of its readers have its end
            confirm = peering.encode(peering.Confirm(end))
            for peer in confirming:
                self.peer_outbox.append((peer, confirm))
            client.closing_end, client.awaiting = end, confirming
            self._closing[end] = client
        self._unregister(end, failure)
        self.log.info("pipe closed", client=client.id, pipe=_name(client.pipe), role=role,
                      why=str(client.event), pipe_gone=client.pipe not in self.pipes.pipes,
                      **({"lost": lost} if lost else {}), **sizes)
        client.end = client.pipe = None

    def _start_request(self, client: Client) -> None:
        msg = client.msg
        client.request, client.request_event = msg, client.event
        client.request_serial += 1
        client.deadline = self._now + msg.timeout / 1000 if msg.timeout else None
        client.timer_armed = False
        if _logs_debug(self.log):  # once per request: its fields cost more than the call
            size = msg.size if client.event is Event.READ else len(msg.chunk)
            self.log.debug("request", client=client.id, pipe=_name(client.pipe),
                           command=str(client.event), size=size, timeout_ms=msg.timeout,
                           queued=len(client.queue))

    def _try_read(self, client: Client) -> None:
        size = client.request.size
        if size == 0:  # like read(2) with a count of 0
            client.read_data, client.next_event = [], Event.HAVE_DATA
            return
        result, woken = self.pipes.read(client.end, size)
        self._woken.extend(woken)
        if result is ReadEnd.WAIT:
            client.next_event = Event.WAIT
        elif result is ReadEnd.END:
            client.next_event = Event.END_OF_PIPE
        elif result is ReadEnd.FAILED:
            client.reason = self.pipes.failure(client.end) or "failed"
            client.next_event = Event.FAILED
        else:
            client.read_data, client.next_event = result, Event.HAVE_DATA

    def _try_write(self, client: Client) -> None:
        chunk = client.request.chunk
        if type(chunk) is p.Withheld:  # let go as it arrived: refused, whatever the limit now
            problem = chunk.reason or self._over_max_chunk(chunk.size)
        else:
            problem = self._write_problem(client, len(chunk))
        if problem:
            client.reason = problem
            self._break_stream(client, problem)
            client.next_event = Event.FAILED
            return
        result, woken = self.pipes.write(client.end, chunk)
        self._woken.extend(woken)
        if result is WriteResult.FAILED:
            client.reason = self.pipes.failure(client.end) or "failed"
        client.next_event = _WRITE_EVENT[result]

    def _write_problem(self, client: Client, size: int) -> str | None:
        """Why a WRITE of ``size`` bytes cannot be taken (the first time it is tried), or None.
        A WRITE is checked against the broker-wide budget when it arrives: what it holds is
        counted from then on."""
        if size > self.config.max_chunk:
            return self._over_max_chunk(size)
        if client.request_serial != client.budget_serial:  # its first try
            client.budget_serial = client.request_serial
            if not client.dequeued and self._over_budget(size):  # (queued: admitted then)
                return self._budget_reason()
        return None

    def _over_max_chunk(self, size: int) -> str:
        return (f"chunk of {size} bytes is over the broker's limit of "
                f"{self.config.max_chunk} bytes (max_chunk)")

    def _over_budget(self, size: int) -> bool:
        return (self.held + self.pipes.buffered + self.unsent_bytes() + self.incoming_bytes()
                + size > self.config.max_buffered)

    def budget_problem(self, size: int) -> str | None:
        """Why ``size`` more bytes of a client's cannot be held (the broker-wide budget,
        ``max_buffered``), or None."""
        return self._budget_reason() if self._over_budget(size) else None

    def _budget_reason(self) -> str:
        return (f"the broker's buffers for all clients are full (clients.max_buffered, "
                f"{self.config.max_buffered} bytes)")

    def _break_stream(self, client: Client, reason: str) -> None:
        """A chunk of the client's stream was refused: its stream is cut for its readers."""
        self.log.warning("write refused", client=client.id, pipe=_name(client.pipe),
                         reason=reason)
        if client.end is not None and client.state in (State.WRITING, State.PROCESSING_WRITE):
            self._woken.extend(self.pipes.break_writer(client.end, reason))

    def _wait_for_pipe(self, client: Client) -> None:
        if client.deadline is not None and not client.timer_armed:
            client.timer_armed = True
            heapq.heappush(self._timers,
                           (client.deadline, client.request_serial, client.routing_id))
            if len(self._timers) > 1024 + 4 * len(self.clients):
                self._compact_timers()

    def _compact_timers(self) -> None:
        """Drop the timers of requests answered before their timeout, so that the heap stays
        in proportion to the clients, whatever the request rate."""
        live = []
        for entry in self._timers:
            client = self.clients.get(entry[2])
            if client is not None and client.timer_armed and client.request_serial == entry[1]:
                live.append(entry)
        heapq.heapify(live)
        self._timers = live

    def _finish_request(self, client: Client) -> None:
        client.request = client.request_event = client.deadline = client.read_data = None
        client.timer_armed = False
        client.last_seen = self._now  # its silence counts from our answer

    def _send_read_ok(self, client: Client) -> None:
        self.outbox.append((client.routing_id, p.encode_read_ok(client.read_data)))

    def _reply(self, cls: type) -> Callable[[Client], None]:
        frame = _ENCODED[cls]

        def send(client: Client) -> None:
            self.outbox.append((client.routing_id, frame))

        return send

    def _readers_brokers(self, end: int) -> set[str]:
        """The peers with readers of writer ``end``'s stream (its audience; before the
        stream started, every remote reader of its pipe)."""
        pipe = self.pipes.pipe_of(end)
        if pipe is None:
            return set()
        writer = self.pipes.writer(end)
        readers = writer.audience if writer.started else pipe.readers.keys()
        return {self._proxy_of[r][0] for r in readers if r in self._proxy_of}

    def _await_confirmation(self, client: Client) -> None:
        """The CLOSE is answered (CONFIRMED) now, unless its end is awaited elsewhere."""
        if not client.awaiting:
            client.next_event = Event.CONFIRMED

    def _stop_awaiting(self, client: Client) -> None:
        """The client goes before its readers' brokers confirmed its end: if it is to be
        answered, it learns that its end may not have arrived."""
        if client.awaiting and client.close_failure is None:
            client.close_failure = client.reason or "closed before its end was confirmed"
        self._confirmed(client)

    def _confirmed(self, client: Client) -> None:
        """Nothing more is awaited for the client's CLOSE."""
        if client.closing_end is not None:
            self._closing.pop(client.closing_end, None)
        client.closing_end, client.awaiting = None, set()

    def _answer_awaited(self, client: Client) -> None:
        """Its CLOSE awaits nothing more: answer it (CONFIRMED)."""
        self._confirmed(client)
        self._execute(client, Event.CONFIRMED)

    def _answer_close(self, client: Client) -> None:
        """CLOSE_OK, or CLOSE_FAILED for a writer whose stream broke after its last WRITE was
        taken (the broker of a reader of it was lost): its data may not all have arrived,
        and no end-of-stream did."""
        if client.close_failure is None:
            self.outbox.append((client.routing_id, _ENCODED[p.CloseOk]))
            return
        reason, client.close_failure = client.close_failure, None
        self.outbox.append((client.routing_id, p.encode(p.CloseFailed(p.reason_text(reason)))))

    def _reply_failed(self, cls: Callable[[str], Any],
                      role: str | None = None) -> Callable[[Client], None]:
        """The action sending ``cls`` with the client's reason; ``role``: a READ_FAILED or
        WRITE_FAILED, counted as a failed end of that role (the first of each end: a client
        with pipelined READs gets one answer each)."""
        def send(client: Client) -> None:
            self.outbox.append((client.routing_id, p.encode(cls(p.reason_text(client.reason)))))

        def send_counted(client: Client) -> None:
            if client.failed_end != client.end or client.end is None:
                client.failed_end = client.end
                key = (role, failure_kind(client.reason))
                self.ends_failed[key] = self.ends_failed.get(key, 0) + 1
            send(client)

        return send if role is None else send_counted

    def _queue_command(self, client: Client) -> None:
        event, msg = client.event, client.msg
        size = len(msg.chunk) if event is Event.WRITE else 0
        problem = None
        if (len(client.queue) >= self.config.max_pipelined
                or client.queued_bytes + size > self.config.max_pipelined_bytes):
            self.log.warning("pipelining limit", client=client.id, pipe=_name(client.pipe),
                             queued=len(client.queue), queued_bytes=client.queued_bytes)
            problem = "too many pipelined requests"
        elif size and self._over_budget(size):
            problem = self._budget_reason()
        if problem:
            self._fail_command(client.routing_id, event, problem)
            if event is Event.WRITE:  # the stream has lost that chunk
                self._break_stream(client, problem)
            return
        client.queue.append((event, msg))
        client.queued_bytes += size

    def _fail_queued_commands(self, client: Client) -> None:
        while client.queue:
            event, _ = client.queue.popleft()
            self._fail_command(client.routing_id, event, client.reason)
        client.queued_bytes = 0

    def _fail_command(self, routing_id: bytes, event: Event, reason: str) -> None:
        """The one reply to a command that will not be carried out: its *_FAILED, or INVALID
        for commands that have none."""
        reply = _FAILED_REPLY.get(event)
        frame = _ENCODED[p.Invalid] if reply is None else p.encode(reply(p.reason_text(reason)))
        self.outbox.append((routing_id, frame))

    def _terminate(self, client: Client) -> None:
        client.terminated = True
        self.clients.pop(client.routing_id, None)

    def _refuse(self, routing_id: bytes, msg: Any, reason: str) -> None:
        """Answer a command from a client we will not take on."""
        event = _EVENT_OF[type(msg)]
        if event is Event.PING:
            self.outbox.append((routing_id, _ENCODED[p.PingOk]))
        else:
            self._fail_command(routing_id, event, reason)

    # --- peer brokers --------------------------------------------------------------------------

    def set_member(self, member_id: str) -> None:
        """This broker's id among the members (its cluster start id): the hash that picks
        pipes' homes takes it. Set before the first peer comes."""
        if member_id == self.member_id:
            return
        old, self.member_id = self.member_id, member_id
        self._homes.clear()
        for end, (home, role, pipe) in list(self._registered.items()):
            if home == old:
                self._registered[end] = (member_id, role, pipe)

    def peer_up(self, peer: str, now: float, member: str = "",
                directory: bool = False, fanout: bool = False,
                write_frames: bool = False, confirm: bool = False) -> None:
        """A peer broker joined (a new life of it: ``peer`` names one session). ``member``:
        its id among the members (the same for all of them); ``directory``: it speaks the
        pipe directory; ``fanout``: it takes a DATA (and a CREDIT) for several readers;
        ``write_frames``: a DATA whose chunk is in its WRITE frame; ``confirm``: it answers
        CONFIRM, and its link numbers messages (what came before a CONFIRMED did arrive).
        Then our ends whose home it now is register with it; otherwise it is told of every end
        we have, so pipes opened before it came find their other ends."""
        self._now = now
        self.peers.add(peer)
        if fanout:
            self._fanout.add(peer)
        if write_frames:
            self._write_frames.add(peer)
        if confirm:
            self._confirming.add(peer)
        if directory and member and member != self.member_id:
            self._members[member] = peer
            self._member_of[peer] = member
            self._rehome(joined=member)
            waiting = self._waiting.pop(member, [])
            self._waiting_count -= len(waiting)
            self._introduced([g for until, g in waiting if until >= now])
        else:
            self._legacy.add(peer)
            for role, name, end in self.pipes.local_ends():
                self.peer_outbox.append((peer, peering.encode(peering.Attach(role, end, name))))
        self._wake()

    def peer_rtt(self, peer: str, rtt: float) -> None:
        """A round trip to ``peer`` (its heartbeat's, measured while the link was idle): the
        windows of its readers are sized to the least of the last RTT_SAMPLES."""
        if peer not in self.peers:
            return
        rtts = self._rtts.setdefault(peer, deque(maxlen=RTT_SAMPLES))
        rtts.append(rtt)
        window = min(MAX_WINDOW, (int(2 * min(rtts) * LINK_RATE) | 0xFFFF) + 1)  # (by 64 KiB)
        if self._windows.get(peer, 0) == window:
            return
        self._windows[peer] = window
        for (owner, _), proxy in self._proxies.items():
            if owner == peer:
                self._woken.extend(self.pipes.set_window(proxy, window))
        self._wake()

    def peer_down(self, peer: str, now: float) -> None:
        """A peer broker was lost: the streams that ran through it break (*_FAILED "peer
        lost"), never end quietly. What it had registered with us is forgotten, and our ends
        whose home it was register with their new home: no pipe of other brokers fails."""
        self._now = now
        self.peers.discard(peer)
        lost = [(key, proxy) for key, proxy in self._proxies.items() if key[0] == peer]
        for key, proxy in lost:
            del self._proxies[key]
            del self._proxy_of[proxy]
            self._woken.extend(self.pipes.detach(proxy, PEER_LOST))
        if lost:
            self.log.warning("peer lost: its pipe ends are detached", peer=peer, ends=len(lost))
        self._legacy.discard(peer)
        self._fanout.discard(peer)
        self._write_frames.discard(peer)
        self._confirming.discard(peer)
        self._windows.pop(peer, None)
        self._rtts.pop(peer, None)
        member = self._member_of.pop(peer, None)
        if member is not None:
            if self._members.get(member) == peer:
                del self._members[member]
            self.directory.drop_owner(peer)
            self._rehome(lost=member)
        # (last: a CLOSE answered takes the client's queued commands, which must find the
        # peer gone everywhere)
        for client in [c for c in self._closing.values() if peer in c.awaiting]:
            # its stream's end may not have arrived there: its CLOSE says so
            client.close_failure = client.close_failure or PEER_LOST
            self._answer_awaited(client)
        self._wake()

    def peer_receive(self, peer: str, frames: Sequence[bytes | memoryview], now: float) -> None:
        """A ZPIPES peer message from ``peer``."""
        self._now = now
        if peer not in self.peers:
            return  # late traffic of a peer already declared lost
        msg = peering.decode(frames)
        if isinstance(msg, peering.Data):
            self.data_received += 1
            self.data_bytes_received += len(msg.chunk)
            key = (peer, msg.writer_end)
            proxy = self._proxies.get(key)
            if proxy is None and peer in self._member_of and key not in self._tombs:
                proxy = self._adopt_writer(peer, msg.writer_end, msg.reader_ends)
            if proxy is not None:
                for reader_end in msg.reader_ends:  # (fan-out: one chunk shared by them all)
                    self._woken.extend(self.pipes.deliver(proxy, reader_end, msg.first,
                                                          msg.chunk))
        elif isinstance(msg, peering.Credit):
            for reader_end, size in msg.credits:
                proxy = self._proxies.get((peer, reader_end))
                if proxy is not None:
                    self._woken.extend(self.pipes.credit(proxy, size))
        elif isinstance(msg, peering.Attach):
            if not pipe_name_problem(msg.pipe):
                self._attach_remote(peer, msg.role, msg.end, msg.pipe, legacy=True)
        elif isinstance(msg, peering.Detach):
            self._detach_remote(peer, msg.end, msg.lost)
        elif isinstance(msg, peering.Confirm):  # what came before it is here: say so
            self.peer_outbox.append((peer, peering.encode(peering.Confirmed(msg.end))))
        elif isinstance(msg, peering.Confirmed):
            client = self._closing.get(msg.end)
            if client is not None and peer in client.awaiting:
                client.awaiting.discard(peer)
                if not client.awaiting:
                    self._answer_awaited(client)
        elif isinstance(msg, (peering.Register, peering.Registered, peering.Unregister,
                              peering.Introduce)):
            if peer not in self._member_of:
                self.log.warning("invalid peer message", peer=peer,
                                 error="a directory message from a peer that did not say it "
                                       "speaks the directory")
            elif isinstance(msg, peering.Register):
                self._home_register(peer, [e for e in msg.entries
                                           if not pipe_name_problem(e[2])])
            elif isinstance(msg, peering.Unregister):
                for end in msg.ends:
                    self.directory.unregister(peer, end)
            elif isinstance(msg, peering.Registered):
                member = self._member_of[peer]
                for end in msg.ends:
                    if end in self._awaiting and self._registered[end][0] == member:
                        self._woken.extend(self.pipes.release(self._awaiting.pop(end)))
            else:
                self._introduced(msg.groups)
        else:
            self.log.warning("invalid peer message", peer=peer, error=msg.reason)
        self._wake()

    def _attach_remote(self, peer: str, role: str, end: int, pipe: bytes,
                       legacy: bool = False) -> int | None:
        """A proxy for ``peer``'s ``end`` (idempotent); None if it was not made: an end whose
        DETACH came here (before or after its attachment) is not brought back by a late
        introduction."""
        key = (peer, end)
        proxy = self._proxies.get(key)
        if proxy is not None:
            return proxy
        if not legacy and key in self._tombs:
            return None
        proxy = next(self._end_ids)
        self._proxies[key] = proxy
        self._proxy_of[proxy] = key
        attach = self.pipes.attach_reader if role == "reader" else self.pipes.attach_writer
        self._woken.extend(attach(pipe, proxy, remote=True))
        if role == "reader" and peer in self._windows:
            self.pipes.set_window(proxy, self._windows[peer])
        self.log.info("remote end attached", peer=peer, pipe=_name(pipe), role=role,
                      remote_end=end)
        return proxy

    def _detach_remote(self, peer: str, end: int, lost: str | None) -> None:
        key = (peer, end)
        proxy = self._proxies.pop(key, None)
        if peer in self._member_of:
            self._tombs[key] = (proxy is not None, lost)
            self._tombs.move_to_end(key)
            if len(self._tombs) > MAX_TOMBS:
                self._tombs.popitem(last=False)
        if proxy is not None:
            pipe = self.pipes.pipe_of(proxy)
            del self._proxy_of[proxy]
            self._woken.extend(self.pipes.detach(proxy, lost))
            self.log.info("remote end detached", peer=peer, pipe=_name(pipe.name),
                          remote_end=end, **({"lost": lost} if lost else {}))

    def _adopt_writer(self, peer: str, writer_end: int,
                      reader_ends: Sequence[int]) -> int | None:
        """DATA of a writer we were not introduced to yet (the home's INTRODUCE to us is
        slower than the writer's broker's DATA): the writer is on our readers' pipe."""
        for reader_end in reader_ends:
            pipe = self.pipes.pipe_of(reader_end)
            reader = pipe.readers.get(reader_end) if pipe is not None else None
            if reader is not None and not reader.remote:
                return self._attach_remote(peer, "writer", writer_end, pipe.name)
        return None

    # --- the pipe directory ------------------------------------------------------------------

    def _announce(self, role: str, end: int, name: bytes) -> None:
        """A local end was opened: peers without the directory are told, and the end registers
        with its pipe's home."""
        if self._legacy:
            frames = peering.encode(peering.Attach(role, end, name))
            for peer in self._legacy:
                self.peer_outbox.append((peer, frames))
        home = self._home(name)
        self._registered[end] = (home, role, name)
        if home == self.member_id:
            self._home_register(SELF, [(role, end, name, False)])
            return
        # A writer's audience is the readers attached when its stream starts. With a reader
        # here, the stream of a writer here could start before the home has introduced the
        # readers elsewhere that registered before it: the home is asked to say when it has,
        # and no writer of the pipe here starts until then.
        pipe = self.pipes.pipes[name]
        answer = (any(not r.remote for r in pipe.readers.values())
                  and any(not w.remote and not w.started for w in pipe.writers.values()))
        if answer:
            self._awaiting[end] = name
            self.pipes.hold(name)
        self.peer_outbox.append((self._members[home], peering.encode(
            peering.Register(((role, end, name, answer),)))))

    def _home(self, name: bytes) -> str:
        cached = self._homes.get(name)
        if cached is None:
            cached = self._homes[name] = home_of(name, [self.member_id, *self._members])
        return cached[1]

    def _told_of(self, end: int) -> list[str]:
        """The peers that may hold a proxy of our ``end``: those without the directory, those
        introduced to it, and those whose ends of its pipe we hold (its stream may have gone
        to them before their introduction reached us)."""
        told = dict.fromkeys(self._legacy)
        told.update(dict.fromkeys(self._known_at.pop(end, ())))
        pipe = self.pipes.pipe_of(end)
        if pipe is not None and self._member_of:
            for other in (*pipe.readers.values(), *pipe.writers.values()):
                if other.remote:
                    told[self._proxy_of[other.end][0]] = None
        return [peer for peer in told if peer in self.peers]

    def _unregister(self, end: int, failure: str | None) -> None:
        """Our ``end`` is closed: its home forgets it; its failure is kept a while, to answer
        an introduction of it that was on its way."""
        if self._members:
            self._gone[end] = failure
            if len(self._gone) > MAX_GONE:
                self._gone.popitem(last=False)
        if end in self._awaiting:
            self._woken.extend(self.pipes.release(self._awaiting.pop(end)))
        home, _, name = self._registered.pop(end, ("", "", b""))
        if home == self.member_id:
            self.directory.unregister(SELF, end)
        elif home in self._members:
            self.peer_outbox.append((self._members[home],
                                     peering.encode(peering.Unregister((end,)))))
        if name and not any(self._registered.get(e, ("", "", b""))[2] == name
                            for e in self._ends_of(name)):
            self._homes.pop(name, None)

    def _ends_of(self, name: bytes) -> list[int]:
        pipe = self.pipes.pipes.get(name)
        if pipe is None:
            return []
        return [e for e, x in (*pipe.readers.items(), *pipe.writers.items()) if not x.remote]

    def _rehome(self, joined: str | None = None, lost: str | None = None) -> None:
        """The members changed: our ends whose pipe's home moved register with the new home
        (and leave the old one, if it is still a member). Rendezvous hashing moves only the
        pipes the newcomer wins, or those of the member lost."""
        members = [self.member_id, *self._members]
        by_pipe: dict[bytes, list[int]] = {}
        for end, (_, _, name) in self._registered.items():
            by_pipe.setdefault(name, []).append(end)
        register: dict[str, list[tuple[str, int, bytes, bool]]] = {}
        unregister: dict[str, list[int]] = {}
        homes: dict[bytes, tuple[int, str]] = {}
        for name, ends in by_pipe.items():
            cached = self._homes.get(name)
            if cached is None or (lost is not None and cached[1] == lost):
                new = home_of(name, members)
            elif joined is not None:
                new = max(cached, (score(joined, name), joined))
            else:
                new = cached
            homes[name] = new
            for end in ends:
                old, role, _ = self._registered[end]
                if old == new[1]:
                    continue
                self._registered[end] = (new[1], role, name)
                if old == self.member_id:
                    self.directory.unregister(SELF, end)
                elif old in self._members:
                    unregister.setdefault(old, []).append(end)
                register.setdefault(new[1], []).append((role, end, name,
                                                        end in self._awaiting))
        self._homes = homes
        for member, ends in unregister.items():
            for i in range(0, len(ends), peering.MAX_BATCH):
                self.peer_outbox.append((self._members[member], peering.encode(
                    peering.Unregister(tuple(ends[i:i + peering.MAX_BATCH])))))
        for member, entries in register.items():
            if member == self.member_id:
                self._home_register(SELF, entries)
                for _, end, _, answer in entries:
                    if answer:
                        self._woken.extend(self.pipes.release(self._awaiting.pop(end)))
                continue
            for i in range(0, len(entries), peering.MAX_BATCH):
                self.peer_outbox.append((self._members[member], peering.encode(
                    peering.Register(tuple(entries[i:i + peering.MAX_BATCH])))))

    def _home_register(self, owner: str,
                       entries: Sequence[tuple[str, int, bytes, bool]]) -> None:
        """Ends registered with us as their home (``owner``: the life of their broker, or
        SELF): each is introduced to the ends of other brokers it matches, and they to it, in
        one INTRODUCE per broker; then REGISTERED to the owner for those that ask it."""
        owner_member = self.member_id if owner == SELF else self._member_of[owner]
        # recipient -> (pipe, member, role of theirs) -> (theirs, yours)
        intros: dict[str, dict[tuple[bytes, str, str], tuple[list, list]]] = {}
        refused = 0
        answered = [end for _, end, _, answer in entries if answer]
        for role, end, name, _ in entries:
            matches = self.directory.register(owner, role, end, name)
            if matches is None:
                refused += 1
                continue
            for m in matches:
                member = self.member_id if m.owner == SELF else self._member_of.get(m.owner)
                if member is None:
                    continue
                theirs, yours = intros.setdefault(owner, {}).setdefault(
                    (name, member, m.role), ([], []))
                theirs.append((m.role, m.end))
                yours.append(end)
                theirs, yours = intros.setdefault(m.owner, {}).setdefault(
                    (name, owner_member, role), ([], []))
                theirs.append((role, end))
                yours.append(m.end)
        if len(entries) == 1 and not refused:
            role, end, name, _ = entries[0]
            self.log.info("pipe end registered", pipe=_name(name), role=role, end=end,
                          peer=owner or "self", met=len(intros) - (owner in intros))
        elif entries:
            self.log.info("pipe ends registered", ends=len(entries) - refused,
                          peer=owner or "self")
        if refused:
            self.log.warning("directory entries refused", peer=owner or "self", ends=refused,
                             limit=self.directory.max_per_owner)
        for recipient, found in intros.items():
            groups = [peering.Group(name, member, tuple(dict.fromkeys(theirs)),
                                    tuple(dict.fromkeys(yours)))
                      for (name, member, _), (theirs, yours) in found.items()]
            if recipient == SELF:
                self._introduced(groups)
                continue
            for i in range(0, len(groups), peering.MAX_BATCH):
                self.peer_outbox.append((recipient, peering.encode(
                    peering.Introduce(tuple(groups[i:i + peering.MAX_BATCH])))))
        if answered and owner != SELF:  # after its introductions, on the same link
            self.peer_outbox.append((owner, peering.encode(peering.Registered(tuple(answered)))))

    def _introduced(self, groups: Sequence[peering.Group]) -> None:
        """A home says: these ends of another broker match these of ours."""
        for group in groups:
            if group.member == self.member_id or not group.theirs \
                    or pipe_name_problem(group.pipe):
                continue
            peer = self._members.get(group.member)
            if peer is None:  # not (yet) a peer of ours: kept until it is, a while
                self._wait_for(group)
            else:
                self._meet(peer, group)

    def _meet(self, peer: str, group: peering.Group) -> None:
        """Attach ``peer``'s ends of the group; our ends of it that have gone are detached on
        its side (it was told of them at the same time as we of its ends)."""
        alive = []
        mine = OPPOSITE[group.theirs[0][0]]
        for end in group.yours:
            client = self._by_end.get(end)
            if client is not None and client.pipe == group.pipe:
                alive.append(end)
                continue
            failure = self._gone.get(end, _UNKNOWN) if mine == "writer" else None
            self.peer_outbox.append((peer, peering.encode(peering.Detach(end, failure))))
        if not alive:
            return
        for end in alive:
            self._known_at.setdefault(end, set()).add(peer)
        for role, end in group.theirs:
            tomb = self._tombs.get((peer, end))
            if tomb is None:
                self._attach_remote(peer, role, end, group.pipe)
            elif not tomb[0] and role == "writer" and tomb[1] is None:
                # it closed before its introduction reached us: the readers it was matched
                # with saw it close (and it sent them nothing, or it would be attached)
                self._woken.extend(self.pipes.saw_close(alive))

    def _wait_for(self, group: peering.Group) -> None:
        waiting = self._waiting.setdefault(group.member, [])
        waiting.append((self._now + INTRO_WAIT, group))
        self._waiting_count += 1
        while self._waiting_count > MAX_WAITING:
            _, dropped = self._waiting.popitem(last=False)
            self._waiting_count -= len(dropped)

    def _to_peers(self) -> None:
        """Turn what the pipe table has for remote ends into peer messages: each chunk goes
        once to each broker of its remote readers (fan-out), or, to a broker of before, once
        per reader there; the credits for one broker go in one CREDIT likewise."""
        outbox, proxy_of, fanout = self.peer_outbox, self._proxy_of, self._fanout
        framed = self._write_frames
        for writer_end, first, chunk, proxies in self.pipes.take_outgoing():
            # a chunk that is a whole WRITE frame's goes in that frame, to peers that take it:
            # they can then answer a READ with it as it is (no copy there)
            frame = p.write_frame_of(chunk) if framed and len(chunk) >= FRAMED_MIN else None
            if len(proxies) == 1:  # the common case: one remote reader
                owner = proxy_of.get(proxies[0])
                if owner is None:
                    continue
                outbox.append((owner[0], peering.encode(peering.Data(
                    writer_end, (owner[1],), first, chunk,
                    frame if owner[0] in framed else None))))
                self.data_sent += 1
                self.data_bytes_sent += len(chunk)
                continue
            by_peer: dict[str, list[int]] = {}
            for proxy in proxies:
                owner = proxy_of.get(proxy)
                if owner is not None:
                    by_peer.setdefault(owner[0], []).append(owner[1])
            for peer, ends in by_peer.items():
                step = peering.MAX_BATCH if peer in fanout else 1
                for i in range(0, len(ends), step):
                    outbox.append((peer, peering.encode(peering.Data(
                        writer_end, tuple(ends[i:i + step]), first, chunk,
                        frame if peer in framed else None))))
                    self.data_sent += 1
                    self.data_bytes_sent += len(chunk)
        credits: dict[str, list[tuple[int, int]]] = {}
        for (proxy, reader_end), size in self.pipes.take_credits().items():
            owner = proxy_of.get(proxy)
            if owner is not None:
                credits.setdefault(owner[0], []).append((reader_end, size))
        for peer, pairs in credits.items():
            step = peering.MAX_BATCH if peer in fanout else 1
            for i in range(0, len(pairs), step):
                outbox.append((peer, peering.encode(peering.Credit(tuple(pairs[i:i + step])))))
                self.credit_sent += 1

    def reconfigure(self, config: ServerConfig) -> None:
        """New limits and timeouts; they apply from the next event on."""
        self.config = config
        self._woken.extend(self.pipes.set_capacity(config.capacity))
        self._next_sweep = 0.0
        self._wake()

    # --- questions ---------------------------------------------------------------------------

    def link_counts(self) -> dict[str, int]:
        """What crossed the links to peer brokers: DATA messages and their chunks' bytes,
        CREDIT messages."""
        return {"data_sent": self.data_sent, "data_bytes_sent": self.data_bytes_sent,
                "credit_sent": self.credit_sent, "data_received": self.data_received,
                "data_bytes_received": self.data_bytes_received}

    def status(self) -> dict[str, Any]:
        return {
            "clients": len(self.clients),
            # the windows of the readers of each peer whose round trip is known (bytes in
            # flight to one reader: at least the capacity)
            "link": {**self.link_counts(),
                     "windows": {peer: max(window, self.config.capacity)
                                 for peer, window in self._windows.items()}},
            "pipes": {
                _name(name): {
                    "readers": len(pipe.readers), "writers": len(pipe.writers),
                    "remote_ends": sum(1 for e in (*pipe.readers.values(),
                                                   *pipe.writers.values()) if e.remote),
                    "buffered": sum(r.queued for r in pipe.readers.values() if not r.remote),
                    "bytes_written": sum(w.bytes_in for w in pipe.writers.values()),
                    "bytes_read": sum(r.bytes_out for r in pipe.readers.values()),
                }
                for name, pipe in self.pipes.pipes.items()
            },
        }


    def metrics(self) -> dict[str, Any]:
        """Totals for metrics, as plain data: counts of this broker's own clients' ends
        (remote ends stand in for other brokers' clients, which those count)."""
        readers = writers = 0
        written, read = self.closed_bytes_written, self.closed_bytes_read
        buffered = 0
        for pipe in self.pipes.pipes.values():
            for r in pipe.readers.values():
                if not r.remote:
                    readers += 1
                    read += r.bytes_out
                    buffered += r.queued
            for w in pipe.writers.values():
                if not w.remote:
                    writers += 1
                    written += w.bytes_in
        return {"clients": len(self.clients), "pipes": len(self.pipes.pipes),
                "readers": readers, "writers": writers, "buffered_bytes": buffered,
                "held_bytes": self.held, "bytes_written": written, "bytes_read": read,
                "clients_expired": self.clients_expired,
                "clients_disconnected": self.clients_disconnected,
                "link": self.link_counts(),
                "ends_failed": [(role, kind, n) for (role, kind), n in self.ends_failed.items()]}


#: what ``failure_kind`` can return: the bounded label set of failed ends
FAILURE_KINDS = ("writer_lost", "peer_lost", "broker_stopping", "chunk_too_large",
                 "buffers_full", "other")


def failure_kind(reason: str) -> str:
    """A failed end's reason, as one of FAILURE_KINDS."""
    if reason.endswith(PEER_LOST):  # also a reader's "writer lost: peer lost"
        return "peer_lost"
    if reason.startswith(WRITER_LOST):
        return "writer_lost"
    if reason == "broker stopping":
        return "broker_stopping"
    if "(max_chunk)" in reason:
        return "chunk_too_large"
    if "(clients.max_buffered" in reason:
        return "buffers_full"
    return "other"


def _held_by(client: Client) -> int:
    """Bytes of WRITE data the client's waiting and queued requests hold."""
    if client.terminated:
        return 0
    active = len(client.request.chunk) if client.request_event is Event.WRITE else 0
    return active + client.queued_bytes


def pipe_name_problem(name: bytes) -> str | None:
    """Why ``name`` cannot name a pipe, or None if it can (1..255 bytes of UTF-8)."""
    if not name:
        return "pipe name is empty"
    if len(name) > p.MAX_STRING:
        return "pipe name is longer than 255 bytes"
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return "pipe name is not valid UTF-8"
    return None


def _logs_debug(log: Any) -> bool:
    """Whether ``log`` writes debug lines. Asked at each use: the broker's level can change
    while it runs. A logger that cannot tell is given every line."""
    enabled = getattr(log, "is_enabled_for", None)
    return enabled is None or enabled(_DEBUG)


def _name(name: bytes | None) -> str | None:
    return None if name is None else name.decode("utf-8", errors="backslashreplace")


class _NullLog:
    def _drop(self, *args: Any, **kwargs: Any) -> None:
        pass

    def is_enabled_for(self, level: int) -> bool:
        return False

    debug = info = warning = error = _drop
