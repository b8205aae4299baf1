"""The ZPIPES service's metric families (``ZpipesService.metric_families``): its clients,
connections, pipes, failed ends, link traffic and, for ``services.zpipes.pipe_series`` pipes, bytes
by pipe. No I/O: a snapshot in, prometheus_client families out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client.core import Metric

from zbroker.metrics import counter, gauge

from .failures import FAILURE_KINDS


def families(z: Mapping[str, Any], pipe_series: int) -> list[Metric]:
    """The families of a ZPIPES ``metrics()`` snapshot; per-pipe ones for the ``pipe_series``
    busiest pipes."""
    refused = counter("zbroker_zpipes_connections_refused",
                       "Connections hung up, by reason: not_allowed (services.zpipes.allow), "
                       "too_many_clients (clients.max_clients, all endpoints together), "
                       "no_handshake (none within 10 s), protocol_error.",
                       labels=["reason"])
    for reason, n in sorted(z.get("refused", {}).items()):
        refused.add_metric([reason.replace(" ", "_")], n)
    failed = counter("zbroker_zpipes_ends_failed",
                      "READ_FAILED and WRITE_FAILED answers, by role (reader, writer) and "
                      "reason (" + ", ".join(FAILURE_KINDS) + ").", labels=["role", "reason"])
    counts = {(role, reason): n for role, reason, n in z.get("ends_failed", [])}
    for role in ("reader", "writer"):  # every series from the start: rate() needs a zero
        for reason in FAILURE_KINDS:
            failed.add_metric([role, reason], counts.get((role, reason), 0))
    out: list[Metric] = [
        gauge("zbroker_zpipes_clients_connected", "ZPIPES clients the broker knows now.",
              z.get("clients", 0)),
        counter("zbroker_zpipes_clients_expired", "ZPIPES clients expired: silent for "
                "services.zpipes.client_timeout.", z.get("clients_expired", 0)),
        counter("zbroker_zpipes_clients_disconnected", "ZPIPES clients whose connection went.",
                z.get("clients_disconnected", 0)),
        gauge("zbroker_zpipes_connections", "Open connections to the ZPIPES endpoint.",
               z.get("connections", 0)),
        refused,
        gauge("zbroker_zpipes_pipes", "Pipes open (with at least one end).", z["pipes"]),
        gauge("zbroker_zpipes_readers", "Reader ends of this broker's clients.", z["readers"]),
        gauge("zbroker_zpipes_writers", "Writer ends of this broker's clients.", z["writers"]),
        gauge("zbroker_zpipes_buffered_bytes", "Bytes buffered for this broker's readers.",
               z["buffered_bytes"]),
        counter("zbroker_zpipes_written_bytes", "Bytes written into pipes by this broker's "
                 "clients.", z["bytes_written"]),
        counter("zbroker_zpipes_read_bytes", "Bytes read from pipes by this broker's clients.",
                 z["bytes_read"]),
        failed,
    ]
    link = z.get("link")
    if link:
        messages = counter("zbroker_zpipes_link_data_messages",
                            "DATA messages of pipes to and from peer brokers, by direction "
                            "(sent, received): one per chunk per broker of its readers.",
                            labels=["direction"])
        data = counter("zbroker_zpipes_link_data_bytes",
                        "Bytes of pipe data in those DATA messages, by direction.",
                        labels=["direction"])
        for direction in ("sent", "received"):
            messages.add_metric([direction], link[f"data_{direction}"])
            data.add_metric([direction], link[f"data_bytes_{direction}"])
        out += [messages, data,
                counter("zbroker_zpipes_link_credit_messages",
                         "CREDIT messages sent to peer brokers.", link["credit_sent"])]
    if pipe_series > 0:
        written = counter("zbroker_zpipes_pipe_written_bytes",
                           "Bytes written into the pipe by this broker's clients, for the "
                           "services.zpipes.pipe_series busiest pipes.", labels=["pipe"])
        read = counter("zbroker_zpipes_pipe_read_bytes",
                        "Bytes read from the pipe by this broker's clients, for the "
                        "services.zpipes.pipe_series busiest pipes.", labels=["pipe"])
        for name, w, r in busiest(z.get("pipe_bytes", []), pipe_series):
            written.add_metric([name], w)
            read.add_metric([name], r)
        out += [written, read]
    return out


def busiest(pipes: list[tuple[str, int, int]], n: int) -> list[tuple[str, int, int]]:
    """The ``n`` pipes that moved the most bytes (written + read), then by name."""
    return sorted(pipes, key=lambda p: (-(p[1] + p[2]), p[0]))[:n]
