"""What a pluggable broker service implements.

The broker owns the event loop, the ZeroMQ context, signals, config and logs; it knows nothing
of pipes or queues. A service binds its own sockets in ``start``, serves on the broker's loop,
and is told about config reloads and about peer brokers joining and leaving.

A service is a plug-in (zbroker.services finds it by its entry point) and owns what is its
own: its config section (``config_section``: schema, defaults, validation; ``restart_keys``:
what of it a reload cannot change), its metric families (``metric_families``), its lines of
``zbroker status`` (``status_lines``), its tables in ``zbroker top`` (``top_tables``), its
``zbroker`` sub-commands (``commands``) and what it tells the same service on peer brokers
(``features``, carried in the cluster's HELLO without the cluster knowing their meaning).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:  # (the interface needs none at run time: a service's cores import it)
    import asyncio

    import zmq

    from zbroker.command import Command
    from zbroker.top_table import TopTable


class ServiceError(Exception):
    """A service cannot start or apply a config; the message is for the operator."""


class ClusterNodeView(Protocol):
    """What a cluster port uses of the broker's cluster node (zbroker/cluster/node.py)."""

    id: str  # this broker's id among the members (its start id)

    def send(self, peer: str, service: str, frames: list[Any]) -> bool: ...

    def peers(self) -> list[dict[str, Any]]: ...

    def hint(self) -> str: ...

    @property
    def last_rtt(self) -> Mapping[str, float]: ...


