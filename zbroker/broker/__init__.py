"""The broker process: one event loop, one ZeroMQ context, the enabled services, signals.

    SIGINT, SIGTERM   stop every service (each within STOP_TIMEOUT), end the context, exit 0
    SIGHUP            re-read the config; every service reloads it, logging is re-configured
                      and the log file reopened, a new cluster key links the peers anew. A
                      config that fails to load, a key that cannot be read, or a change that a
                      service refuses, is refused as a whole: the broker logs why and keeps
                      running on the config it has. Keys that only change with a restart keep
                      their running values and are named ("restart needed for: ...").

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
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zmq

from zbroker import logs
from zbroker.runtime import event_loop, heap
from zbroker.runtime.limits import raise_open_file_limit

from ..config import (
    Config,
    ConfigError,
    config_diff,
    iter_settings,
    load_config,
    with_setting,
    with_value,
)
from ..management import CommandError, ControlServer
from ..service import Service, ServiceError
from ..zmtp.admission import PROCESS_BUDGET
from .clustering import Clustering
from .hosted import HostedServices
from .signals import Signals
from .startup import StartupError, make_private_dir

START_TIMEOUT = 60.0  # seconds each service has to start
STOP_TIMEOUT = 5.0  # seconds each service has to stop
LOG_FLUSH_INTERVAL = 1.0  # seconds between writing the counts of lines held back (log budget)
#: keys a running broker cannot change: a reload keeps their running values and names them
#: ("restart needed for: ..."), a ``set`` of one is refused
RESTART_KEYS = ("broker.name", "broker.run_dir")
#: the cluster keys a reload applies (a new key: the cluster node starts anew with it and links
#: its peers again); every other cluster key of a running cluster needs a restart
CLUSTER_RELOAD_KEYS = ("cluster.key_file", "cluster.insecure")


class Broker:
    """Hosts the enabled services of ``registry`` (name -> Service class) under ``config``.

    ``config_path`` and ``overrides`` are what ``config`` was loaded from; SIGHUP loads the
    config again from them (with no path: the same search as at start).
    """

    def __init__(self, config: Config, *, config_path: str | os.PathLike[str] | None = None,
                 overrides: Mapping[str, Any] | None = None,
                 registry: Mapping[str, type[Service]] | None = None,
                 seeds: tuple[str, ...] = ()):
        if registry is None:
            from ..services import installed

            registry = installed()
        self.config = config
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self.name = config.broker.name
        # what reloads log has a budget of its own, budget="reloads" (4 000 SIGHUPs in 20 s
        # wrote 7 936 lines)
        self.log = logs.get_logger()
        self.hosted = HostedServices(registry, self.log)
        #: the cluster node, when config.cluster.enabled; ``seeds`` are a join token's: said
        #: HELLO to as cluster.peers are
        self.clustering = Clustering(config, self.name, tuple(seeds), self.hosted, self.log)
        self.zmq_context: zmq.Context | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._created_dirs: list[Path] = []
        self._signals = Signals()
        self.control: ControlServer | None = None
        self._flusher: asyncio.TimerHandle | None = None
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self.reloads = {"ok": 0, "refused": 0}  # config reloads by result (metrics)
        self.metrics: Any = None  # the metrics endpoint (zbroker.metrics), when metrics.bind
        self._build: tuple[str, str] | None = None  # (zbroker version, Python version)
        #: what the last reload or set applied: keys changed, keys that need a restart
        self.last_applied: dict[str, Any] = {}

    @property
    def registry(self) -> dict[str, type[Service]]:
        """The services this broker may host (name -> Service class)."""
        return self.hosted.registry

    @property
    def services(self) -> list[Service]:
        """The started services, in start order."""
        return self.hosted.started

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
        self._signals.install(self.loop, stop=self.request_stop, reload=self._on_sighup)
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
            stop_giving_back = heap.give_back_every(self.loop)  # what floods leave, returned
            await self._stop_requested.wait()
            stop_giving_back()
        finally:
            if self._flusher is not None:
                self._flusher.cancel()
                self._flusher = None
            logs.flush_budget(everything=True)
            await self.stop()
            self._signals.remove()
        self.log.info("broker stopped", name=self.name)
        return 0

    def _flush_logs(self) -> None:
        """Every LOG_FLUSH_INTERVAL: the counts of lines held back (the log budget) that are
        due."""
        logs.flush_budget()
        self._flusher = self.loop.call_later(LOG_FLUSH_INTERVAL, self._flush_logs)

    async def start(self) -> None:
        """Start every enabled service. On failure, stops those already started, releases
        everything and raises (StartupError, ServiceError, or a bug's own exception)."""
        self.loop = asyncio.get_running_loop()
        wanted = self.hosted.enabled(self.config)
        from ..config_checks import config_problems

        problems = config_problems(self.config, self.registry)  # as check-config does
        if problems:
            raise StartupError("\n".join(problems))
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
            await self.hosted.start(wanted, self.config, broker_name=self.name,
                                    zmq_context=self.zmq_context, loop=self.loop,
                                    timeout=START_TIMEOUT)
            if self.config.cluster.enabled:
                await self.clustering.start(self.zmq_context, self.loop)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the started services (last started first), then end the ZeroMQ context.
        Never hangs: a service gets STOP_TIMEOUT seconds. Safe to call twice."""
        control, self.control = self.control, None
        if control is not None:
            control.stop()
        metrics, self.metrics = self.metrics, None
        if metrics is not None:
            metrics.stop()
        await self.clustering.stop(STOP_TIMEOUT)
        await self.hosted.stop(STOP_TIMEOUT)
        if self.zmq_context is not None:
            self.zmq_context.destroy(linger=0)
            self.zmq_context = None
        if control is not None:
            control.release()
        created, self._created_dirs = [*self._created_dirs, *self.hosted.take_created_dirs()], []
        for path in reversed(created):
            try:
                path.rmdir()  # only if empty: leave what a service chose to keep
            except OSError:
                pass

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
        return self.hosted.endpoints()

    # --- reload ----------------------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the config and apply it, all or nothing. True if applied."""
        return self.try_reload() is None

    def try_reload(self) -> str | None:
        """Re-read the config and apply it, all or nothing: None if applied, else why not
        (also logged). The log file is reopened either way (log rotation)."""
        renamed = []
        try:
            new = load_config(self.config_path, self.overrides, schema=type(self.config))
            if new.broker.name != self.name:
                # a new name needs a restart, and what "{name}" became in other keys (an
                # endpoint, a directory) must stay what it is: loaded again with our name
                renamed = ["broker.name"]
                over = {**self.overrides,
                        "broker": {**self.overrides.get("broker", {}), "name": self.name}}
                new = load_config(self.config_path, over, schema=type(self.config))
        except ConfigError as exc:
            self._reopen_log()
            self.log.error("config reload refused", budget="reloads", reason=str(exc))
            self.reloads["refused"] += 1
            return str(exc)
        from ..config_checks import config_problems

        problems = config_problems(new, self.registry)  # a config that could not start
        if problems:
            self._reopen_log()
            self.log.error("config reload refused", budget="reloads", reason="; ".join(problems))
            self.reloads["refused"] += 1
            return "\n".join(problems)
        reason = self.apply_config(new, restart_needed=renamed)
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

    def apply_config(self, new: Config, what: str = "config reload",
                     restart_needed: list[str] | None = None) -> str | None:
        """Apply ``new`` to the services, logging and the cluster's key, all or nothing
        (SIGHUP, ``zbroker reload``, ``zbroker set``): None if applied, else why not (also
        logged). The keys that only change with a restart keep their running values: a
        reload names them (``self.last_applied["restart_needed"]``, and the log; with the keys
        ``restart_needed`` the caller kept already), a ``set`` of one is refused. A new
        cluster key (cluster.key_file, cluster.insecure, or what the key file holds) makes the
        cluster node start anew with it, its peers linked again."""
        old = self.config
        changed = config_diff(old, new)
        fixed = [*(restart_needed or []), *(k for k in changed if self._restart_needed(k))]
        if fixed and what != "config reload":
            reason = "these keys only change with a restart: " + ", ".join(fixed)
            self.log.error(f"{what} refused", reason=reason)
            return reason
        if fixed:  # the running values stay until a restart
            running = dict(iter_settings(old))
            for key in fixed:
                new = with_value(new, key, running[key])
        new_keys = None  # the cluster's new key, when it changes
        keys_moved = None  # the same key, in another file
        if self.clustering.keys is not None:
            from ..cluster.security import KeyFileError

            try:
                new_keys, keys_moved = self.clustering.keys_for(new)
            except KeyFileError as exc:
                reason = f"cluster key: {exc}"
                self.log.error(f"{what} refused", reason=reason)
                return reason
        new_metrics = None
        if new.metrics.bind != old.metrics.bind and self.loop is not None \
                and new.metrics.bind is not None:
            # the new address is bound first: a reload that cannot bind it is refused whole
            from ..metrics import MetricsError

            try:
                new_metrics = self._metrics_server(new.metrics.bind)
            except MetricsError as exc:
                self.log.error(f"{what} refused", reason=str(exc))
                return str(exc)
        applied: list[Service] = []
        for service in self.hosted.started:
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
        self.clustering.configure(new)
        applied = [k for k in changed if k not in fixed]
        if new_keys is not None:
            self.clustering.relink(new_keys)
        elif keys_moved is not None:  # the same key elsewhere
            self.clustering.key_moved(keys_moved)
        self.last_applied = {"changed": applied, "restart_needed": fixed,
                             "cluster_key_changed": new_keys is not None}
        if what == "config reload":
            self.log.info(
                "config reloaded", budget="reloads",
                config=str(new.source) if new.source else "defaults",
                changed=applied, **({"cluster_key": "changed: the peers are linked anew"}
                                    if new_keys is not None else {}))
        else:
            self.log.info(f"{what} applied", budget="reloads", changed=applied)
        if fixed:
            self.log.warning("restart needed for: " + ", ".join(fixed), budget="reloads",
                             keys=fixed, why="a reload cannot change these: the broker runs "
                                             "on their values of before until it restarts")
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
            # (absolute: the commands that read it may run elsewhere, check-config)
            "config": str(Path(self.config.source).absolute()) if self.config.source else None,
            "reloads": dict(self.reloads),
            "run_dir": str(self.config.broker.run_dir),
            "services": self.hosted.status(),
            "logs": {**logs.status(), "format": log.format,
                     "file": str(log.file) if log.file else None, "animate": log.animate},
            "management": self.control.status() if self.control else None,
            "metrics": self.metrics.url if self.metrics is not None else None,
            "metrics_endpoint": self.metrics.status() if self.metrics is not None else None,
            "cluster": self.clustering.status(),
        }

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
        from ..metrics import MetricsError

        try:
            self.metrics = self._metrics_server(bind)
        except MetricsError as exc:
            raise StartupError(str(exc)) from None
        self.log.info("metrics endpoint", bind=bind, url=self.metrics.url)
        self._warn_if_exposed(bind)

    def _warn_if_exposed(self, bind: str) -> None:
        from ..metrics import beyond_loopback

        if beyond_loopback(bind):
            self.log.warning("metrics endpoint beyond loopback: whoever reaches it reads the "
                             "broker's counters, with the names of its pipes and queues",
                             bind=bind)

    def _metrics_server(self, bind: str) -> Any:
        """A metrics endpoint listening on ``bind``, served on the loop (call it there);
        raises MetricsError."""
        from ..metrics import MetricsServer

        assert self.loop is not None
        server = MetricsServer(self.loop, self.metrics_snapshot, log=self.log)
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
            "name": self.name, "host": socket.gethostname(), "version": self._build[0],
            "python": self._build[1],
            "started": self.started_at, "uptime": time.monotonic() - self._started_mono,
            "reloads": dict(self.reloads),
            "services": self.hosted.metrics(),
            "cluster": self.clustering.metrics(),
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
                "join-token": lambda req: self.clustering.write_join_file(),
                "stop": self._stop_command,
            })
        try:
            control.start()
        except CommandError as exc:
            raise StartupError(str(exc)) from None
        self.control = control

    def _reload_command(self, request: dict[str, Any]) -> dict[str, Any]:
        self.log.info("reload requested", budget="reloads", by="zbroker reload")
        self.last_applied = {}
        reason = self.try_reload()
        if reason is not None:
            raise CommandError(f"reload refused: {reason}")
        return {"config": str(self.config.source) if self.config.source else None,
                "changed": self.last_applied.get("changed", []),
                "restart_needed": self.last_applied.get("restart_needed", []),
                "cluster_key_changed": self.last_applied.get("cluster_key_changed", False)}

    def _stop_command(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.loop is not None
        self.loop.call_soon(self.request_stop, "zbroker stop")  # after the reply is sent
        return {"pid": os.getpid()}

    # --- helpers ---------------------------------------------------------------------------

    def _restart_needed(self, key: str) -> bool:
        """Whether a change of ``key`` only takes effect with a restart."""
        if key.startswith("cluster."):
            return key == "cluster.enabled" or (self.clustering.keys is not None
                                                and key not in CLUSTER_RELOAD_KEYS)
        return key in RESTART_KEYS or self.hosted.needs_restart(key)

    def _on_sighup(self) -> None:
        self.log.info("SIGHUP: reloading config", budget="reloads")
        self.reload()
