"""What one pzq queue runs with: its settings, resolved (the broker's config or the pzq
command make them), and the error that stops it from starting."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from zbroker.config import PzqQueueConfig

from .queue import Limits


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


def default_data_dir(broker: str, queue: str) -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "zbroker" / broker / "pzq" / queue
