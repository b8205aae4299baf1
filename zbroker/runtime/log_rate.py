"""A log budget: lines of one kind logged at a bounded rate, with a count of those held back.

Routine events (a pipe opened or closed, a client gone) and complaints about one client (a bad
frame, a refused write) are logged line by line while they are few; when they come faster than
``burst`` a second, the rest of that second's lines of that kind are held back, and the next
line that goes out says how many were (``suppressed``). However fast a client makes them, a kind
adds at most ``burst`` lines a second, so a flood of any kind adds a bounded number of lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: lines of one kind per ``INTERVAL_S`` before the rest are held back
BURST = 5
#: the same for lines that the cluster's brokers cause (ends told by a peer as it links)
PEER_BURST = 50
INTERVAL_S = 1.0


class LogRate:
    """``log``: a structlog logger; ``context``: fields every line carries."""

    def __init__(self, log: Any, burst: int = BURST, interval: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, **context: Any) -> None:
        self.log = log
        self.burst = burst
        self.interval = interval
        self.clock = clock
        self.context = context
        self._window: dict[str, tuple[float, int]] = {}  # kind -> (its start, lines in it)
        self._held: dict[str, int] = {}  # kind -> lines held back since its last line
        self._level: dict[str, str] = {}  # kind -> the level of its lines held back
        self.suppressed = 0  # lines held back, all kinds

    def line(self, event: str, /, level: str = "info", **fields: Any) -> bool:
        """Log ``event`` with ``fields`` at ``level`` unless ``burst`` lines of that event
        (its kind) went out in the current interval; True if it was logged."""
        kind = event
        now = self.clock()
        start, n = self._window.get(kind, (now, 0))
        if now - start >= self.interval:
            start, n = now, 0
        if n >= self.burst:
            self._held[kind] = self._held.get(kind, 0) + 1
            self._level[kind] = level
            self.suppressed += 1
            self._window[kind] = (start, n)
            return False
        self._window[kind] = (start, n + 1)
        held = self._held.pop(kind, 0)
        if held:
            fields["suppressed"] = held
        getattr(self.log, level)(event, **self.context, **fields)
        return True

    def flush(self) -> None:
        """Tell the lines held back of each kind whose interval is over and that no line has
        told yet, in one line each (``suppressed``): call it every interval or so, so that the
        count of a flood that stopped is not left untold."""
        now = self.clock()
        for kind in [k for k, (start, _) in self._window.items()
                     if k in self._held and now - start >= self.interval]:
            held = self._held.pop(kind)
            self._window[kind] = (now, 1)
            getattr(self.log, self._level.pop(kind, "info"))(
                f"{kind} (held back)", **self.context, suppressed=held)
