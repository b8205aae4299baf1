"""The pzq service's metric families (``PzqService.metric_families``): each queue's counters,
gauges, refusals, latency and group-commit histograms, stream groups' lag. No I/O: a
snapshot in, prometheus_client families out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client.core import Metric

from zbroker.metrics import add_histogram, counter, gauge, histogram

#: pzq counters exported as they are: (counter key, metric name, help)
_PZQ_COUNTERS = (
    ("produced", "zbroker_pzq_produced", "Messages producers sent (duplicates and refused "
                                         "ones too)."),
    ("stored", "zbroker_pzq_stored", "Messages written and fsynced."),
    ("duplicates", "zbroker_pzq_duplicates", "Messages sent again with an id already stored."),
    ("delivered", "zbroker_pzq_delivered", "Deliveries to consumers (redeliveries too)."),
    ("consumer_acks", "zbroker_pzq_acked", "Messages ACKed by consumers."),
    ("consumer_nacks", "zbroker_pzq_nacked", "Messages refused by consumers (NACK)."),
    ("redelivered", "zbroker_pzq_redelivered", "Messages delivered again (ACK timeout, a "
                                               "consumer gone, a NACK)."),
    ("expired_messages", "zbroker_pzq_ack_timeouts", "Deliveries whose ACK timeout passed."),
    ("syncs", "zbroker_pzq_fsyncs", "fdatasync calls of the queue's log."),
    ("bytes_written", "zbroker_pzq_log_written_bytes", "Bytes written to the queue's log."),
    ("replication_failed", "zbroker_pzq_replication_failures",
     "Messages ACKed with REPLICATION_FAILED: fewer than replicas peers confirmed a copy in "
     "time."),
    ("batches", "zbroker_pzq_batches", "Batches producers sent (the batch path)."),
    ("stream_retention_dropped", "zbroker_pzq_stream_retention_dropped",
     "Stream queues: messages the retention limits dropped before every reader group had "
     "committed them."),
)
#: pzq gauges: (counter key, metric name, help)
_PZQ_GAUGES = (
    ("messages", "zbroker_pzq_backlog_messages", "Messages stored and not ACKed yet."),
    ("backlog_bytes", "zbroker_pzq_backlog_bytes", "Bytes of the messages not ACKed yet."),
    ("messages_inflight", "zbroker_pzq_inflight_messages", "Messages delivered, waiting for "
                                                           "their ACK."),
    ("db_size", "zbroker_pzq_disk_bytes", "Bytes of the queue's log on disk."),
    ("consumers", "zbroker_pzq_consumers", "Consumers connected."),
    ("producers", "zbroker_pzq_producers", "Producers connected."),
)


def families(queues: Mapping[str, Mapping[str, Any]]) -> list[Metric]:
    """The families of the queues of a pzq ``metrics()`` snapshot, labelled by queue."""
    counters = [(key, counter(name, doc, labels=["queue"])) for key, name, doc in _PZQ_COUNTERS]
    gauges = [(key, gauge(name, doc, labels=["queue"])) for key, name, doc in _PZQ_GAUGES]
    refused = counter("zbroker_pzq_refused", "Messages refused (a \"0\" ACK), by reason: "
                       "full, too_large, invalid, busy, store_failed.",
                       labels=["queue", "reason"])
    latency = histogram("zbroker_pzq_producer_ack_latency_seconds",
                         "Seconds from a message's arrival to its producer ACK (stored and "
                         "fsynced; with replicas, copied too).", labels=["queue"])
    batches = histogram("zbroker_pzq_messages_per_fsync", "Messages written by each fsync "
                         "(group commit).", labels=["queue"])
    lag = gauge("zbroker_pzq_stream_group_lag_messages", "Stream queues: offsets between a "
                 "reader group's committed offset and the head (at most 64 groups a queue).",
                 labels=["queue", "group"])
    for queue, c in sorted(queues.items()):
        for key, value in c.items():
            if key.startswith("group.") and key.endswith(".lag"):
                lag.add_metric([queue, key[len("group."):-len(".lag")]], value)
        for key, family in (*counters, *gauges):
            family.add_metric([queue], c.get(key, 0))
        for reason, n in c.get("refusals", {}).items():
            refused.add_metric([queue, reason], n)
        if "ack_latency" in c:
            add_histogram(latency, [queue], c["ack_latency"])
        if "sync_batches" in c:
            add_histogram(batches, [queue], c["sync_batches"])
    return [f for _, f in counters] + [f for _, f in gauges] + [refused, latency, batches, lag]
