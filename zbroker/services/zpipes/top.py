"""ZPIPES's tables in ``zbroker top`` (``ZpipesService.top_tables``): its clients and
connections, and its pipes with their byte rates, the busiest first. No I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zbroker.top_table import TopTable, bytes_rate, human_bytes, rate, sort_key

MAX_ROWS = 50  # the busiest pipes shown


def pipe_rows(status: Mapping[str, Any], before: Mapping[str, Any] | None,
              interval: float | None) -> list[dict[str, Any]]:
    """Each pipe with its rates (None on the first sample), the busiest first."""
    old = (before or {}).get("pipes", {})
    rows = []
    for name, p in (status.get("pipes") or {}).items():
        was = old.get(name, {}) if before is not None else None
        w = rate(p.get("bytes_written", 0),
                 was.get("bytes_written", 0) if was is not None else None, interval)
        r = rate(p.get("bytes_read", 0),
                 was.get("bytes_read", 0) if was is not None else None, interval)
        rows.append({"name": name, "readers": p.get("readers", 0),
                     "writers": p.get("writers", 0), "write_rate": w, "read_rate": r,
                     "buffered": p.get("buffered", 0),
                     "rate": None if w is None else w + (r or 0.0)})
    rows.sort(key=lambda p: sort_key(p["rate"], p["name"]))
    return rows


def tables(status: Mapping[str, Any], before: Mapping[str, Any] | None,
           interval: float | None) -> list[TopTable]:
    pipes = pipe_rows(status, before, interval)
    title = (f"ZPIPES: {status.get('clients', 0)} clients, {status.get('connections', 0)} "
             f"connections, {len(pipes)} pipes")
    if not pipes:
        return [TopTable(title)]
    return [TopTable(title, ("PIPE", "READERS", "WRITERS", "WRITE", "READ", "BUFFERED"),
                     tuple((p["name"], str(p["readers"]), str(p["writers"]),
                            bytes_rate(p["write_rate"]), bytes_rate(p["read_rate"]),
                            human_bytes(p["buffered"])) for p in pipes[:MAX_ROWS]))]
