"""The services the broker hosts: which are enabled, their start (in the registry's order,
each within a time, in a run directory of its own, with a ServiceContext and a cluster port),
their stop (the reverse order), and what peer brokers do, relayed to them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zmq

from zbroker import logs
from zbroker.config import Config
from zbroker.service import ClusterPort, PeerBroker, Service, ServiceContext, ServiceError

from .startup import StartupError, make_private_dir


class HostedServices:
    """The services of ``registry`` (name -> Service class) that a config enables; ``log``
    is the broker's."""

    def __init__(self, registry: Mapping[str, type[Service]], log: Any) -> None:
        self.registry = dict(registry)
        self.log = log
        self.started: list[Service] = []  # in start order
        self.ports: list[ClusterPort] = []  # the started services' (and the one starting)
        self._created_dirs: list[Path] = []  # their run directories, as made

    def enabled(self, config: Config) -> list[str]:
        """The names of the services ``config`` enables, in the registry's order."""
        names = []
        for name in self.registry:
            section = getattr(config.services, name, None)
            if section is None:
                raise StartupError(f"service {name!r} has no config section 'services.{name}'")
            if section.enabled:
                names.append(name)
        return names

    def needs_restart(self, key: str) -> bool:
        """Whether a service's ``key`` only changes with a restart: ``enabled``, and each
        service's ``restart_keys`` (a section's: every key in it)."""
        return any(key == fixed or key.startswith(fixed + ".")
                   for name, service in self.registry.items()
                   for fixed in (f"services.{name}.{k}" for k in ("enabled",
                                                                   *service.restart_keys)))

    def largest_payload(self, config: Config) -> int:
        """The largest payload a service here takes: a pipe's chunk, a queue's message."""
        return max((self.registry[name].largest_message(getattr(config.services, name))
                    for name in self.enabled(config)), default=0)

    async def start(self, names: list[str], config: Config, *, broker_name: str,
                    zmq_context: zmq.Context[Any], loop: asyncio.AbstractEventLoop,
                    timeout: float) -> None:
        """Start the services ``names``, in that order, each within ``timeout`` seconds.
        Raises at the first that does not (StartupError, ServiceError, or a bug's own
        exception); those started are in ``started``, for ``stop``."""
        for name in names:
            service = self.registry[name]()
            assert config.broker.run_dir is not None  # (resolved as the config loads)
            run_dir = config.broker.run_dir / name
            self._created_dirs += make_private_dir(run_dir)
            port = ClusterPort(name)
            self.ports.append(port)
            ctx = ServiceContext(broker_name=broker_name, zmq_context=zmq_context,
                                 loop=loop, log=logs.get_logger(service=name),
                                 run_dir=run_dir, cluster=port)
            self.log.debug("starting service", service=name)
            try:
                await asyncio.wait_for(service.start(ctx, config), timeout)
            except TimeoutError:
                raise ServiceError(f"service {name!r} did not start within "
                                   f"{timeout:g} seconds") from None
            self.started.append(service)

    async def stop(self, timeout: float) -> None:
        """Stop the started services, last started first, each within ``timeout`` seconds
        (one that does not, or fails, is logged). Safe to call twice."""
        self.ports = []
        while self.started:
            service = self.started.pop()
            try:
                await asyncio.wait_for(service.stop(), timeout)
            except TimeoutError:
                self.log.error("service did not stop in time", service=service.name,
                               timeout=timeout)
            except Exception:
                self.log.exception("service failed to stop", service=service.name)

    def take_created_dirs(self) -> list[Path]:
        """The run directories made for the services, in the order made (forgotten here)."""
        created, self._created_dirs = self._created_dirs, []
        return created

    def endpoints(self) -> list[str]:
        """Where the started services listen, as they report it (``status()["endpoint"]``)."""
        found: list[str] = []
        for service in self.started:
            status = service.status()
            if "endpoint" in status:
                found.append(str(status["endpoint"]))
            found += [str(e) for e in status.get("endpoints", ())]
        return found

    def status(self) -> dict[str, Any]:
        return {s.name: s.status() for s in self.started}

    def metrics(self) -> dict[str, Any]:
        return {s.name: s.metrics() for s in self.started}

    # --- what peer brokers do, relayed ------------------------------------------------------

    def features(self) -> dict[str, Any]:
        """What each service tells the same service on peer brokers (the cluster's HELLO)."""
        return {service.name: service.features() for service in self.started}

    def peer_joined(self, peer: PeerBroker) -> None:
        for service in self.started:
            service.peer_joined(peer)

    def peer_left(self, peer: PeerBroker, alive: bool = False) -> None:
        for service in self.started:
            service.peer_ended(peer, alive)

    def message_relay(self) -> Callable[[PeerBroker, str, list[Any]], None]:
        """What to do with a peer's message to a service: given to the service of that name
        among those started now (a message to another is dropped)."""
        by_name = {service.name: service for service in self.started}

        def on_message(peer: PeerBroker, service: str, frames: list[Any]) -> None:
            target = by_name.get(service)
            if target is not None:
                target.peer_message(peer, frames)

        return on_message
