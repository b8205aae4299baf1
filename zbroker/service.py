"""What a pluggable broker service implements.

The broker owns the event loop, the ZeroMQ context, signals, config and logs; it knows nothing
of pipes or queues. A service binds its own sockets in ``start``, serves on the broker's loop,
and is told about config reloads and (later) about peer brokers joining and leaving.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq


class ServiceError(Exception):
    """A service cannot start or apply a config; the message is for the operator."""


class ClusterPort:
    """How a service reaches its counterparts on peer brokers (None-safe: without a cluster,
    ``send`` returns False and ``peers`` is empty)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.node: Any = None  # the broker's cluster node, once it runs

    def send(self, peer: str, frames: list[Any]) -> bool:
        """Send frames to this service on one peer (a ``PeerBroker.id``); False if it is gone."""
        return self.node is not None and self.node.send(peer, self.service, frames)

    def peers(self) -> list[dict[str, Any]]:
        return self.node.peers() if self.node is not None else []


@dataclass(frozen=True)
class ServiceContext:
    broker_name: str
    zmq_context: zmq.Context
    loop: asyncio.AbstractEventLoop
    log: Any  # a structlog BoundLogger bound with service=<name>
    run_dir: Path
    cluster: ClusterPort | None = None


@dataclass(frozen=True)
class PeerBroker:
    """Another broker of the cluster, in one life: ``id`` is new each time it is admitted, so
    state kept for an earlier life can never be mistaken for the current one."""

    id: str
    name: str
    endpoint: str
    member: str = ""  # its start id: the same at every member, for as long as it runs
    directory: bool = False  # its ZPIPES speaks the pipe directory (zpipes/directory.py)
    fanout: bool = False  # its ZPIPES takes a DATA for several readers (zpipes/peering.py)
    write_frames: bool = False  # and a DATA whose chunk is in its WRITE frame
    confirm: bool = False  # and answers CONFIRM, on a link that numbers messages


class Service(ABC):
    #: the key of the service's section under ``services:`` in the config
    name: str

    @abstractmethod
    async def start(self, ctx: ServiceContext, config: Any) -> None:
        """Bind and begin serving. ``config`` is the broker's whole typed config (the service
        reads its own section and any shared ones). Raise ServiceError with a clear message if
        it cannot start."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop serving: answer what is pending as fits, release sockets. Must not hang."""

    def reload(self, new: Any, old: Any) -> None:
        """Apply a changed config (whole configs, new and old). Raise ServiceError to refuse
        it."""

    def peer_joined(self, peer: PeerBroker) -> None:
        """A peer broker joined the cluster."""

    def peer_left(self, peer: PeerBroker) -> None:
        """A peer broker left the cluster or was lost."""

    def peer_message(self, peer: PeerBroker, frames: list[Any]) -> None:
        """A message from this service on a peer broker (frames as memoryviews)."""

    def status(self) -> dict[str, Any]:
        """What the service is doing, for management commands."""
        return {}

    def metrics(self) -> dict[str, Any]:
        """Counters for the metrics endpoint and ``zbroker top``, as plain data (numbers,
        lists, dicts). Called on the event loop, at scrape time only: it may walk the
        service's state, but keeps nothing."""
        return {}
