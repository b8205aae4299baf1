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


@dataclass(frozen=True)
class ServiceContext:
    broker_name: str
    zmq_context: zmq.Context
    loop: asyncio.AbstractEventLoop
    log: Any  # a structlog BoundLogger bound with service=<name>
    run_dir: Path


@dataclass(frozen=True)
class Peer:
    """Another broker of the cluster (filled in by the cluster work)."""

    id: str
    name: str
    endpoint: str


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

    def peer_joined(self, peer: Peer) -> None:
        """A peer broker joined the cluster."""

    def peer_left(self, peer: Peer) -> None:
        """A peer broker left the cluster or was lost."""

    def status(self) -> dict[str, Any]:
        """What the service is doing, for management commands."""
        return {}
