"""A client of this broker, as the client engine (engine.py) keeps it: its state in the
ZPIPES state machine (machine.py), its open end, its requests and what waits on them. No I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from .machine import Event, State


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
    source: Hashable = None  # who it is (a uid, a host): its writes count in its share
    request: Any = None  # the active READ or WRITE
    request_event: Event | None = None
    request_serial: int = 0
    budget_serial: int = -1  # the request last checked against the broker-wide budget
    dequeued: bool = False  # the command being handled came from the client's queue
    deadline: float | None = None  # when the active request times out
    timer_armed: bool = False
    #: why its last request or command failed: what its *_FAILED replies say
    reason: str = ""
    terminated: bool = False
    failed_end: int | None = None  # the end whose failure was counted (once per end)
    #: why the stream of the writer end it just closed broke (its CLOSE answers CLOSE_FAILED)
    close_failure: str | None = None
    #: the writer end it closed, while its CLOSE waits for ``awaiting``: the peers (lives)
    #: with readers of its stream that are to confirm they have its end
    closing_end: int | None = None
    awaiting: set[str] = field(default_factory=set)
