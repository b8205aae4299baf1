"""The broker process: one event loop, one ZeroMQ context, the enabled services, signals.

    SIGINT, SIGTERM   stop every service (each within STOP_TIMEOUT), end the context, exit 0
    SIGHUP            re-read the config; every service reloads it, logging is re-configured
                      and the log file reopened. A config that fails to load, changes what
                      needs a restart, or that a service refuses, is refused as a whole: the
                      broker logs why and keeps running on the config it has.

The broker knows nothing of pipes or queues: it starts each service of the registry whose
config section (``services.<name>``) is enabled, gives it a ServiceContext, and relays
stop and reload.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zmq

from . import logs
from .config import Config, ConfigError, config_diff, load_config
from .service import ClusterPort, Peer, Service, ServiceContext, ServiceError

START_TIMEOUT = 60.0  # seconds each service has to start
STOP_TIMEOUT = 5.0  # seconds each service has to stop
#: keys a running broker cannot change; SIGHUP refuses a config that changes them
RESTART_KEYS = ("broker.name", "broker.run_dir")


class StartupError(Exception):
    """The broker cannot start; the message is for the operator."""


def make_private_dir(path: Path) -> list[Path]:
    """Create ``path`` and missing parents with mode 0700; returns the directories created.

    Raises StartupError if it cannot, or if ``path`` belongs to another user, or its parent
    to another user than root (someone else could then swap it).
    """
    created: list[Path] = []
    try:
        for p in reversed([p for p in (path, *path.parents) if not p.exists()]):
            try:
                p.mkdir(mode=0o700)
                created.append(p)
            except FileExistsError:  # made meanwhile by someone else: checked below
                pass
        st = path.stat()
        parent_uid = path.parent.stat().st_uid
    except OSError as exc:
        raise StartupError(f"cannot create run directory {str(path)!r}: "
                           f"{exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise StartupError(f"run directory {str(path)!r} exists and is not a directory")
    uid = os.geteuid()
    if st.st_uid != uid or parent_uid not in (uid, 0):
        owner = st.st_uid if st.st_uid != uid else parent_uid
        raise StartupError(f"run directory {str(path)!r} or its parent belongs to another user "
                           f"(uid {owner}); set broker.run_dir to a directory of your own")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return created


class Broker:
    """Hosts the enabled services of ``registry`` (name -> Service class) under ``config``.

    ``config_path`` and ``overrides`` are what ``config`` was loaded from; SIGHUP loads the
    config again from them (with no path: the same search as at start).
    """

    def __init__(self, config: Config, *, config_path: str | os.PathLike[str] | None = None,
                 overrides: Mapping[str, Any] | None = None,
                 registry: Mapping[str, type[Service]] | None = None):
        if registry is None:
            from .services import SERVICES as registry
        self.config = config
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self.registry = dict(registry)
        self.name = config.broker.name
        self.log = logs.get_logger()
        self.services: list[Service] = []  # the started ones, in start order
        self.zmq_context: zmq.Context | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._created_dirs: list[Path] = []
        self._signals: list[int] = []
        self.cluster: Any = None  # the cluster node, when config.cluster.enabled
        self._ports: list[ClusterPort] = []

    # --- life cycle ------------------------------------------------------------------------

    def run_forever(self) -> int:
        """Run the broker until SIGINT or SIGTERM; returns the exit code (0).
        Raises StartupError or ServiceError if it cannot start."""
        return asyncio.run(self.run())

    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        self._install_signal_handlers()
        try:
            await self.start()
            self.log.info("broker started", name=self.name, pid=os.getpid(),
                          services=[s.name for s in self.services],
                          endpoints=self.endpoints(),
                          config=str(self.config.source) if self.config.source else "defaults")
            await self._stop_requested.wait()
        finally:
            await self.stop()
            self._remove_signal_handlers()
        self.log.info("broker stopped", name=self.name)
        return 0

    async def start(self) -> None:
        """Start every enabled service. On failure, stops those already started, releases
        everything and raises (StartupError, ServiceError, or a bug's own exception)."""
        self.loop = asyncio.get_running_loop()
        wanted = self._enabled_services(self.config)
        if not wanted:
            self.log.warning("no service is enabled", name=self.name)
        self._created_dirs = make_private_dir(self.config.broker.run_dir)
        self.zmq_context = zmq.Context()
        try:
            for name in wanted:
                service = self.registry[name]()
                run_dir = self.config.broker.run_dir / name
                self._created_dirs += make_private_dir(run_dir)
                port = ClusterPort(name)
                self._ports.append(port)
                ctx = ServiceContext(broker_name=self.name, zmq_context=self.zmq_context,
                                     loop=self.loop, log=logs.get_logger(service=name),
                                     run_dir=run_dir, cluster=port)
                self.log.debug("starting service", service=name)
                try:
                    await asyncio.wait_for(service.start(ctx, self.config), START_TIMEOUT)
                except TimeoutError:
                    raise ServiceError(f"service {name!r} did not start within "
                                       f"{START_TIMEOUT:g} seconds") from None
                self.services.append(service)
            if self.config.cluster.enabled:
                await self._start_cluster()
        except BaseException:
            await self.stop()
            raise

    async def _start_cluster(self) -> None:
        from .cluster.node import ClusterError, ClusterNode

        by_name = {service.name: service for service in self.services}

        def on_message(peer: Peer, service: str, frames: list[Any]) -> None:
            target = by_name.get(service)
            if target is not None:
                target.peer_message(peer, frames)

        node = ClusterNode(
            self.config.cluster, self.name, self.zmq_context, self.loop,
            logs.get_logger(component="cluster"),
            on_join=lambda peer: [s.peer_joined(peer) for s in self.services],
            on_leave=lambda peer, why: [s.peer_left(peer) for s in self.services],
            on_message=on_message)
        try:
            await node.start()
        except ClusterError as exc:
            raise StartupError(str(exc)) from None
        self.cluster = node
        for port in self._ports:
            port.node = node

    async def stop(self) -> None:
        """Stop the started services (last started first), then end the ZeroMQ context.
        Never hangs: a service gets STOP_TIMEOUT seconds. Safe to call twice."""
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            for port in self._ports:
                port.node = None
            try:
                await asyncio.wait_for(cluster.stop(), STOP_TIMEOUT)
            except Exception:
                self.log.exception("cluster failed to stop")
        self._ports = []
        while self.services:
            service = self.services.pop()
            try:
                await asyncio.wait_for(service.stop(), STOP_TIMEOUT)
            except TimeoutError:
                self.log.error("service did not stop in time", service=service.name,
                               timeout=STOP_TIMEOUT)
            except Exception:
                self.log.exception("service failed to stop", service=service.name)
        if self.zmq_context is not None:
            self.zmq_context.destroy(linger=0)
            self.zmq_context = None
        for path in reversed(self._created_dirs):
            try:
                path.rmdir()  # only if empty: leave what a service chose to keep
            except OSError:
                pass
        self._created_dirs = []

    def request_stop(self, reason: str = "requested") -> None:
        """Ask a running broker to stop (as SIGTERM does)."""
        if self._stop_requested is None:
            return
        if self._stop_requested.is_set():
            self.log.info("already stopping", reason=reason)
            return
        self.log.info("stopping", reason=reason)
        self._stop_requested.set()

    def endpoints(self) -> list[str]:
        """Where the started services listen, as they report it (``status()["endpoint"]``)."""
        found: list[str] = []
        for service in self.services:
            status = service.status()
            if "endpoint" in status:
                found.append(str(status["endpoint"]))
            found += [str(e) for e in status.get("endpoints", ())]
        return found

    # --- reload ----------------------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the config and apply it, all or nothing. True if applied."""
        old = self.config
        try:
            new = load_config(self.config_path, self.overrides, schema=type(self.config))
        except ConfigError as exc:
            self.log.error("config reload refused", reason=str(exc))
            return False
        changed = config_diff(old, new)
        fixed = [k for k in changed if k in RESTART_KEYS or k.startswith("cluster.")
                 or (k.startswith("services.") and k.endswith(".enabled"))]
        if fixed:
            self.log.error("config reload refused",
                           reason="these keys only change with a restart: " + ", ".join(fixed))
            return False
        applied: list[Service] = []
        for service in self.services:
            try:
                service.reload(new, old)
            except Exception as exc:
                if isinstance(exc, ServiceError):
                    self.log.error("config reload refused", service=service.name,
                                   reason=str(exc))
                else:
                    self.log.exception("config reload refused: service failed",
                                       service=service.name)
                self._roll_back(applied, old, new)
                return False
            applied.append(service)
        try:
            logs.configure(new.log.level, new.log.format, new.log.file)
        except OSError as exc:
            self._roll_back(applied, old, new)
            self.log.error("config reload refused",
                           reason=f"cannot open log file {str(new.log.file)!r}: {exc.strerror}")
            return False
        self.config = new
        self.log.info("config reloaded",
                      config=str(new.source) if new.source else "defaults", changed=changed)
        return True

    def _roll_back(self, applied: list[Service], old: Config, new: Config) -> None:
        for service in reversed(applied):
            try:
                service.reload(old, new)
            except Exception:
                self.log.exception("service failed to return to the previous config",
                                   service=service.name)

    # --- helpers ---------------------------------------------------------------------------

    def _enabled_services(self, config: Config) -> list[str]:
        names = []
        for name in self.registry:
            section = getattr(config.services, name, None)
            if section is None:
                raise StartupError(f"service {name!r} has no config section 'services.{name}'")
            if section.enabled:
                names.append(name)
        return names

    def _install_signal_handlers(self) -> None:
        assert self.loop is not None
        for signum, handler, arg in (
            (signal.SIGTERM, self.request_stop, "SIGTERM"),
            (signal.SIGINT, self.request_stop, "SIGINT"),
            (signal.SIGHUP, self._on_sighup, None),
        ):
            if arg is None:
                self.loop.add_signal_handler(signum, handler)
            else:
                self.loop.add_signal_handler(signum, handler, arg)
            self._signals.append(signum)

    def _remove_signal_handlers(self) -> None:
        if self.loop is not None:
            for signum in self._signals:
                self.loop.remove_signal_handler(signum)
        self._signals = []

    def _on_sighup(self) -> None:
        self.log.info("SIGHUP: reloading config")
        self.reload()
