"""Refusals of one endpoint: counted by kind, and logged at a bounded rate.

A flood of connections that each break the protocol, never finish the handshake or come past
the connection budget must not become a flood of log lines: each kind is logged at most once
per second (the log budget's ``refused`` rate, zbroker/logs/budget.py, which holds the other
lines back and counts them in the next one: ``suppressed``). The counts here are exact; they
are the endpoint's metrics.
"""

from __future__ import annotations

import itertools
from typing import Any

_serials = itertools.count(1)


class Refusals:
    """``context``: fields every line of this endpoint carries (e.g. its queue's name)."""

    def __init__(self, log: Any, **context: Any) -> None:
        self.log = log
        self.context = context
        self.counts: dict[str, int] = {}
        # the budget of this endpoint's lines: each endpoint has its own, kind by kind
        self._budget = f"{' '.join(f'{k}={v}' for k, v in context.items())} #{next(_serials)}"

    def count(self, kind: str) -> int:
        return self.counts.get(kind, 0)

    def note(self, kind: str, event: str, /, level: str = "warning", **fields: Any) -> None:
        """Count one refusal of ``kind``, and log ``event`` with ``fields``: the log budget
        lets one line of each kind of this endpoint out a second."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.tell(kind, event, level=level, **fields)

    def tell(self, kind: str, event: str, /, level: str = "info", **fields: Any) -> None:
        """Log ``event`` with ``fields`` under this endpoint's budget of ``kind`` (a line a
        second), counting nothing: what a flood of refusals says besides them (that the
        endpoint takes connections again) is bounded as they are."""
        getattr(self.log, level)(event, budget=f"refused:{kind} {self._budget}",
                                 **self.context, **fields)
