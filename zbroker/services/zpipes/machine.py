"""The per-client server state machine of ZPIPES, as a table.

Read it top to bottom: for each state, each event names the actions to run, in order, and the
state to go to. Actions are carried out by the server (server.py); an action may raise a
follow-up event (``ok``/``error`` after an open, ``done``/``wait`` after a try), which is then
looked up in the *next* state, as in the original zproto model.

Rules that hold everywhere:

* While a READ or WRITE is pending, every further command but CLOSE and PING is queued and
  taken in order once the pending one is answered (pipelining). CLOSE and PING act at once.
* A queued READ or WRITE's timeout runs from the moment it becomes the active request.
* Every command not listed for a state has one defined answer, ``UNEXPECTED[state]``: INVALID,
  and any pipe end the client had is detached (no dangling readers or writers). An internal
  event not listed (a timer or wake-up that no longer applies) changes nothing. Nothing asserts.
* Every command gets exactly one reply. CLOSE's is CLOSE_OK, or CLOSE_FAILED for a writer
  whose stream broke without its client being told (the broker of a reader of it was lost
  after its last WRITE_OK): the state after it is the same.
* A writer's CLOSE is answered once its stream's end is where its readers are: at once for
  readers of this broker; for readers of other brokers that confirm (peering.py, CONFIRM),
  once each of their brokers said it has the end (CLOSING; commands meanwhile queue as
  behind a pending request). A broker lost before it said so fails the CLOSE.
* A client is expired only while the broker holds nothing of it (the "processing" states and
  CLOSING have no EXPIRED: a client waiting for our answer is not silent). A client whose
  connection is gone (DISCONNECTED) gets no reply: its end is detached as lost, so the other
  ends learn the truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class State(StrEnum):
    START = "start"
    BEFORE_READING = "before reading"
    READING = "reading"
    PROCESSING_READ = "processing read"
    BEFORE_WRITING = "before writing"
    WRITING = "writing"
    PROCESSING_WRITE = "processing write"
    CLOSING = "closing"  # a writer's end closed: its CLOSE waits for its readers' brokers


class Event(StrEnum):
    # commands from the client
    INPUT = "INPUT"
    OUTPUT = "OUTPUT"
    READ = "READ"
    WRITE = "WRITE"
    CLOSE = "CLOSE"
    PING = "PING"
    MALFORMED = "malformed"  # a frame that did not decode
    # raised by actions and by the server
    OK = "ok"
    ERROR = "error"
    HAVE_DATA = "have data"  # a READ can be answered with data
    END_OF_PIPE = "end of pipe"  # a READ finds the pipe drained and its writers gone
    ACCEPTED = "accepted"  # a WRITE's chunk was taken by the pipe
    NO_READERS = "no readers"  # a WRITE's readers have all gone (like EPIPE)
    FAILED = "failed"  # the stream broke (e.g. a peer broker it ran through was lost)
    WAIT = "wait"  # the active request cannot be answered yet
    PIPE_CHANGED = "pipe changed"  # the pipe may now answer the active request
    TIMEOUT = "timeout"  # the active request's timeout passed
    CONFIRMED = "confirmed"  # a closed writer's readers' brokers have its end (or one was lost)
    EXPIRED = "expired"  # the client was silent for too long, with nothing of it held
    DISCONNECTED = "disconnected"  # its connection is gone (or its replies cannot be delivered)
    SHUTDOWN = "shutdown"  # the broker is stopping


COMMANDS = frozenset(
    {Event.INPUT, Event.OUTPUT, Event.READ, Event.WRITE, Event.CLOSE, Event.PING, Event.MALFORMED}
)
IDLE_STATES = frozenset({State.START, State.READING, State.WRITING})


@dataclass(frozen=True, slots=True)
class Rule:
    actions: tuple[str, ...]
    next: State


def _r(next_state: State, *actions: str) -> Rule:
    return Rule(actions, next_state)


S, E = State, Event

TABLE: dict[State, dict[Event, Rule]] = {
    S.START: {
        E.INPUT: _r(S.BEFORE_READING, "open pipe reader"),
        E.OUTPUT: _r(S.BEFORE_WRITING, "open pipe writer"),
        E.PING: _r(S.START, "send PING_OK"),
        E.EXPIRED: _r(S.START, "terminate"),
        E.DISCONNECTED: _r(S.START, "terminate"),
        E.SHUTDOWN: _r(S.START, "terminate"),
    },
    S.BEFORE_READING: {
        E.OK: _r(S.READING, "send INPUT_OK"),
        E.ERROR: _r(S.START, "send INPUT_FAILED"),
    },
    S.READING: {
        E.READ: _r(S.PROCESSING_READ, "start request", "try read"),
        E.PING: _r(S.READING, "send PING_OK"),
        E.CLOSE: _r(S.START, "close pipe end", "answer CLOSE"),
        E.EXPIRED: _r(S.START, "close pipe end", "terminate"),
        E.DISCONNECTED: _r(S.START, "close pipe end", "terminate"),
        E.SHUTDOWN: _r(S.START, "close pipe end", "terminate"),
    },
    S.PROCESSING_READ: {
        E.HAVE_DATA: _r(S.READING, "send READ_OK", "finish request"),
        E.END_OF_PIPE: _r(S.READING, "send READ_END", "finish request"),
        E.FAILED: _r(S.READING, "send READ_FAILED", "finish request"),
        E.WAIT: _r(S.PROCESSING_READ, "wait for pipe"),
        E.PIPE_CHANGED: _r(S.PROCESSING_READ, "try read"),
        E.TIMEOUT: _r(S.READING, "send READ_TIMEOUT", "finish request"),
        E.READ: _r(S.PROCESSING_READ, "queue command"),
        E.WRITE: _r(S.PROCESSING_READ, "queue command"),
        E.INPUT: _r(S.PROCESSING_READ, "queue command"),
        E.OUTPUT: _r(S.PROCESSING_READ, "queue command"),
        E.MALFORMED: _r(S.PROCESSING_READ, "queue command"),
        E.PING: _r(S.PROCESSING_READ, "send PING_OK"),
        E.CLOSE: _r(
            S.START, "send READ_FAILED", "finish request", "fail queued commands",
            "close pipe end", "answer CLOSE",
        ),
        E.DISCONNECTED: _r(S.START, "close pipe end", "terminate"),
        E.SHUTDOWN: _r(
            S.START, "send READ_FAILED", "fail queued commands", "close pipe end", "terminate",
        ),
    },
    S.BEFORE_WRITING: {
        E.OK: _r(S.WRITING, "send OUTPUT_OK"),
        E.ERROR: _r(S.START, "send OUTPUT_FAILED"),
    },
    S.WRITING: {
        E.WRITE: _r(S.PROCESSING_WRITE, "start request", "try write"),
        E.PING: _r(S.WRITING, "send PING_OK"),
        E.CLOSE: _r(S.CLOSING, "close pipe end", "await confirmation"),
        E.EXPIRED: _r(S.START, "close pipe end", "terminate"),
        E.DISCONNECTED: _r(S.START, "close pipe end", "terminate"),
        E.SHUTDOWN: _r(S.START, "close pipe end", "terminate"),
    },
    S.PROCESSING_WRITE: {
        E.ACCEPTED: _r(S.WRITING, "send WRITE_OK", "finish request"),
        E.NO_READERS: _r(S.WRITING, "send WRITE_FAILED", "finish request"),
        E.FAILED: _r(S.WRITING, "send WRITE_FAILED", "finish request"),
        E.WAIT: _r(S.PROCESSING_WRITE, "wait for pipe"),
        E.PIPE_CHANGED: _r(S.PROCESSING_WRITE, "try write"),
        E.TIMEOUT: _r(S.WRITING, "send WRITE_TIMEOUT", "finish request"),
        E.READ: _r(S.PROCESSING_WRITE, "queue command"),
        E.WRITE: _r(S.PROCESSING_WRITE, "queue command"),
        E.INPUT: _r(S.PROCESSING_WRITE, "queue command"),
        E.OUTPUT: _r(S.PROCESSING_WRITE, "queue command"),
        E.MALFORMED: _r(S.PROCESSING_WRITE, "queue command"),
        E.PING: _r(S.PROCESSING_WRITE, "send PING_OK"),
        E.CLOSE: _r(  # the WRITEs it drops were part of its stream: the stream is cut
            S.START, "send WRITE_FAILED", "finish request", "fail queued commands",
            "cut pipe end", "answer CLOSE",
        ),
        E.DISCONNECTED: _r(S.START, "close pipe end", "terminate"),
        E.SHUTDOWN: _r(
            S.START, "send WRITE_FAILED", "fail queued commands", "close pipe end", "terminate",
        ),
    },
    S.CLOSING: {
        E.CONFIRMED: _r(S.START, "answer CLOSE"),
        E.READ: _r(S.CLOSING, "queue command"),
        E.WRITE: _r(S.CLOSING, "queue command"),
        E.INPUT: _r(S.CLOSING, "queue command"),
        E.OUTPUT: _r(S.CLOSING, "queue command"),
        E.MALFORMED: _r(S.CLOSING, "queue command"),
        E.CLOSE: _r(S.CLOSING, "queue command"),
        E.PING: _r(S.CLOSING, "send PING_OK"),
        E.DISCONNECTED: _r(S.START, "stop awaiting", "terminate"),
        E.SHUTDOWN: _r(S.START, "stop awaiting", "answer CLOSE", "fail queued commands",
                       "terminate"),
    },
}

# The one answer to every command the table does not list for a state. The "processing" states
# and CLOSING list every command (they queue them), and commands are never taken in the
# "before" states.
UNEXPECTED: dict[State, Rule] = {
    S.START: _r(S.START, "send INVALID"),
    S.READING: _r(S.START, "send INVALID", "close pipe end"),
    S.WRITING: _r(S.START, "send INVALID", "close pipe end"),
}


def rule_for(state: State, event: Event) -> Rule:
    """The rule for ``event`` in ``state``: the table's, or the state's UNEXPECTED rule."""
    rule = TABLE[state].get(event)
    if rule is not None:
        return rule
    if event in COMMANDS:
        return UNEXPECTED[state]
    return Rule((), state)  # an internal event that no longer applies (e.g. a stale timer)
