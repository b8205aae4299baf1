"""Cheap statistics that the hot paths keep for metrics and ``zbroker top`` (no I/O).

A :class:`Buckets` is a histogram as plain ints: ``observe`` is a bisect and two additions, no
lock. Whoever exports it (zbroker.metrics) reads a copy (``snapshot``) on the thread that
updates it, and turns the counts into cumulative Prometheus buckets there.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

#: seconds: heartbeat round trips, producer ACK latency (0.1 ms .. 10 s)
LATENCY_BOUNDS: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                     0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: messages written by one fsync
BATCH_BOUNDS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Buckets:
    """Counts of observed values by upper bound (a value equal to a bound counts in it), the
    sum and the count; values above the last bound count only in ``count`` (``+Inf``)."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float] = LATENCY_BOUNDS) -> None:
        self.bounds = tuple(bounds)
        if list(self.bounds) != sorted(set(self.bounds)) or not self.bounds:
            raise ValueError("bounds must be increasing")
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value``."""
        i = bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += n
        self.sum += value * n
        self.count += n

    def snapshot(self) -> dict[str, Any]:
        """A copy, as plain data: {"bounds", "counts" (per bucket, not cumulative), "sum",
        "count"}."""
        return {"bounds": self.bounds, "counts": list(self.counts), "sum": self.sum,
                "count": self.count}


def cumulative(snapshot: dict[str, Any]) -> list[tuple[str, float]]:
    """Prometheus buckets of a snapshot: [(upper bound as text, cumulative count), ...,
    ("+Inf", count)]."""
    out, running = [], 0
    for bound, n in zip(snapshot["bounds"], snapshot["counts"], strict=True):
        running += n
        out.append((_bound_text(bound), running))
    out.append(("+Inf", snapshot["count"]))
    return out


def _bound_text(bound: float) -> str:
    return repr(float(bound))
