"""The client engine: the broker's ZPIPES clients, each running the state machine of machine.py
on its requests, and their replies. No I/O.

A client is known by its routing id. Each command it sends is an event of its state machine;
the rule found for it names the actions below (the table's verbs), carried out in order. A READ
or WRITE that cannot be answered at once waits for its pipe (the pipe table says which ends
may now be answered: ``woken``) or for its timeout; commands that arrive meanwhile queue behind
it (pipelining), within limits. WRITE data waiting or queued is held against the broker-wide
budget (``max_buffered``) with what the pipe table buffers and what the I/O has not sent yet.

The commonest events of a stream (a WRITE its pipe takes at once, a READ answered or set
waiting at once, a waiting READ woken with data) take shortcuts that carry out the table's rules
for them without looking them up, and leave everything else to the table;
tests/unit/test_engine_shortcuts.py holds them to what the table does.

Replies are recorded as actions (actions.py) in the output the server core shares with its
other parts. What concerns other brokers (an end opened or closed, a CLOSE that waits for its
readers' brokers) is handed to the pipe directory (directory.py) and the peer links
(links.py).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from logging import DEBUG as _DEBUG
from typing import TYPE_CHECKING, Any

from zpipes import protocol as p

from .actions import Reply
from .buffers import Buffers
from .clients import Client
from .ends import ClientEnds
from .failures import BROKER_STOPPING, Failure, kind_of
from .machine import IDLE_STATES, Event, State, rule_for
from .pipes import (
    DEFAULT_CAPACITY,
    PipeTable,
    ReadEnd,
    WriteResult,
    shown,
)
from .timers import RequestTimers

if TYPE_CHECKING:
    from .directory import DirectoryMember
    from .links import PeerLinks


@dataclass(frozen=True)
class ServerConfig:
    capacity: int = DEFAULT_CAPACITY  # bytes buffered per reader before writers wait
    client_timeout: float = 60.0  # seconds of silence, with nothing of it held, before expiry
    max_chunk: int = 16 << 20  # the largest chunk a WRITE may carry
    max_buffered: int = 256 << 20  # bytes of pipe data the broker holds for all its clients
    #: bytes of WRITE data the clients of one source (a uid, a host) may hold, waiting or
    #: queued: no one source can take everyone's share
    max_buffered_per_source: int = 128 << 20
    max_clients: int = 10_000
    max_pipelined: int = 64  # commands queued behind a pending one
    max_pipelined_bytes: int = 8 << 20  # WRITE data queued behind a pending one
    animate: bool = False  # log every transition


EVENT_OF: dict[type, Event] = {
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
    Event.CLOSE: Failure("pipe closed by client", "other"),
    Event.SHUTDOWN: BROKER_STOPPING,
    Event.NO_READERS: Failure("no readers", "other"),
}

# Why a writer's end went without a CLOSE, by the event that ended it: its readers fail with
# "writer lost: <this>". Any other event that detaches an end is a command that did not fit
# the client's state.
_END_LOST: dict[Event, str] = {
    Event.EXPIRED: Failure("expired", "other"),
    Event.DISCONNECTED: Failure("disconnected", "other"),
    Event.SHUTDOWN: BROKER_STOPPING,
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

_ENCODED: dict[type, bytes] = {
    cls: p.encode(cls()) for cls in (p.InputOk, p.OutputOk, p.ReadEnd, p.ReadTimeout, p.WriteOk,
                                     p.WriteTimeout, p.CloseOk, p.PingOk, p.Invalid)}

_WRITE_OK = _ENCODED[p.WriteOk]

class Step:
    """The event a client's state machine handles, and what its actions pass on to each
    other in one run of it: the command that came (``msg``), the event that follows
    (``next``), a READ's data for its READ_OK (``data``). One per run, not kept."""

    __slots__ = ("event", "msg", "next", "data")

    def __init__(self) -> None:
        self.event: Event = Event.PING  # (every run sets it before an action reads it)
        self.msg: Any = None
        self.next: Event | None = None
        self.data: list[memoryview] | None = None


Action = Callable[[Client, Step], None]


