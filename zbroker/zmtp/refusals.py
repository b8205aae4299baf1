"""Refusals of one endpoint: counted by kind, and logged at a bounded rate.

A flood of connections that each break the protocol, never finish the handshake or come past
the connection budget must not become a flood of log lines: each kind is logged at most once
per ``interval`` seconds, and the line that comes next says how many were held back meanwhile
(``suppressed``). The counts are exact; they are the endpoint's metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: seconds between two log lines of the same kind of refusal on one endpoint
LOG_INTERVAL_S = 1.0


class Refusals:
    """``context``: fields every line of this endpoint carries (e.g. its queue's name)."""

    def __init__(self, log: Any, interval: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, **context: Any) -> None:
        self.log = log
        self.context = context
        self.interval = interval
        self.clock = clock
        self.counts: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}  # kind -> when its last line went out
        self._held: dict[str, int] = {}  # kind -> lines held back since

    def count(self, kind: str) -> int:
        return self.counts.get(kind, 0)

    def note(self, kind: str, event: str, /, level: str = "warning", **fields: Any) -> bool:
        """Count one refusal of ``kind``, and log ``event`` with ``fields`` unless a line of
        that kind went out less than ``interval`` ago. True if it was logged."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = self.clock()
        last = self._logged_at.get(kind)
        if last is not None and now - last < self.interval:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False
        self._logged_at[kind] = now
        held = self._held.pop(kind, 0)
        if held:
            fields["suppressed"] = held
        getattr(self.log, level)(event, **self.context, **fields)
        return True
