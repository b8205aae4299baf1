"""pzq's table in ``zbroker top`` (``PzqService.top_tables``): its queues with their rates
and backlog, the busiest first. No I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zbroker.top_table import TopTable, count, count_rate, human_bytes, rate, sort_key

MAX_ROWS = 50  # the busiest queues shown


def queue_rows(status: Mapping[str, Any], before: Mapping[str, Any] | None,
               interval: float | None) -> list[dict[str, Any]]:
    """Each queue with its rates (None on the first sample), the busiest first."""
    rows = []
    for name, q in status.items():
        was = (before or {}).get(name, {}) if before is not None else None
        rates = {key: rate(q.get(key, 0), was.get(key, 0) if was is not None else None,
                           interval)
                 for key in ("produced", "delivered", "consumer_acks")}
        rows.append({
            "name": name, "produced_rate": rates["produced"],
            "delivered_rate": rates["delivered"], "acked_rate": rates["consumer_acks"],
            "backlog": q.get("messages", 0), "backlog_bytes": q.get("backlog_bytes", 0),
            "inflight": q.get("messages_inflight", 0), "consumers": q.get("consumers", 0),
            "producers": q.get("producers", 0),
            "rate": None if rates["produced"] is None
            else rates["produced"] + (rates["delivered"] or 0.0)})
    rows.sort(key=lambda q: sort_key(q["rate"], q["name"]))
    return rows


def tables(status: Mapping[str, Any], before: Mapping[str, Any] | None,
           interval: float | None) -> list[TopTable]:
    queues = queue_rows(status, before, interval)
    if not queues:
        return []
    # (headers that fit 80 columns with a queue name of 16: "BYTES" is the backlog's, "P/C"
    # producers and consumers connected)
    return [TopTable(f"pzq: {len(queues)} queues",
                     ("QUEUE", "PRODUCED", "DELIVERED", "ACKED", "BACKLOG", "BYTES",
                      "IN FLIGHT", "P/C"),
                     tuple((q["name"], count_rate(q["produced_rate"]),
                            count_rate(q["delivered_rate"]), count_rate(q["acked_rate"]),
                            count(q["backlog"]), human_bytes(q["backlog_bytes"]),
                            count(q["inflight"]), f"{q['producers']}/{q['consumers']}")
                           for q in queues[:MAX_ROWS]))]