class ClusterPort:
    """How a service reaches its counterparts on peer brokers, and what it may know of the
    cluster. Without a running cluster node, ``send`` returns False and the rest is empty."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.node: ClusterNodeView | None = None  # the broker's cluster node, once it runs

    def send(self, peer: str, frames: list[Any]) -> bool:
        """Send frames to this service on one peer (a ``PeerBroker.id``); False if it is gone."""
        return self.node is not None and self.node.send(peer, self.service, frames)

    def peers(self) -> list[dict[str, Any]]:
        return self.node.peers() if self.node is not None else []

    def member_id(self) -> str | None:
        """This broker's id among the members (the same at every member while it runs), or
        None without a cluster."""
        return self.node.id if self.node is not None else None

    def hint(self) -> str:
        """What may keep this broker from its peers, for a client whose wait timed out ("" if
        nothing is known, or without a cluster)."""
        return self.node.hint() if self.node is not None else ""

    def round_trips(self) -> Mapping[str, float]:
        """The last round trip to each peer, by member id (seconds; measured by heartbeats)."""
        return self.node.last_rtt if self.node is not None else {}


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
    #: each of its services' ``features()``, by service name, as its HELLO said them
    features: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False)
    #: the link numbers service messages (a message's order and loss are known)
    numbered: bool = False
    #: how people are told of it (``local@hosta (10.0.0.1)``): in logs and client errors
    label: str = field(default="", compare=False)

    def features_of(self, service: str) -> Mapping[str, Any]:
        """What the peer's ``service`` said it does ({} when it has no such service or is a
        broker that says nothing of it)."""
        return self.features.get(service) or {}


class Service(ABC):
    #: the key of the service's section under ``services:`` in the config (and the name of
    #: its entry point)
    name: str
    #: the frozen dataclass of that section, built of zbroker.config's ``setting`` and
    #: ``section``: its schema, defaults and validation. It must have an ``enabled`` setting
    #: (the broker starts the enabled services). It may define ``resolved(broker_name)``,
    #: returning the section with what depends on the broker's name filled in.
    config_section: ClassVar[type]
    #: keys that were elsewhere in the config and are the section's now: old dotted key ->
    #: key below the section; a file or ``zbroker set`` with the old name still works, and
    #: the broker and check-config say the new name
    moved_keys: ClassVar[Mapping[str, str]] = {}
    #: keys of the section (dotted, below it) that only change with a restart: a reload that
    #: changes one keeps its running value and names it ("restart needed for: ..."), a
    #: ``zbroker set`` of one is refused. ``enabled`` is always one.
    restart_keys: ClassVar[tuple[str, ...]] = ()
    #: services start in this order (then by name), stop in the reverse one, and their
    #: sections are listed so
    start_order: ClassVar[int] = 100

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
        """A peer broker left the cluster or was lost (that life of it ended)."""

    def peer_ended(self, peer: PeerBroker, alive: bool) -> None:
        """That life of a peer broker ended; ``alive``: the peer was running as it ended (it
        ended the life itself, e.g. it had lost us and started afresh): not a loss of the
        broker, which goes on serving. The broker calls this; by default it is
        :meth:`peer_left`, for a service to which why makes no difference."""
        self.peer_left(peer)

    def peer_message(self, peer: PeerBroker, frames: list[Any]) -> None:
        """A message from this service on a peer broker (frames as memoryviews)."""

    def status(self) -> dict[str, Any]:
        """What the service is doing, for management commands (JSON data)."""
        return {}

    @classmethod
    def status_lines(cls, status: Mapping[str, Any]) -> list[str]:
        """The lines of ``zbroker status`` for a ``status()`` (run by the command, not the
        broker; indented two spaces, the service's heading line is the command's). By
        default each key on a line of its own, a mapping of mappings one line per item."""
        return generic_status_lines(status)

    @classmethod
    def config_problems(cls, config: Any, run_dir: Path) -> list[str]:
        """Why the service could not start with ``config`` (the broker's whole config; its
        own run directory ``run_dir``), as far as can be told without binding, opening or
        making anything: one line each, naming the key(s) at fault. The broker checks these
        before it starts anything, and ``zbroker check-config`` shows them (as it shows the
        clashes of ``bound_endpoints``)."""
        return []

    @classmethod
    def held_descriptors(cls, config: Any) -> list[tuple[str, int]]:
        """Descriptors the service holds besides client connections (files, listeners), by
        what holds them, as the open-file limit's check tells them: none by default."""
        return []

    @classmethod
    def bound_endpoints(cls, config: Any, run_dir: Path) -> list[tuple[str, str]]:
        """(key, endpoint) of each endpoint the service binds with ``config``: the key names
        the setting (``services.zpipes.endpoint``), the endpoint is resolved (``{name}``
        filled in). A config in which two endpoints of any services meet is refused."""
        return []

    @classmethod
    def largest_message(cls, section: Any) -> int:
        """The largest payload the service takes with its section ``section`` (a pipe's
        chunk, a queue's message): a message to peer brokers may be that large."""
        return 0

    @classmethod
    def commands(cls) -> list[Command]:
        """The ``zbroker`` sub-commands this service gives (zbroker/command.py): ``zbroker
        NAME ...`` runs one, and ``--help``, the man page and the completion list them. A
        command should import what it needs when it runs, not when it is listed."""
        return []

    @classmethod
    def top_tables(cls, status: Mapping[str, Any], before: Mapping[str, Any] | None,
                   interval: float | None) -> list[TopTable]:
        """The tables ``zbroker top`` shows for this service, from its ``status()`` now and
        ``interval`` seconds before (None, None: the first sample): rates from the two, the
        busiest rows first (zbroker/top_table.py has the rates and the cells). No I/O."""
        return []

    def features(self) -> dict[str, Any]:
        """What this service tells the same service on peer brokers when they meet (JSON
        data: which messages it understands, say). A peer's are ``PeerBroker.features_of``;
        a peer without the service, or of a version before it, says {}."""
        return {}

    def metrics(self) -> dict[str, Any]:
        """Counters for the metrics endpoint and ``zbroker top``, as plain data (numbers,
        lists, dicts). Called on the event loop, at scrape time only: it may walk the
        service's state, but keeps nothing."""
        return {}

    @classmethod
    def metric_families(cls, metrics: Mapping[str, Any],
                        broker: Mapping[str, Any]) -> list[Any]:
        """The Prometheus metric families (prometheus_client ``Metric``s, named
        ``zbroker_<service>_...``) of a ``metrics()`` snapshot; ``broker`` is the broker's
        whole snapshot (its ``pipe_series``, say). No I/O: run on the endpoint's thread."""
        return []


def _show(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return "true" if value else "false" if value is False else "null"
    return str(value)


def _fields(data: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {_show(v)}" for k, v in data.items())


def generic_status_lines(status: Mapping[str, Any]) -> list[str]:
    """``key: value`` lines of a status, what has no ``status_lines`` of its own shows."""
    lines = []
    for key, value in status.items():
        if isinstance(value, Mapping) and value and all(isinstance(v, Mapping)
                                                        for v in value.values()):
            lines.append(f"  {key}: {len(value)}")
            for item, fields in value.items():
                lines.append(f"    {item}: {_fields(fields)}")
        elif isinstance(value, Mapping):
            lines.append(f"  {key}: {_fields(value) if value else 'none'}")
        else:
            lines.append(f"  {key}: {_show(value)}")
    return lines
