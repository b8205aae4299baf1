"""The pzq service of the broker: the queues of ``services.pzq``, each a QueueServer.

In a cluster, the service tells every peer that joins which queues it hosts (QUEUES) and
routes the peers' replication messages to the queue they name (replication.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zmq

from zbroker.command import Command
from zbroker.service import ClusterPort, PeerBroker, Service, ServiceContext, ServiceError
from zbroker.services.pzq.core import peering
from zbroker.top_table import TopTable

from .commands import QUEUE
from .config import PzqConfig
from .host_names import HostNames
from .server import QueueServer
from .settings import QueueError, QueueSettings, default_data_dir
from .sockets import ZERO_COPY_MIN

#: a queue's lease (replication.py's fence) is the cluster's peer_timeout over this: an
#: origin stops delivering well before its holders may take its copies over (a peer is lost
#: after peer_timeout of silence), and those that were only cut off for less deliver again
LEASE_PARTS = 4


def queue_settings(config: Any, run_dir: Path) -> list[QueueSettings]:
    """Every configured queue, resolved: data directories, monitor endpoints. Raises
    ServiceError with the first of ``queue_problems``."""
    problems = queue_problems(config, run_dir)
    if problems:
        raise ServiceError(problems[0])
    return resolved_queues(config, run_dir)


def resolved_queues(config: Any, run_dir: Path) -> list[QueueSettings]:
    """Every configured queue as it would run (unchecked): ``{name}`` filled in, the data
    directories and monitor endpoints of those that name none."""
    broker = config.broker.name
    out = []
    for name, q in config.services.pzq.queue_configs().items():
        data_dir = (Path(q.data_dir.replace("{name}", broker)).expanduser() if q.data_dir
                    else default_data_dir(broker, name))
        monitor = q.monitor_endpoint or default_monitor_endpoint(run_dir, broker, name)
        fields = {f.name for f in dataclasses.fields(QueueSettings)}
        values = {k: v for k, v in dataclasses.asdict(q).items() if k in fields}
        values.update(name=name, data_dir=data_dir.absolute(),
                      monitor_endpoint=monitor.replace("{name}", broker),
                      receive_endpoint=q.receive_endpoint.replace("{name}", broker),
                      send_endpoint=q.send_endpoint.replace("{name}", broker))
        for key in ("stream_endpoint", "credit_endpoint"):
            if values.get(key):
                values[key] = values[key].replace("{name}", broker)
        out.append(QueueSettings(**values))
    return out


def queue_keys(config: Any) -> Callable[[str, str], str]:
    """``key_of(queue, key)``: the dotted key a queue's setting comes from, the queue's own or
    the defaults' (each queue's own settings read once: a check asks for every key of each of
    thousands of queues)."""
    own = {name: dict(items) for name, items in (config.services.pzq.queues or ())}

    def key_of(queue: str, key: str) -> str:
        if key in own.get(queue, {}):
            return f"services.pzq.queues.{queue}.{key}"
        return f"services.pzq.defaults.{key} (queue {queue!r})"

    return key_of


def queue_endpoints(config: Any, run_dir: Path) -> list[tuple[str, str]]:
    """(key, endpoint) of every endpoint the queues bind."""
    out = []
    key_of = queue_keys(config)
    for s in resolved_queues(config, run_dir):
        used = ["receive_endpoint", "send_endpoint", "monitor_endpoint"]
        if s.mode == "stream":
            used.append("stream_endpoint")
        elif s.credit_endpoint:
            used.append("credit_endpoint")
        out += [(key_of(s.name, what), str(getattr(s, what))) for what in used]
    return out


def queue_problems(config: Any, run_dir: Path) -> list[str]:
    """Why the queues could not run as configured (no endpoint clashes: ``queue_endpoints``
    are checked with every service's), one line each naming the key."""
    from zbroker.config_checks import directory_problem

    problems = []
    cluster = config.cluster.enabled
    by_dir: dict[Path, str] = {}
    key_of = queue_keys(config)
    for s in resolved_queues(config, run_dir):
        q = s.name
        if s.replicas > len(s.peers) and (s.peers or not cluster):
            problems.append(
                f"{key_of(q, 'replicas')}: {s.replicas} needs "
                + (f"at least as many peers (has {len(s.peers)}) in "
                   f"{key_of(q, 'peers')}" if s.peers
                   else "a cluster (cluster.enabled: true) or static peers"))
        else:
            try:
                s.check(cluster=cluster)
            except QueueError as exc:
                problems.append(f"services.pzq: {exc}")
        if s.data_dir in by_dir:
            problems.append(f"{key_of(by_dir[s.data_dir], 'data_dir')} and "
                            f"{key_of(q, 'data_dir')} both use {s.data_dir}: give "
                            "each queue its own data_dir")
        by_dir.setdefault(s.data_dir, q)
        problem = directory_problem(key_of(q, "data_dir"), s.data_dir)
        if problem:
            problems.append(problem)
    return problems


def default_monitor_endpoint(run_dir: Path, broker: str, queue: str) -> str:
    """``ipc://<run_dir>/<queue>.monitor``; when that path is too long for a Unix socket
    address, the abstract socket ``ipc://@/zbroker/<broker>/pzq/<queue>.monitor``."""
    path = f"{run_dir}/{queue}.monitor"
    if len(path.encode()) <= getattr(zmq, "IPC_PATH_MAX_LEN", 107):
        return f"ipc://{path}"
    return f"ipc://@/zbroker/{broker}/pzq/{queue}.monitor"


#: descriptors a queue holds: its receive, send and monitor listeners, its log's lock and
#: open segment; and for each replica, the log of the copies a peer holds for it
QUEUE_DESCRIPTORS = 5
REPLICA_DESCRIPTORS = 1


class PzqService(Service):
    name = "pzq"
    start_order = 20
    config_section = PzqConfig
    #: a queue's settings are its sockets', its log's and its cores' from their start: a
    #: reload keeps them and names them ("restart needed for: ...")
    restart_keys = ("defaults", "queues")

    @classmethod
    def config_problems(cls, config: Any, run_dir: Path) -> list[str]:
        return queue_problems(config, run_dir)

    @classmethod
    def bound_endpoints(cls, config: Any, run_dir: Path) -> list[tuple[str, str]]:
        return queue_endpoints(config, run_dir)

    @classmethod
    def held_descriptors(cls, config: Any) -> list[tuple[str, int]]:
        queues = config.services.pzq.queue_configs()
        held = sum(QUEUE_DESCRIPTORS + q.replicas * REPLICA_DESCRIPTORS
                   for q in queues.values())
        return [(f"{len(queues)} queues' sockets and files", held)] if queues else []

    @classmethod
    def largest_message(cls, section: PzqConfig) -> int:
        return max(q.max_message_size for q in section.queue_configs().values())

    @classmethod
    def metric_families(cls, metrics: Mapping[str, Any],
                        broker: Mapping[str, Any]) -> list[Any]:
        from .metrics import families

        return families(metrics.get("queues", {}))

    @classmethod
    def commands(cls) -> list[Command]:
        return [QUEUE]  # (its modules are imported when it is used)

    @classmethod
    def top_tables(cls, status: Mapping[str, Any], before: Mapping[str, Any] | None,
                   interval: float | None) -> list[TopTable]:
        from .top import tables

        return tables(status, before, interval)

    def __init__(self) -> None:
        self.queues: dict[str, QueueServer] = {}
        self._log: Any = None
        self._cluster: ClusterPort | None = None
        self._hosts = HostNames()  # which broker a peer's life or a node id is on (logs)

    async def start(self, ctx: ServiceContext, config: Any) -> None:
        self._log = ctx.log
        self._cluster = ctx.cluster if config.cluster.enabled else None
        try:
            for settings in queue_settings(config, ctx.run_dir):
                server = QueueServer(settings, ctx.zmq_context, ctx.loop, ctx.log,
                                     cluster=self._cluster,
                                     rejoin_grace=2 * config.cluster.peer_timeout,
                                     lease=config.cluster.peer_timeout / LEASE_PARTS,
                                     name_hosts=self._hosts.name)
                await server.start()
                self.queues[settings.name] = server
        except QueueError as exc:
            await self.stop()
            raise ServiceError(str(exc)) from None
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        queues, self.queues = list(self.queues.values()), {}
        for server in reversed(queues):
            await server.stop()

    def reload(self, new: Any, old: Any) -> None:
        pass  # (every setting of its own is a restart key: see restart_keys)

    # --- the cluster -------------------------------------------------------------------------

    def peer_joined(self, peer: PeerBroker) -> None:
        self._hosts.learn(peer.id, peer.label)
        if self._cluster is not None and self.queues:
            hosted = {name: q.node_id for name, q in self.queues.items()}
            self._cluster.send(peer.id, peering.encode(peering.Queues(hosted)))

    def peer_ended(self, peer: PeerBroker, alive: bool) -> None:
        for q in self.queues.values():
            q.peer_gone(peer.id, alive)

    def peer_message(self, peer: PeerBroker, frames: list[Any]) -> None:
        kind = bytes(frames[0]) if frames else b""
        if kind == peering.COPY:  # big bodies stay in the frame they came in (decode checks)
            frames = [bytes(f) if i < 3 or len(f) < ZERO_COPY_MIN else f
                      for i, f in enumerate(frames)]
        else:
            frames = [bytes(f) for f in frames]
        if kind == peering.QUEUES:
            msg = peering.decode(frames)
            if isinstance(msg, peering.Queues):
                for name, node_id in msg.hosted.items():
                    self._hosts.learn(node_id, peer.label)
                    q = self.queues.get(name)
                    if q is not None:
                        q.peer_hosts(peer.id, node_id)
                return
        elif len(frames) >= 2:
            q = self.queues.get(frames[1].decode(errors="replace"))
            if q is None or q.cluster_message(peer.id, frames):
                return  # a queue we do not host: its copies are not for us
        self._log.warning("pzq malformed message from a peer", peer=peer.name,
                          kind=kind[:20].decode(errors="replace"))

    def metrics(self) -> dict[str, Any]:
        """Each queue's counters, with its histograms and refusals by kind."""
        return {"queues": {name: {**q.counters(), **q.metrics()}
                           for name, q in self.queues.items()}}

    def status(self) -> dict[str, Any]:
        return {name: {"receive": q.settings.receive_endpoint, "send": q.settings.send_endpoint,
                       "monitor": q.settings.monitor_endpoint, "mode": q.settings.mode,
                       **({"stream": q.settings.stream_endpoint} if q.stream is not None
                          else {}),
                       **({"credit": q.settings.credit_endpoint}
                          if q.settings.credit_endpoint and q.stream is None else {}),
                       **q.counters()}
                for name, q in self.queues.items()}

