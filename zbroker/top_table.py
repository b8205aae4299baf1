"""A table of ``zbroker top``, as a service gives it (``Service.top_tables``): a title line,
column headers and rows of cells already written out, the busiest first. ``zbroker top``
draws every service's tables alike, in columns that fit 80 characters.

The helpers are what the tables of ZPIPES and pzq use: a rate from two samples of a counter,
counts and byte rates in at most six characters. No I/O.
"""

from __future__ import annotations

import dataclasses

from zpipes.progress import human_bytes

__all__ = ["TopTable", "bytes_rate", "count", "count_rate", "human_bytes", "rate", "sort_key"]


@dataclasses.dataclass(frozen=True)
class TopTable:
    """``title``: the line above the table (``pzq: 3 queues``); ``columns``: the headers
    (the first is left-aligned, the others right-aligned); ``rows``: each a cell per column.
    A table without rows is only its title."""

    title: str
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()


def rate(now: float, before: float | None, interval: float | None) -> float | None:
    """A counter's rate a second; None without a previous sample. A counter that went down
    (what it counts was replaced) counts from 0."""
    if interval is None or interval <= 0 or before is None:
        return None
    return (now - before if now >= before else now) / interval


def sort_key(rate: float | None, name: str) -> tuple[float, str]:
    """The busiest first, then by name."""
    return (-(rate or 0.0), name)


def count(n: float) -> str:
    """A count in at most six characters: 950, 12.5k, 1.23M (the columns fit 80)."""
    if n < 1000:
        return f"{n:.1f}" if n and n < 100 and n != int(n) else f"{n:.0f}"
    for unit in ("k", "M", "G"):
        n /= 1000
        if n < 1000:
            return f"{n:.3g}{unit}"
    return f"{n:.0f}G"


def count_rate(value: float | None) -> str:
    return "-" if value is None else f"{count(value)}/s"


def bytes_rate(value: float | None) -> str:
    return "-" if value is None else f"{human_bytes(value)}/s"
