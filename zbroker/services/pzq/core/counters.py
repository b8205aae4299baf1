"""The monitor's counters of one queue, gathered from its parts (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zbroker.services.pzq.core.queue import QueueCore


@dataclass
class Dropped:
    """What the server could not send and let go (the other side asks again or learns
    nothing); the producer ACKs it let go are the receiver's (``dropped_answers``)."""

    confirmations: int = 0  # to credit consumers whose connection was full or gone
    stream_replies: int = 0  # to stream readers whose connection was full or gone


def queue_counters(core: QueueCore, store: Any, dropped: Dropped, *, consumers: int,
                   receiver: Any = None, consumer_endpoints: Any = None,
                   replication: Any = None, stream: Any = None, credit: bool = False
                   ) -> dict[str, int]:
    """The original's six counters, then ours. ``receiver``, ``consumer_endpoints``
    (consumers.Consumers), ``replication``, ``stream``:
    those parts when the queue has them (running, stream mode); ``credit``: it has a credit
    endpoint."""
    dispatcher = core.dispatcher
    return {
        "messages": len(core.messages),
        "messages_inflight": dispatcher.inflight,
        "db_size": store.disk_bytes,
        "inflight_db_size": dispatcher.inflight_bytes,
        "syncs": store.syncs,
        "expired_messages": dispatcher.expired,
        "consumers": consumers,
        **(receiver.counters() if receiver is not None else {}),
        **(consumer_endpoints.counters() if consumer_endpoints is not None else {}),
        "credit_consumers": core.credit_consumers,
        **({"dropped_confirmations": dropped.confirmations} if credit else {}),
        "redelivered": dispatcher.redelivered,
        "backlog_bytes": core.backlog_bytes,
        "dropped_replies": receiver.dropped_answers if receiver is not None else 0,
        **core.counters,
        **store.counters(),
        **(replication.counters() if replication is not None else {}),
        **(stream.counters() if stream is not None else {}),
        **({"dropped_stream_replies": dropped.stream_replies} if stream is not None else {}),
    }
