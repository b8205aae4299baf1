"""The broker process: one event loop, one ZeroMQ context, the enabled services, signals.

    SIGINT, SIGTERM   stop every service (each within STOP_TIMEOUT), end the context, exit 0
    SIGHUP            re-read the config; every service reloads it, logging is re-configured
                      and the log file reopened. A config that fails to load, changes what
                      needs a restart, or that a service refuses, is refused as a whole: the
                      broker logs why and keeps running on the config it has.

While it runs, the broker answers management commands (status, get, set, reload, stop, logs)
on ``<run_dir>/ctl`` (zbroker.management). ``set`` applies one setting through the same path
as a reload; it lasts until the next reload re-reads the file.

The broker knows nothing of pipes or queues: it starts each service of the registry (the
plug-ins installed, zbroker.services) whose config section (``services.<name>``) is enabled,
gives it a ServiceContext, and relays stop and reload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zmq

from zbroker import logs
from zbroker.runtime import event_loop, heap
from zbroker.runtime.limits import raise_open_file_limit

from .config import Config, ConfigError, config_diff, iter_settings, load_config, with_setting
from .management import CommandError, ControlServer
from .service import ClusterPort, PeerBroker, Service, ServiceContext, ServiceError
from .zmtp.admission import PROCESS_BUDGET

START_TIMEOUT = 60.0  # seconds each service has to start
STOP_TIMEOUT = 5.0  # seconds each service has to stop
LOG_FLUSH_INTERVAL = 1.0  # seconds between writing the counts of collapsed repeated warnings
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
            from .services import installed

            registry = installed()
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
        self.control: ControlServer | None = None
        self.cluster: Any = None  # the cluster node, when config.cluster.enabled
        self._ports: list[ClusterPort] = []
        self._flusher: asyncio.TimerHandle | None = None
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self.reloads = {"ok": 0, "refused": 0}  # config reloads by result (metrics)
        self.metrics: Any = None  # the metrics endpoint (zbroker.metrics), when metrics.bind
        self._build: tuple[str, str] | None = None  # (zbroker version, Python version)

    # --- life cycle ------------------------------------------------------------------------

    def run_forever(self) -> int:
        """Run the broker until SIGINT or SIGTERM; returns the exit code (0).
        Raises StartupError or ServiceError if it cannot start."""
        heap.keep_freed_memory()  # large bodies come and go: no page faults for each new one
        return event_loop.run(self.run())

    def _log_loop_errors(self) -> None:
        """Exceptions no code of ours caught (in a protocol's callback the loop then closes
        that connection) go to the broker's log, with their traceback, not only to standard
        error."""
        def log_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            self.log.error("unexpected error", what=str(context.get("message", ""))[:200],
                           **({"exc_info": exc} if exc is not None else {}))

        self.loop.set_exception_handler(log_error)

    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        self._log_loop_errors()
        self._stop_requested = asyncio.Event()
        self._install_signal_handlers()
        try:
            await self.start()
            self._start_control()
            self._start_metrics()
            self.log.info("broker started", name=self.name, pid=os.getpid(),
                          services=[s.name for s in self.services],
                          endpoints=self.endpoints(),
                          config=str(self.config.source) if self.config.source else "defaults",
                          event_loop=event_loop.chosen())
            self._flusher = self.loop.call_later(LOG_FLUSH_INTERVAL, self._flush_logs)
            await self._stop_requested.wait()
        finally:
            if self._flusher is not None:
                self._flusher.cancel()
                self._flusher = None
            logs.flush_repeats(everything=True)
            await self.stop()
            self._remove_signal_handlers()
        self.log.info("broker stopped", name=self.name)
        return 0

    def _flush_logs(self) -> None:
        """Every LOG_FLUSH_INTERVAL: the counts of collapsed repeated warnings that are due."""
        logs.flush_repeats()
        self._flusher = self.loop.call_later(LOG_FLUSH_INTERVAL, self._flush_logs)

    async def start(self) -> None:
        """Start every enabled service. On failure, stops those already started, releases
        everything and raises (StartupError, ServiceError, or a bug's own exception)."""
        self.loop = asyncio.get_running_loop()
        wanted = self._enabled_services(self.config)
        if not wanted:
            self.log.warning("no service is enabled", name=self.name)
        self._created_dirs = make_private_dir(self.config.broker.run_dir)
        open_files = raise_open_file_limit()
        self.log.debug("open-file limit", soft=open_files)
        # every ZMTP endpoint of every service draws on one budget of connections
        PROCESS_BUDGET.set_limit(self.config.clients.max_clients,
                                 self.config.clients.max_per_source)
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

    def _largest_payload(self) -> int:
        """The largest payload a service here takes: a pipe's chunk, a queue's message."""
        return max((self.registry[name].largest_message(getattr(self.config.services, name))
                    for name in self._enabled_services(self.config)), default=0)

    async def _start_cluster(self) -> None:
        from .cluster.node import ClusterError, ClusterNode, message_limit

        by_name = {service.name: service for service in self.services}

        def on_message(peer: PeerBroker, service: str, frames: list[Any]) -> None:
            target = by_name.get(service)
            if target is not None:
                target.peer_message(peer, frames)

        node = ClusterNode(
            self.config.cluster, self.name, self.zmq_context, self.loop,
            logs.get_logger(component="cluster"),
            on_join=lambda peer: [s.peer_joined(peer) for s in self.services],
            on_leave=lambda peer, why: [s.peer_left(peer) for s in self.services],
            on_message=on_message, max_message=message_limit(self._largest_payload()),
            features={service.name: service.features() for service in self.services})
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
        control, self.control = self.control, None
        if control is not None:
            control.stop()
        metrics, self.metrics = self.metrics, None
        if metrics is not None:
            await asyncio.get_running_loop().run_in_executor(None, metrics.stop)
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
        if control is not None:
            control.release()
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
        return self.try_reload() is None

    def try_reload(self) -> str | None:
        """Re-read the config and apply it, all or nothing: None if applied, else why not
        (also logged). The log file is reopened either way (log rotation)."""
        try:
            new = load_config(self.config_path, self.overrides, schema=type(self.config))
        except ConfigError as exc:
            self._reopen_log()
            self.log.error("config reload refused", reason=str(exc))
            self.reloads["refused"] += 1
            return str(exc)
        reason = self.apply_config(new)
        if reason is not None:
            self._reopen_log()
        self.reloads["ok" if reason is None else "refused"] += 1
        return reason

    def _reopen_log(self) -> None:
        """Reopen the log file with the settings in force (a refused reload still lets
        logrotate's SIGHUP move the broker to the new file)."""
        log = self.config.log
        try:
            logs.configure(log.level, log.format, log.file, syslog=log.syslog)
        except (OSError, ValueError) as exc:
            self.log.error("cannot reopen the log file", file=str(log.file), reason=str(exc))

    def apply_config(self, new: Config, what: str = "config reload") -> str | None:
        """Apply ``new`` to the services and logging, all or nothing (SIGHUP, ``zbroker
        reload``, ``zbroker set``): None if applied, else why not (also logged)."""
        old = self.config
        changed = config_diff(old, new)
        fixed = [k for k in changed if k in RESTART_KEYS or k.startswith("cluster.")
                 or self._needs_restart(k)]
        if fixed:
            reason = "these keys only change with a restart: " + ", ".join(fixed)
            self.log.error(f"{what} refused", reason=reason)
            return reason
        new_metrics = None
        if new.metrics.bind != old.metrics.bind and self.loop is not None \
                and new.metrics.bind is not None:
            # the new address is bound first: a reload that cannot bind it is refused whole
            from .metrics import MetricsError

            try:
                new_metrics = self._metrics_server(new.metrics.bind)
            except MetricsError as exc:
                self.log.error(f"{what} refused", reason=str(exc))
                return str(exc)
        applied: list[Service] = []
        for service in self.services:
            try:
                service.reload(new, old)
            except Exception as exc:
                if isinstance(exc, ServiceError):
                    self.log.error(f"{what} refused", service=service.name, reason=str(exc))
                    reason = f"service {service.name}: {exc}"
                else:
                    self.log.exception(f"{what} refused: service failed",
                                       service=service.name)
                    reason = f"service {service.name} failed: {exc!r}"
                self._roll_back(applied, old, new, new_metrics)
                return reason
            applied.append(service)
        try:
            logs.configure(new.log.level, new.log.format, new.log.file,
                           syslog=new.log.syslog)
        except (OSError, ValueError) as exc:
            self._roll_back(applied, old, new, new_metrics)
            if isinstance(exc, OSError):
                reason = f"cannot open log file {str(new.log.file)!r}: {exc.strerror}"
            else:
                reason = str(exc)
            self.log.error(f"{what} refused", reason=reason)
            return reason
        self.config = new
        PROCESS_BUDGET.set_limit(new.clients.max_clients, new.clients.max_per_source)
        if new.metrics.bind != old.metrics.bind and self.loop is not None:
            if self.metrics is not None:
                self.metrics.stop(wait=False)
            self.metrics = new_metrics
            self.log.info("metrics endpoint moved" if new_metrics else "metrics endpoint off",
                          **({"url": new_metrics.url} if new_metrics else {}))
            if new.metrics.bind is not None:
                self._warn_if_exposed(new.metrics.bind)
        if self.cluster is not None:  # a pipe's chunk or a queue's message may be larger now
            from .cluster.node import message_limit

            self.cluster.set_max_message(message_limit(self._largest_payload()))
        if what == "config reload":
            self.log.info("config reloaded",
                          config=str(new.source) if new.source else "defaults", changed=changed)
        else:
            self.log.info(f"{what} applied", changed=changed)
        return None

    def _roll_back(self, applied: list[Service], old: Config, new: Config,
                   new_metrics: Any = None) -> None:
        if new_metrics is not None:
            new_metrics.stop(wait=False)
        for service in reversed(applied):
            try:
                service.reload(old, new)
            except Exception:
                self.log.exception("service failed to return to the previous config",
                                   service=service.name)

    # --- management ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What the broker is doing, for ``zbroker status``."""
        log = self.config.log
        return {
            "name": self.name,
            "pid": os.getpid(),
            "started": self.started_at,
            "uptime": round(time.monotonic() - self._started_mono, 3),
            "config": str(self.config.source) if self.config.source else None,
            "run_dir": str(self.config.broker.run_dir),
            "services": {s.name: s.status() for s in self.services},
            "logs": {**logs.status(), "format": log.format,
                     "file": str(log.file) if log.file else None, "animate": log.animate},
            "management": self.control.status() if self.control else None,
            "metrics": self.metrics.url if self.metrics is not None else None,
            "cluster": self._cluster_status(),
        }

    def _cluster_status(self) -> dict[str, Any] | None:
        node = self.cluster
        if node is None:
            return None
        return {"endpoint": getattr(node, "endpoint", None),
                "peers": node.peers() if hasattr(node, "peers") else [],
                "pending_contacts": (node.pending_contacts()
                                     if hasattr(node, "pending_contacts") else 0),
                **(node.security() if hasattr(node, "security") else {}),
                **(node.diagnosis() if hasattr(node, "diagnosis") else {})}

    def get_settings(self, key: str | None = None) -> dict[str, Any]:
        """The running config's settings under dotted ``key`` (a setting or a section; all
        when None), by dotted key. Raises CommandError for an unknown key."""
        found = {k: v for k, v in iter_settings(self.config)
                 if key is None or k == key or k.startswith(key + ".")}
        if not found:
            try:  # for the precise message
                with_setting(self.config, key or "", None, origin="get")
            except ConfigError as exc:
                raise CommandError(str(exc)) from None
            raise CommandError(f"get: unknown key {key!r}")
        return found

    def set_setting(self, key: str, value: Any) -> dict[str, Any]:
        """Apply one setting (``zbroker set``): {"key", "old", "new"}. Raises CommandError
        with the reason when the value is invalid or refused."""
        try:
            new = with_setting(self.config, key, value)
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        new = dataclasses.replace(new, source=self.config.source)
        old_value = dict(iter_settings(self.config))[key]
        reason = self.apply_config(new, what=f"set {key}")
        if reason is not None:
            raise CommandError(f"set: {key}: {reason}")
        return {"key": key, "old": old_value, "new": dict(iter_settings(self.config))[key]}

    def _start_metrics(self) -> None:
        bind = self.config.metrics.bind
        if bind is None:
            return
        from .metrics import MetricsError

        try:
            self.metrics = self._metrics_server(bind)
        except MetricsError as exc:
            raise StartupError(str(exc)) from None
        self.log.info("metrics endpoint", bind=bind, url=self.metrics.url)
        self._warn_if_exposed(bind)

    def _warn_if_exposed(self, bind: str) -> None:
        from .metrics import beyond_loopback

        if beyond_loopback(bind):
            self.log.warning("metrics endpoint beyond loopback: whoever reaches it reads the "
                             "broker's counters, with the names of its pipes and queues",
                             bind=bind)

    def _metrics_server(self, bind: str) -> Any:
        """A metrics endpoint listening on ``bind``; raises MetricsError."""
        from .metrics import MetricsServer

        assert self.loop is not None
        server = MetricsServer(self.loop, self.metrics_snapshot)
        server.start(bind)
        return server

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the metrics endpoint exports, as plain data (on the event loop)."""
        if self._build is None:
            import platform

            from zbroker.runtime.version import version

            self._build = (version(), platform.python_version())
        status = logs.status()
        return {
            "name": self.name, "version": self._build[0], "python": self._build[1],
            "started": self.started_at, "uptime": time.monotonic() - self._started_mono,
            "reloads": dict(self.reloads),
            "services": {s.name: s.metrics() for s in self.services},
            "cluster": self.cluster.metrics() if hasattr(self.cluster, "metrics") else None,
            "syslog": status["syslog"], "log_write_errors": status["write_errors"],
            "pipe_series": self.config.metrics.pipe_series,
        }

    def _start_control(self) -> None:
        assert self.loop is not None and self.zmq_context is not None
        control = ControlServer(
            self.config.broker.run_dir, self.zmq_context, self.loop, log=self.log,
            handlers={
                "status": lambda req: self.status(),
                "get": lambda req: self.get_settings(req.get("key")),
                "set": lambda req: self.set_setting(str(req.get("key")), req.get("value")),
                "reload": self._reload_command,
                "stop": self._stop_command,
            })
        try:
            control.start()
        except CommandError as exc:
            raise StartupError(str(exc)) from None
        self.control = control

    def _reload_command(self, request: dict[str, Any]) -> dict[str, Any]:
        self.log.info("reload requested", by="zbroker reload")
        reason = self.try_reload()
        if reason is not None:
            raise CommandError(f"reload refused: {reason}")
        return {"config": str(self.config.source) if self.config.source else None}

    def _stop_command(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.loop is not None
        self.loop.call_soon(self.request_stop, "zbroker stop")  # after the reply is sent
        return {"pid": os.getpid()}

    # --- helpers ---------------------------------------------------------------------------

    def _needs_restart(self, key: str) -> bool:
        """Whether a service's ``key`` only changes with a restart: ``enabled``, and each
        service's ``restart_keys`` (a section's: every key in it)."""
        return any(key == fixed or key.startswith(fixed + ".")
                   for name, service in self.registry.items()
                   for fixed in (f"services.{name}.{k}" for k in ("enabled",
                                                                   *service.restart_keys)))

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
