"""The log budget: one structlog processor that bounds how many lines of a kind go out.

However fast clients, peers or signals make events, the log grows by a bounded number of lines
a second, and no line is lost without a count: the lines held back are told, in the next line
of their kind that goes out, or by :meth:`LogBudget.flush` (the broker calls it every second)
once their interval is over. Two kinds of line have a budget:

* Lines that name one, with a ``budget`` field: routine events and complaints about one
  client (a pipe opened, an invalid frame), refusals of an endpoint, reloads, why brokers do
  not link. The field is "<rate>" or "<rate>:<kind>": the rate is one of RATES (``lines`` 5 a
  second, ``peer`` 50, ``refused`` 1, ``reloads`` 5, ``troubles`` 1 a minute); the kind is
  the part after the ``:``, else the event's name
  (``budget="refused:broken queue=jobs"``: each queue's refusals of that kind, whatever their
  words); with the CONTEXT_KEYS it makes the key. A kind goes out ``burst`` times an interval;
  the next line of it that goes out carries ``suppressed=N``; a flush writes "<event> (held
  back)" with ``suppressed=N``. The cluster's troubles (zbroker/cluster/troubles.py) say each
  refusal of a peer and each look at a silent seed, under a kind of its own for each peer and
  side (or seed) and episode: the first line of it goes out at once, then one a minute.

      log.info("pipe opened", budget="lines", client=7, pipe="logs")

* Repeated warnings and errors (the repeat rule), with or without a ``budget``: a warning of
  one kind (its event name) from one source (its values of SOURCE_KEYS, and CONTEXT_KEYS)
  goes out the first time, then at most once per REPEAT_INTERVAL, as one line that counts the
  others: "invalid frame (repeated 1999 times in the last 10 s)" with ``repeated=N``. An
  event that names no source (the broker's own doings, an operator's reload) is never
  collapsed, nor one logged with ``collapse=False`` (a change of state each of which counts:
  bounded by what the cluster does, not by input).

A line with a budget that is also a repeated warning passes only if both let it. At most
``max_keys`` keys are remembered (the least recently seen forgotten first, its count told).
The counting of refusals for status and metrics is not here: only how many lines go out.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from structlog.typing import EventDict, WrappedLogger


@dataclass(frozen=True, slots=True)
class Rate:
    """``burst`` lines of a key every ``interval`` seconds; ``told``: how a line says what
    was held back ("suppressed": a field; "repeated": its event's name and a field)."""

    burst: int
    interval: float
    told: str = "suppressed"


INTERVAL_S = 1.0
#: the rates of the budgets, by the name before the first ":" of a line's ``budget`` field
RATES: dict[str, Rate] = {
    "lines": Rate(5, INTERVAL_S),  # routine lines, complaints about one client
    "peer": Rate(50, INTERVAL_S),  # what the cluster's brokers cause (ends told as a peer links)
    "refused": Rate(1, INTERVAL_S),  # refusals of one endpoint, by kind
    "reloads": Rate(5, INTERVAL_S),  # what reloads did (a flood of SIGHUPs)
    "troubles": Rate(1, 60.0),  # why brokers do not link: of one peer and side, or one seed
}
DEFAULT_RATE = RATES["lines"]  # a budget of a name not in RATES
REPEAT_INTERVAL = 10.0  # seconds: at most one line per kind and source in that time
REPEAT_RATE = Rate(1, REPEAT_INTERVAL, "repeated")
MAX_KEYS = 4096  # keys remembered (least recently seen forgotten first)
REPEAT_LEVELS = frozenset(("warning", "error", "critical"))
#: the fields that say where an event came from, for collapsing repeats: a network address
#: (what a flood cannot choose freely), the broker's own handles of a client, a peer (its id,
#: its life), a pipe, a queue. Fields a sender chooses itself (a claimed name or endpoint) are
#: logged under other keys, so that varying them does not make a flood "new" every time.
SOURCE_KEYS = ("address", "client", "peer", "id", "life", "sender", "endpoint", "pipe", "queue",
               "node")
#: bound context that tells apart the same event of different parts of the broker
CONTEXT_KEYS = ("component", "service")

Key = tuple[Any, ...]


class _Window:
    __slots__ = ("start", "passed", "held", "last", "level")

    def __init__(self, start: float) -> None:
        self.start = start  # when its current interval began
        self.passed = 0  # lines that went out in it
        self.held = 0  # lines held back since the last that went out
        self.last: EventDict | None = None  # the last of them
        self.level = "info"


class LogBudget:
    """The processor (after ``add_log_level``): raises ``structlog.DropEvent`` for a line
    held back. ``emit(level, event)`` writes the lines that :meth:`flush` (and the forgetting
    of a key with lines held back) make."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS,
                 emit: Callable[[str, EventDict], None] | None = None,
                 rates: Mapping[str, Rate] = RATES, repeat: Rate = REPEAT_RATE,
                 source_keys: tuple[str, ...] = SOURCE_KEYS) -> None:
        self.clock = clock
        self.max_keys = max_keys
        self.emit = emit
        self.rates = rates
        self.repeat = repeat
        self.source_keys = source_keys
        self.held_back = 0  # lines held back by their budget, in all
        self.collapsed = 0  # warnings held back as repeats, in all
        self._windows: OrderedDict[Key, _Window] = OrderedDict()
        self._owed: dict[Key, Rate] = {}  # keys with lines held back and not told
        self._lock = threading.Lock()

    def budget_key(self, name: str, event: EventDict) -> tuple[Key, Rate]:
        """(the key, the rate) of a line of the budget ``name``: "<rate>" (its kind is its
        event's name) or "<rate>:<kind>"."""
        rate, named, _ = name.partition(":")
        key = (name, None if named else event.get("event"), event.get("component"),
               event.get("service"))  # (CONTEXT_KEYS, spelt out: every line pays this)
        try:
            hash(key)
        except TypeError:
            key = tuple(map(_hashable, key))
        return key, self.rates.get(rate, DEFAULT_RATE)

    def repeat_key(self, event: EventDict) -> Key | None:
        """(event name, source and context fields), or None if it names no source."""
        source = tuple((k, _hashable(event[k])) for k in self.source_keys if k in event)
        if not source:
            return None
        return (None, str(event.get("event")), *source,
                *((k, _hashable(event[k])) for k in CONTEXT_KEYS if k in event))

    def __call__(self, logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
        name = event.pop("budget", None)
        collapse = event.pop("collapse", True) is not False
        level = event.get("level", method)
        repeats = collapse and level in REPEAT_LEVELS
        if name is None and not repeats:
            return event
        forgotten: list[tuple[str, EventDict]] = []
        passed: EventDict | None = event
        with self._lock:
            now = self.clock()
            if name is not None:
                key, rate = self.budget_key(str(name), event)
                passed = self._take(key, rate, event, level, now, forgotten)
            if passed is not None and repeats:
                repeat_key = self.repeat_key(event)
                if repeat_key is not None:
                    passed = self._take(repeat_key, self.repeat, passed, level, now, forgotten)
        for line in forgotten:
            self._emit(*line)
        if passed is None:
            raise structlog.DropEvent
        return passed

    def _take(self, key: Key, rate: Rate, event: EventDict, level: str, now: float,
              forgotten: list[tuple[str, EventDict]]) -> EventDict | None:
        """``event`` as it goes out under ``key``'s budget (saying what was held back), or
        None if it is held back (called with the lock)."""
        windows = self._windows
        window = windows.get(key)
        if window is None:
            window = windows[key] = _Window(now)
            while len(windows) > self.max_keys:
                old_key, old = windows.popitem(last=False)
                old_rate = self._owed.pop(old_key, None)
                if old_rate is not None:  # tell what it held back before forgetting it
                    forgotten.append(self._told(old, old_rate, now))
        else:
            windows.move_to_end(key)
        start = window.start
        if now - start >= rate.interval:
            window.start, window.passed = now, 0
        if window.passed >= rate.burst:
            window.held += 1
            window.last, window.level = event, level
            self._owed[key] = rate
            if rate.told == "repeated":
                self.collapsed += 1
            else:
                self.held_back += 1
            return None
        window.passed += 1
        if window.held:
            self._owed.pop(key, None)
            held, window.held, window.last = window.held, 0, None
            if rate.told == "repeated":  # (this one is a repeat too)
                event = _repeated(event, held + 1, now - start)
            else:
                event["suppressed"] = held
        return event

    def flush(self, everything: bool = False) -> int:
        """Tell the lines held back of each key whose interval is over (of every key with
        ``everything``, when stopping), in one line each; returns how many."""
        lines = []
        with self._lock:
            now = self.clock()
            for key, rate in list(self._owed.items()):
                window = self._windows[key]
                if everything or now - window.start >= rate.interval:
                    del self._owed[key]
                    lines.append(self._told(window, rate, now))
                    window.start, window.passed = now, 1  # (the line told is one of the new)
        for line in lines:
            self._emit(*line)
        return len(lines)

    def forget_repeats(self) -> int:
        """Tell what the repeat rule holds back, at once, and forget its keys (logging is
        configured anew: its first warnings go to the new outputs); the budgets' keys are
        kept (a flood of reloads configures logging at each). Returns how many lines."""
        lines = []
        with self._lock:
            now = self.clock()
            for key in [k for k in self._windows if k[0] is None]:  # (repeat keys)
                window = self._windows.pop(key)
                rate = self._owed.pop(key, None)
                if rate is not None:
                    lines.append(self._told(window, rate, now))
        for line in lines:
            self._emit(*line)
        return len(lines)

    def clear(self) -> None:
        """Forget every key (and what they held back)."""
        with self._lock:
            self._windows.clear()
            self._owed.clear()

    def _told(self, window: _Window, rate: Rate, now: float) -> tuple[str, EventDict]:
        """The line that tells what ``window`` held back, written after the call of its
        last line returned (its ``exc_info`` means nothing any more)."""
        event = dict(window.last or {})
        event.pop("exc_info", None)
        held, window.held, window.last = window.held, 0, None
        if rate.told == "repeated":
            event = _repeated(event, held, now - window.start)
        else:
            event["event"] = f"{event.get('event')} (held back)"
            event["suppressed"] = held
        return window.level, event

    def _emit(self, level: str, event: EventDict) -> None:
        if self.emit is not None:
            self.emit(level, event)


def _repeated(event: EventDict, count: int, seconds: float) -> EventDict:
    event["event"] = (f"{event.get('event')} (repeated {count} times in the last "
                      f"{seconds:.0f} s)")
    event["repeated"] = count
    return event


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value
