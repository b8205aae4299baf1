"""What one pzq queue runs with: its settings, resolved (the broker's config or the pzq
command make them), the error that stops it from starting, and what the settings make of the
parts of a queue: its limits, its logs, its replication settings, its receive endpoint."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pzq import wire
from zbroker.services.pzq.core.queue import MODES, Limits
from zbroker.services.pzq.core.replication import ReplicationSettings

from .config import PzqQueueConfig
from .receiver import Receiver
from .store import Store

#: what a producer's message may carry besides its body (id, headers, FRAME_COST a frame) on
#: top of the frames' own FRAME_COST: past max_message_size + this, the rest is discarded
ENVELOPE_ALLOWANCE = 64 << 10


class QueueError(Exception):
    """The queue cannot start; the message is for the operator."""


@dataclass(frozen=True)
class QueueSettings:
    """What one queue runs with (resolved: paths and endpoints are final)."""

    name: str
    receive_endpoint: str
    send_endpoint: str
    monitor_endpoint: str | None
    data_dir: Path
    sync: str = PzqQueueConfig.sync
    sync_window: float = PzqQueueConfig.sync_window
    sync_max_bytes: int = PzqQueueConfig.sync_max_bytes  # one fdatasync covers at most this
    segment_size: int = PzqQueueConfig.segment_size
    ack_timeout: float = PzqQueueConfig.ack_timeout
    reaper_frequency: float = PzqQueueConfig.reaper_frequency
    inflight_window: int = PzqQueueConfig.inflight_window
    inflight_size: int = PzqQueueConfig.inflight_size
    max_message_size: int = PzqQueueConfig.max_message_size
    max_backlog: int = PzqQueueConfig.max_backlog
    idempotence_window: int = PzqQueueConfig.idempotence_window
    idempotence_bytes: int = PzqQueueConfig.idempotence_bytes
    max_frames: int = PzqQueueConfig.max_frames
    replicas: int = PzqQueueConfig.replicas
    replication_timeout: float = PzqQueueConfig.replication_timeout
    #: receive endpoints of the peer queues copies go to
    peers: tuple[str, ...] = PzqQueueConfig.peers
    # (none, with replicas and a cluster: copies go to peers of the cluster, see placement.py)
    #: silence after which a peer's copies are taken over
    node_timeout: float = PzqQueueConfig.node_timeout
    mode: str = PzqQueueConfig.mode  # push: to consumers, ACKed one by one; stream: RANGE / COMMIT
    stream_endpoint: str = PzqQueueConfig.stream_endpoint  # stream requests (stream mode only)
    retention_bytes: int | None = PzqQueueConfig.retention_bytes  # stream mode: limits that
    retention_seconds: float | None = PzqQueueConfig.retention_seconds  # win over groups
    #: consumers that say READY with a window (ROUTER)
    credit_endpoint: str | None = PzqQueueConfig.credit_endpoint
    #: node ids whose copies this queue holds (static peers); none: REPLICA traffic refused
    replica_sources: tuple[str, ...] = PzqQueueConfig.replica_sources
    max_replica_origins: int = PzqQueueConfig.max_replica_origins

    def limits(self) -> Limits:
        return Limits(ack_timeout=self.ack_timeout, max_message_size=self.max_message_size,
                      max_backlog=self.max_backlog, idempotence_window=self.idempotence_window,
                      idempotence_bytes=self.idempotence_bytes, max_frames=self.max_frames,
                      inflight_window=self.inflight_window, inflight_size=self.inflight_size,
                      replicas=self.replicas, replication_timeout=self.replication_timeout)

    def check(self, cluster: bool) -> None:
        """QueueError if the queue cannot run as set (``cluster``: it is in a cluster)."""
        if self.mode not in MODES:
            raise QueueError(f"queue {self.name!r}: mode must be one of {MODES}, "
                             f"got {self.mode!r}")
        if self.mode != "stream" and (self.retention_bytes or self.retention_seconds):
            raise QueueError(f"queue {self.name!r}: retention_bytes and retention_seconds "
                             "are for stream queues (mode: stream); a push queue keeps a "
                             "message until a consumer ACKs it")
        if self.replicas > len(self.peers) and not (self.replicas and not self.peers
                                                    and cluster):
            raise QueueError(f"queue {self.name!r}: replicas {self.replicas} needs a "
                             f"cluster or at least as many peers (has {len(self.peers)})")

    def store(self, log: Any, replica_of: str | None = None) -> Store:
        """The queue's log, or the log of the copies it holds for node ``replica_of``."""
        if replica_of is None:
            return Store(self.data_dir, sync=self.sync, sync_window=self.sync_window,
                         segment_size=self.segment_size, max_batch_bytes=self.sync_max_bytes,
                         log=log)
        return Store(self.data_dir / "replicas" / replica_of, sync=self.sync,
                     sync_window=self.sync_window, segment_size=self.segment_size, log=log)

    def replication(self, node_id: str, cluster: bool, rejoin_grace: float,
                    lease: float = 0.0) -> ReplicationSettings:
        return ReplicationSettings(
            name=self.name, node_id=node_id, replicas=self.replicas,
            static_peers=len(self.peers[:self.replicas]), cluster=cluster,
            sources=frozenset(self.replica_sources), node_timeout=self.node_timeout,
            max_origins=self.max_replica_origins, rejoin_grace=rejoin_grace,
            lease=lease if cluster else 0.0)

    def receiver(self, loop: Any, on_input: Any, log: Any) -> Receiver:
        """The receive endpoint (not bound yet), with the limits on what producers send."""
        return Receiver(
            loop, on_input, max_frames=self.max_frames,
            max_bytes=(self.max_message_size + ENVELOPE_ALLOWANCE
                       + wire.FRAME_COST * self.max_frames),
            frame_cost=wire.FRAME_COST, keep_first=wire.MAX_ID + 1,
            max_held=max(self.max_backlog, 2 * self.max_message_size), log=log, name=self.name)


def default_data_dir(broker: str, queue: str) -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "zbroker" / broker / "pzq" / queue