class ClientEngine:
    """The clients of this broker and their requests. ``links`` and ``directory`` are the
    server core's other parts: the engine tells them of its ends (they never call it)."""

    def __init__(self, config: ServerConfig, log: Any, pipes: PipeTable, out: list[Any],
                 woken: deque[int], end_ids: Iterator[int], links: PeerLinks,
                 directory: DirectoryMember) -> None:
        self.config = config
        self.links, self.directory = links, directory
        #: per-client and per-pipe lines have a budget of lines a second for each kind
        #: (``budget="lines"``: zbroker/logs/budget.py)
        self.log = log
        self.pipes = pipes
        self.out = out  # the server core's output (actions.py)
        self.clients: dict[bytes, Client] = {}
        #: their pipe ends: opened, closed, and what peers are told of them
        self.ends = ClientEnds(log, pipes, woken, end_ids, links, directory)
        self._client_ids = itertools.count(1)
        self.timers = RequestTimers(self.clients)  # requests waiting for their pipes
        self._woken = woken  # ends the pipe table says may now be answered
        self.now = 0.0
        self._next_sweep = 0.0
        #: what the clients' requests hold, against the budget (with what the I/O layer
        #: holds, ``buffers.outside``)
        self.buffers = Buffers(pipes, config.max_buffered, config.max_buffered_per_source)
        #: cumulative counts for metrics (zbroker.metrics reads them at scrape time)
        self.clients_expired = 0  # clients expired (silent for client_timeout)
        self.clients_disconnected = 0  # clients whose connection went (or unreachable)
        self.ends_failed: dict[tuple[str, str], int] = {}  # (role, failure kind) -> count
        self.actions: dict[str, Action] = {
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
        #: each state's rules as the actions' methods and the next state, made as first used
        #: (the table's names looked up once, not at every event)
        self._plans: dict[State, dict[Event, tuple[tuple[Action, ...],
                                                   State]]] = {state: {} for state in State}

    # --- inputs ------------------------------------------------------------------------------

    def receive(self, routing_id: bytes, frames: Sequence[bytes | memoryview],
                now: float) -> None:
        """A message from a client (the frames after the routing id)."""
        msg = p.decode_command(frames)
        if self.shortcuts and self._shortcut(routing_id, msg, now):
            self.wake()
            return
        self._take(routing_id, msg, now)

    def receive_withheld_write(self, routing_id: bytes, size: int, now: float,
                               reason: str | None = None) -> None:
        """A WRITE of ``size`` bytes that the transport let go as it arrived, being over the
        limit (``max_chunk``), or for ``reason`` (it did not fit the budget): it is refused in
        its turn, as if it had arrived whole, and holds nothing meanwhile."""
        # a Withheld stands in for the chunk (the protocol types it bytes): _try_write refuses it
        self._take(routing_id, p.Write(p.Withheld(size, reason), 0), now)  # type: ignore[arg-type]

    def _take(self, routing_id: bytes, msg: Any, now: float) -> None:
        self.now = now
        client = self.clients.get(routing_id)
        if client is None:
            if len(self.clients) >= self.config.max_clients:
                self._refuse(routing_id, msg, "too many clients")
                return
            client = Client(routing_id, next(self._client_ids), now,
                            source=self.buffers.outside.source_of(routing_id))
            self.clients[routing_id] = client
        client.last_seen = now
        if isinstance(msg, p.DecodeError):
            self.log.warning("invalid frame", budget="lines", client=client.id,
                             pipe=shown(client.pipe), error=msg.reason)
        self._execute(client, EVENT_OF[type(msg)], msg)
        self.wake()

    def tick(self, now: float) -> None:
        """Fire what is due at ``now``: request timeouts and client expiry."""
        self.now = now
        while (client := self.timers.pop_due(now)) is not None:
            self._execute(client, Event.TIMEOUT)
        if now >= self._next_sweep:
            self._next_sweep = now + min(1.0, self.config.client_timeout / 4)
            limit = now - self.config.client_timeout
            # a client with a request held by us is waiting for us, not silent
            for client in [c for c in self.clients.values()
                           if c.last_seen <= limit and c.request is None]:
                self.log.info("client expired", budget="lines", client=client.id,
                              pipe=shown(client.pipe), silent_s=round(now - client.last_seen, 3))
                self.clients_expired += 1
                self._execute(client, Event.EXPIRED)
        self.wake()

    def next_deadline(self) -> float:
        """When ``tick`` should next be called (monotonic seconds)."""
        return min(self.timers.next_at(), self._next_sweep)

    def disconnected(self, routing_id: bytes, now: float) -> None:
        """The client's connection is gone (the transport says so): detach its end as lost,
        so that its readers fail, or its writers learn they have no readers."""
        self.now = now
        client = self.clients.get(routing_id)
        if client is not None:
            # a client that had closed its end and then went is the normal case
            log = self.log.info if client.end is not None else self.log.debug
            log("client disconnected", budget="lines", client=client.id,
                pipe=shown(client.pipe), state=str(client.state))
            self.clients_disconnected += 1
            self._execute(client, Event.DISCONNECTED)
            self.wake()

    def unreachable(self, routing_id: bytes, now: float) -> None:
        """A reply to this client could not be delivered: it has gone, or stopped reading its
        replies. Clean up as on a disconnect."""
        self.now = now
        client = self.clients.get(routing_id)
        if client is not None:
            self.log.info("client unreachable", budget="lines", client=client.id,
                          pipe=shown(client.pipe))
            self.clients_disconnected += 1
            self._execute(client, Event.DISCONNECTED)
            self.wake()

    def shutdown(self, now: float) -> None:
        """Answer every pending request (*_FAILED "broker stopping") and detach every end."""
        self.now = now
        for client in list(self.clients.values()):
            self._execute(client, Event.SHUTDOWN)
        self.wake()

    def reconfigure(self, config: ServerConfig) -> None:
        """New limits and timeouts; they apply from the next event on."""
        self.config = config
        self.buffers.max_buffered = config.max_buffered
        self.buffers.per_source = config.max_buffered_per_source
        self._woken.extend(self.pipes.set_capacity(config.capacity))
        self._next_sweep = 0.0
        self.wake()

    def wake(self) -> None:
        """Retry the pending requests of ends that the pipe table says may now be answered
        (their answers are marked ``wakes``: the I/O writes them first); then what it has for
        remote ends goes to the peer links."""
        woken, out = self._woken, self.out
        while woken:
            client = self.ends.client_of(woken.popleft())
            if client is not None and client.state not in IDLE_STATES:
                answered = len(out)
                if not (client.state is State.PROCESSING_READ and self.shortcuts
                        and self._woken_read(client)):
                    self._execute(client, Event.PIPE_CHANGED)
                for i in range(answered, len(out)):  # the answers of a waiting request
                    action = out[i]
                    if type(action) is Reply:
                        action.wakes = True
        if self.pipes.outgoing or self.pipes.credits:
            self.links.send_outgoing()

    # --- what the other parts ask ------------------------------------------------------------

    def answer_awaited(self, client: Client) -> None:
        """Its CLOSE awaits nothing more: answer it (CONFIRMED)."""
        self._confirmed(client)
        self._execute(client, Event.CONFIRMED)

    @property
    def held(self) -> int:
        """Bytes of WRITE data in requests waiting or queued, all clients."""
        return self.buffers.held

    # --- the state machine -------------------------------------------------------------------

    def _execute(self, client: Client, event: Event | None, msg: Any = None) -> None:
        # (what _held_by says, inline: twice per event)
        before = 0 if client.terminated else client.queued_bytes + (
            len(client.request.chunk) if client.request_event is Event.WRITE else 0)
        try:
            self._run(client, event, msg)
        finally:
            if (change := _held_by(client) - before):
                self.buffers.count(client.source, change)

    def _plan(self, state: State, event: Event) -> tuple[tuple[Action, ...],
                                                         State]:
        """The rule for ``event`` in ``state`` (machine.py's), as methods to call in order
        and the next state."""
        rule = rule_for(state, event)
        plan = tuple(self.actions[action] for action in rule.actions), rule.next
        self._plans[state][event] = plan
        return plan

    def _run(self, client: Client, event: Event | None, msg: Any) -> None:
        client.dequeued = False
        plans = self._plans
        step = Step()
        while True:
            while event is not None:
                state = client.state
                plan = plans[state].get(event) or self._plan(state, event)
                if self.config.animate:
                    rule = rule_for(state, event)
                    self.log.info("animate", budget="lines", client=client.id,
                                  pipe=shown(client.pipe), state=str(state), on=str(event),
                                  actions=list(rule.actions), next=str(rule.next))
                step.event, step.msg, step.next = event, msg, None
                reason = _REASONS.get(event)
                if reason is not None:
                    client.reason = reason
                for action in plan[0]:
                    action(client, step)
                client.state = plan[1]
                event, msg = step.next, None
            if client.terminated or client.state not in IDLE_STATES or not client.queue:
                return
            event, msg = client.queue.popleft()  # pipelining: next queued command
            client.dequeued = True
            if event is Event.WRITE:
                client.queued_bytes -= len(msg.chunk)

    # --- the common case, without the table -------------------------------------------------

    #: take the shortcuts below (off: every event goes through the table; the tests compare)
    shortcuts = True

    def _quick(self) -> bool:
        """Whether the shortcuts may be taken now: nothing asks to see each transition."""
        return not self.config.animate and not _logs_debug(self.log)

    def _shortcut(self, routing_id: bytes, msg: Any, now: float) -> bool:
        """Take a client's command by a shortcut if it has one: a READ or WRITE of a client
        that has its pipe open, in the states where it is common. False, having changed
        nothing, when the table is to take it."""
        client = self.clients.get(routing_id)
        if client is None:
            return False
        kind, state = type(msg), client.state
        if kind is p.Write:
            return state is State.WRITING and self._write_at_once(client, msg, now)
        if kind is p.Read:
            if state is State.READING:
                return self._read_at_once(client, msg, now)
            return state is State.PROCESSING_READ and self._queue_read_at_once(client, msg, now)
        return False

    def _write_at_once(self, client: Client, msg: p.Write, now: float) -> bool:
        """A WRITE of an idle writer that its pipe takes at once: the table's rules for it
        (WRITING, WRITE: start request, try write; PROCESSING_WRITE, ACCEPTED: send WRITE_OK,
        finish request) carried out without looking them up. False, having changed nothing,
        when it is anything else (refused, waiting, failing): the table then takes it."""
        chunk: Any = msg.chunk  # (or a Withheld: one let go as it arrived, which is refused)
        if type(chunk) is p.Withheld or not self._quick():
            return False
        size = len(chunk)
        if size > self.config.max_chunk or self.buffers.problem(size, client.source) is not None:
            return False
        # (the pipe table changes nothing unless it accepts: WAIT only records the end as
        # waiting, as the table's own try then does again)
        result, woken = self.pipes.write(client.end, chunk)  # type: ignore[arg-type]
        if result is not WriteResult.ACCEPTED:
            return False
        self._woken.extend(woken)
        self.now = client.last_seen = now
        client.dequeued = False
        client.request_serial += 1
        client.budget_serial = client.request_serial
        self._finish(client)
        self.out.append(Reply(client.routing_id, _WRITE_OK))
        return True

    def _read_at_once(self, client: Client, msg: p.Read, now: float) -> bool:
        """A READ of an idle reader, of at least a byte, started (READING, READ: start
        request, try read) and what follows (``_answer_read``), without looking the rules up.
        False, having changed nothing, when its pipe has ended or failed: the table then
        takes it."""
        if not msg.size or not self._quick():
            return False
        self.now = client.last_seen = now
        return self._start_read(client, msg, False, False)

    def _queue_read_at_once(self, client: Client, msg: p.Read, now: float) -> bool:
        """A READ behind a waiting one (PROCESSING_READ, READ: queue command), queued without
        looking the rule up. False, having changed nothing, past the pipelining limits (the
        table then refuses it)."""
        if (len(client.queue) >= self.config.max_pipelined
                or client.queued_bytes > self.config.max_pipelined_bytes or not self._quick()):
            return False
        self.now = client.last_seen = now
        client.dequeued = False
        client.queue.append((Event.READ, msg))
        return True

    def _start_read(self, client: Client, msg: p.Read, dequeued: bool, woken: bool) -> bool:
        """``msg`` made the reader's active request (start request) and tried (try read, and
        what follows: ``_answer_read``). False, having changed nothing, when its pipe has
        ended or failed."""
        client.dequeued = dequeued  # (a table's run sets it again first: no need to undo it)
        self._begin(client, msg, Event.READ)
        if self._answer_read(client, woken):
            return True
        client.request = client.request_event = client.deadline = None  # (as it was)
        client.request_serial -= 1
        return False

    def _answer_read(self, client: Client, woken: bool) -> bool:
        """A reader's active READ tried (try read), and what follows, without looking the
        rules up: when its pipe has data, READ_OK (HAVE_DATA: send READ_OK, finish request);
        when it has none yet, the READ waits (WAIT: wait for pipe). ``woken``: the READ
        waited, its answer is marked so. False, having changed nothing, when its pipe has
        ended or failed (the table then answers)."""
        result, more = self.pipes.read(client.end, client.request.size)  # type: ignore[arg-type]
        if result is ReadEnd.WAIT:  # (recorded as waiting: the table's try does the same)
            client.state = State.PROCESSING_READ
            self.timers.arm(client)
            return True
        if type(result) is not list:  # END or FAILED: nothing taken
            return False
        self._woken.extend(more)
        client.state = State.READING
        self.out.append(Reply(client.routing_id, p.encode_read_ok(result), woken))
        self._finish(client)
        return True

    def _next_reads(self, client: Client) -> None:
        """The commands queued behind a READ that was answered after it waited, taken in
        order (pipelining): READs of at least a byte without looking the rules up, until one
        waits; from the first other command on, by the table."""
        queue = client.queue
        while queue and client.state is State.READING:
            event, msg = queue[0]
            if event is Event.READ and msg.size:
                queue.popleft()
                if self._start_read(client, msg, True, True):
                    continue
                queue.appendleft((event, msg))  # (as it was: the table takes it)
            self._execute(client, None)
            return

    def _woken_read(self, client: Client) -> bool:
        """A waiting READ its pipe may now answer (PROCESSING_READ, PIPE_CHANGED: try read),
        without looking the rules up; False, having changed nothing, when the table is to
        take it."""
        if not self._quick():
            return False
        client.dequeued = False  # (as the table's run sets it first)
        if not self._answer_read(client, True):
            return False
        if client.queue and client.state is State.READING:
            self._next_reads(client)
        return True

    # --- actions -----------------------------------------------------------------------------

    def _open_pipe_reader(self, client: Client, step: Step) -> None:
        self._open(client, step, "reader")

    def _open_pipe_writer(self, client: Client, step: Step) -> None:
        self._open(client, step, "writer")

    def _open(self, client: Client, step: Step, role: str) -> None:
        problem = self.ends.open(client, role, bytes(step.msg.pipename))
        if problem:
            client.reason = problem
            step.next = Event.ERROR
        else:
            step.next = Event.OK

    def _cut_pipe_end(self, client: Client, step: Step) -> None:
        self._close_pipe_end(client, step, "closed with a WRITE pending")

    def _close_pipe_end(self, client: Client, step: Step, cut: str | None = None) -> None:
        if client.end is None:
            return
        lost = cut or (None if step.event is Event.CLOSE
                       else _END_LOST.get(step.event, "invalid command"))
        self.ends.close(client, step.event, lost, cut=cut is not None)

    def _start_request(self, client: Client, step: Step) -> None:
        msg = step.msg
        self._begin(client, msg, step.event)
        if _logs_debug(self.log):  # once per request: its fields cost more than the call
            size = msg.size if step.event is Event.READ else len(msg.chunk)
            self.log.debug("request", client=client.id, pipe=shown(client.pipe),
                           command=str(step.event), size=size, timeout_ms=msg.timeout,
                           queued=len(client.queue))

    def _try_read(self, client: Client, step: Step) -> None:
        size = client.request.size
        if size == 0:  # like read(2) with a count of 0
            step.data, step.next = [], Event.HAVE_DATA
            return
        # reading: the client's end is open (the same below and in _try_write)
        result, woken = self.pipes.read(client.end, size)  # type: ignore[arg-type]
        self._woken.extend(woken)
        if result is ReadEnd.WAIT:
            step.next = Event.WAIT
        elif result is ReadEnd.END:
            step.next = Event.END_OF_PIPE
        elif result is ReadEnd.FAILED:
            client.reason = self.pipes.failure(client.end) or "failed"  # type: ignore[arg-type]
            step.next = Event.FAILED
        else:
            step.data, step.next = result, Event.HAVE_DATA

    def _try_write(self, client: Client, step: Step) -> None:
        chunk = client.request.chunk
        problem: str | None
        if type(chunk) is p.Withheld:  # let go as it arrived: refused, whatever the limit now
            problem = chunk.reason or self._over_max_chunk(chunk.size)
        else:
            problem = self._write_problem(client, len(chunk))
        if problem:
            client.reason = problem
            self._break_stream(client, problem)
            step.next = Event.FAILED
            return
        result, woken = self.pipes.write(client.end, chunk)  # type: ignore[arg-type]
        self._woken.extend(woken)
        if result is WriteResult.FAILED:
            client.reason = self.pipes.failure(client.end) or "failed"  # type: ignore[arg-type]
        step.next = _WRITE_EVENT[result]

    def _write_problem(self, client: Client, size: int) -> str | None:
        """Why a WRITE of ``size`` bytes cannot be taken (the first time it is tried), or None.
        A WRITE is checked against the broker-wide budget when it arrives: what it holds is
        counted from then on."""
        if size > self.config.max_chunk:
            return self._over_max_chunk(size)
        if client.request_serial != client.budget_serial:  # its first try
            client.budget_serial = client.request_serial
            if not client.dequeued:  # (queued: admitted then)
                return self.buffers.problem(size, client.source)
        return None

    def _over_max_chunk(self, size: int) -> str:
        return Failure(f"chunk of {size} bytes is over the broker's limit of "
                       f"{self.config.max_chunk} bytes (max_chunk)", "chunk_too_large")

    def _break_stream(self, client: Client, reason: str) -> None:
        """A chunk of the client's stream was refused: its stream is cut for its readers."""
        self.log.warning("write refused", budget="lines", client=client.id,
                         pipe=shown(client.pipe), reason=reason)
        if client.end is not None and client.state in (State.WRITING, State.PROCESSING_WRITE):
            self._woken.extend(self.pipes.break_writer(client.end, reason))

    def _wait_for_pipe(self, client: Client, step: Step) -> None:
        self.timers.arm(client)

    def _begin(self, client: Client, msg: Any, event: Event) -> None:
        """``msg`` (a READ or WRITE) becomes the client's active request (start request; the
        shortcuts' too)."""
        client.request, client.request_event = msg, event
        client.request_serial += 1
        client.deadline = self.now + msg.timeout / 1000 if msg.timeout else None
        client.timer_armed = False

    def _finish_request(self, client: Client, step: Step) -> None:
        self._finish(client)

    def _finish(self, client: Client) -> None:
        """The client's active request is answered (finish request; the shortcuts' too)."""
        client.request = client.request_event = client.deadline = None
        client.timer_armed = False
        client.last_seen = self.now  # its silence counts from our answer

    def _send_read_ok(self, client: Client, step: Step) -> None:
        # HAVE_DATA: _try_read has put the data in the step
        self.out.append(Reply(client.routing_id,
                              p.encode_read_ok(step.data)))  # type: ignore[arg-type]

    def _reply(self, cls: type) -> Action:
        frame = _ENCODED[cls]

        def send(client: Client, step: Step) -> None:
            self.out.append(Reply(client.routing_id, frame))

        return send

    def _await_confirmation(self, client: Client, step: Step) -> None:
        """The CLOSE is answered (CONFIRMED) now, unless its end is awaited elsewhere."""
        if not client.awaiting:
            step.next = Event.CONFIRMED

    def _stop_awaiting(self, client: Client, step: Step) -> None:
        """The client goes before its readers' brokers confirmed its end: if it is to be
        answered, it learns that its end may not have arrived."""
        if client.awaiting and client.close_failure is None:
            client.close_failure = client.reason or "closed before its end was confirmed"
        self._confirmed(client)

    def _confirmed(self, client: Client) -> None:
        """Nothing more is awaited for the client's CLOSE."""
        if client.closing_end is not None:
            self.links.stop_awaiting(client.closing_end)
        client.closing_end, client.awaiting = None, set()

    def _answer_close(self, client: Client, step: Step) -> None:
        """CLOSE_OK, or CLOSE_FAILED for a writer whose stream broke after its last WRITE was
        taken (the broker of a reader of it was lost): its data may not all have arrived,
        and no end-of-stream did."""
        if client.close_failure is None:
            self.out.append(Reply(client.routing_id, _ENCODED[p.CloseOk]))
            return
        reason, client.close_failure = client.close_failure, None
        self.out.append(Reply(client.routing_id,
                              p.encode(p.CloseFailed(p.reason_text(reason)))))

    def _reply_failed(self, cls: Callable[[str], Any],
                      role: str | None = None) -> Action:
        """The action sending ``cls`` with the client's reason; ``role``: a READ_FAILED or
        WRITE_FAILED, counted as a failed end of that role (the first of each end: a client
        with pipelined READs gets one answer each)."""
        def send(client: Client, step: Step) -> None:
            self.out.append(Reply(client.routing_id,
                                  p.encode(cls(p.reason_text(client.reason)))))

        if role is None:
            return send

        def send_counted(client: Client, step: Step) -> None:
            if client.failed_end != client.end or client.end is None:
                client.failed_end = client.end
                key = (role, kind_of(client.reason))
                self.ends_failed[key] = self.ends_failed.get(key, 0) + 1
            send(client, step)

        return send_counted

    def _queue_command(self, client: Client, step: Step) -> None:
        event, msg = step.event, step.msg
        size = len(msg.chunk) if event is Event.WRITE else 0
        problem = None
        if (len(client.queue) >= self.config.max_pipelined
                or client.queued_bytes + size > self.config.max_pipelined_bytes):
            self.log.warning("pipelining limit", budget="lines", client=client.id,
                             pipe=shown(client.pipe), queued=len(client.queue),
                             queued_bytes=client.queued_bytes)
            problem = "too many pipelined requests"
        elif size:
            problem = self.buffers.problem(size, client.source)
        if problem:
            self._fail_command(client.routing_id, event, problem)
            if event is Event.WRITE:  # the stream has lost that chunk
                self._break_stream(client, problem)
            return
        client.queue.append((event, msg))
        client.queued_bytes += size

    def _fail_queued_commands(self, client: Client, step: Step) -> None:
        while client.queue:
            event, _ = client.queue.popleft()
            self._fail_command(client.routing_id, event, client.reason)
        client.queued_bytes = 0

    def _fail_command(self, routing_id: bytes, event: Event, reason: str) -> None:
        """The one reply to a command that will not be carried out: its *_FAILED, or INVALID
        for commands that have none."""
        reply = _FAILED_REPLY.get(event)
        frame = _ENCODED[p.Invalid] if reply is None else p.encode(reply(p.reason_text(reason)))
        self.out.append(Reply(routing_id, frame))

    def _terminate(self, client: Client, step: Step) -> None:
        client.terminated = True
        self.clients.pop(client.routing_id, None)

    def _refuse(self, routing_id: bytes, msg: Any, reason: str) -> None:
        """Answer a command from a client we will not take on."""
        event = EVENT_OF[type(msg)]
        if event is Event.PING:
            self.out.append(Reply(routing_id, _ENCODED[p.PingOk]))
        else:
            self._fail_command(routing_id, event, reason)


def _held_by(client: Client) -> int:
    """Bytes of WRITE data the client's waiting and queued requests hold."""
    if client.terminated:
        return 0
    active = len(client.request.chunk) if client.request_event is Event.WRITE else 0
    return active + client.queued_bytes


def _logs_debug(log: Any) -> bool:
    """Whether ``log`` writes debug lines. Asked at each use: the broker's level can change
    while it runs. A logger that cannot tell is given every line."""
    enabled = getattr(log, "is_enabled_for", None)
    return enabled is None or enabled(_DEBUG)
