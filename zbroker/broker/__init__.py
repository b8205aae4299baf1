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

The Broker keeps the event loop, the ZeroMQ context, the management socket and the order of
things; its parts are modules of this package, each given what it needs:

- ``hosted.py`` — the services: which are enabled, start, stop, their contexts and cluster
  ports, what peer brokers do relayed to them;
- ``clustering.py`` — the cluster node, the snapshot of the cluster it keeps, the join file,
  the node started anew with a new key;
- ``live_config.py`` — the running config: get, set, reload, what needs a restart;
- ``metrics_endpoint.py`` — the metrics endpoint: bound, moved, stopped;
- ``reports.py`` — ``zbroker status`` and the metrics snapshot;
- ``signals.py`` — SIGINT, SIGTERM, SIGHUP;
- ``startup.py`` — StartupError, and the private run directory.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zmq

from zbroker import logs
from zbroker.config import Config
from zbroker.management import CommandError, ControlServer
from zbroker.runtime import event_loop, heap
from zbroker.runtime.limits import raise_open_file_limit
from zbroker.service import Service
from zbroker.zmtp.admission import PROCESS_BUDGET

from .clustering import Clustering
from .hosted import HostedServices
from .live_config import LiveConfig
from .metrics_endpoint import MetricsEndpoint
from .reports import Reports
from .signals import Signals
from .startup import StartupError, make_private_dir

__all__ = ["Broker", "StartupError", "make_private_dir"]

START_TIMEOUT = 60.0  # seconds each service has to start
STOP_TIMEOUT = 5.0  # seconds each service has to stop
LOG_FLUSH_INTERVAL = 1.0  # seconds between writing the counts of lines held back (log budget)


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
            from zbroker.services import installed

            registry = installed()
        self.name = config.broker.name
        # what reloads log has a budget of its own, budget="reloads" (4 000 SIGHUPs in 20 s
        # wrote 7 936 lines)
        self.log = logs.get_logger()
        self.hosted = HostedServices(registry, self.log)
        #: the cluster node, when config.cluster.enabled; ``seeds`` are a join token's: said
        #: HELLO to as cluster.peers are
        self.clustering = Clustering(config, self.name, tuple(seeds), self.hosted, self.log)
        self.metrics = MetricsEndpoint(self.log)  # serves when metrics.bind
        self.live = LiveConfig(config, config_path=config_path, overrides=overrides,
                               hosted=self.hosted, clustering=self.clustering,
                               metrics=self.metrics, log=self.log)
        self.reports = Reports(self.name, self.live, self.hosted, self.clustering, self.metrics)
        self.zmq_context: zmq.Context[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._created_dirs: list[Path] = []
        self._signals = Signals()
        self.control: ControlServer | None = None
        self._flusher: asyncio.TimerHandle | None = None

    @property
    def config(self) -> Config:
        """The running config (a reload's or a set's, once applied)."""
        return self.live.config

    @property
    def registry(self) -> dict[str, type[Service]]:
        """The services this broker may host (name -> Service class)."""
        return self.hosted.registry

    @property
    def services(self) -> list[Service]:
        """The started services, in start order."""
        return self.hosted.started

    @property
    def last_applied(self) -> dict[str, Any]:
        """What the last reload or set applied: keys changed, keys that need a restart."""
        return self.live.last_applied

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

        assert self.loop is not None
        self.loop.set_exception_handler(log_error)

    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        self._log_loop_errors()
        self._stop_requested = asyncio.Event()
        self._signals.install(self.loop, stop=self.request_stop, reload=self._on_sighup)
        try:
            for note in self.config.notes:  # keys that moved: the old name works, for now
                self.log.warning("config key moved", note=note)
            await self.start()
            self._start_control()
            self.metrics.start(self.config.metrics.bind)
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
        assert self.loop is not None
        logs.flush_budget()
        self._flusher = self.loop.call_later(LOG_FLUSH_INTERVAL, self._flush_logs)

    async def start(self) -> None:
        """Start every enabled service. On failure, stops those already started, releases
        everything and raises (StartupError, ServiceError, or a bug's own exception)."""
        self.loop = asyncio.get_running_loop()
        self.metrics.attach(self.loop, self.reports.metrics_snapshot)
        config = self.config
        wanted = self.hosted.enabled(config)
        from zbroker.config_checks import config_problems

        problems = config_problems(config, self.registry)  # as check-config does
        if problems:
            raise StartupError("\n".join(problems))
        if not wanted:
            self.log.warning("no service is enabled", name=self.name)
        assert config.broker.run_dir is not None  # (resolved as the config loads)
        self._created_dirs = make_private_dir(config.broker.run_dir)
        open_files = raise_open_file_limit()
        self.log.debug("open-file limit", soft=open_files)
        # every ZMTP endpoint of every service draws on one budget of connections
        PROCESS_BUDGET.set_limit(config.clients.max_clients, config.clients.max_per_source)
        self.zmq_context = zmq.Context[Any]()
        try:
            await self.hosted.start(wanted, config, broker_name=self.name,
                                    zmq_context=self.zmq_context, loop=self.loop,
                                    timeout=START_TIMEOUT)
            if config.cluster.enabled:
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
        self.metrics.stop()
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

    def _on_sighup(self) -> None:
        self.log.info("SIGHUP: reloading config", budget="reloads")
        self.reload()

    # --- reload (live_config.py) -------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the config and apply it, all or nothing. True if applied."""
        return self.live.try_reload() is None

    def try_reload(self) -> str | None:
        """Re-read the config and apply it, all or nothing: None if applied, else why not
        (also logged). The log file is reopened either way (log rotation)."""
        return self.live.try_reload()

    def apply_config(self, new: Config, what: str = "config reload",
                     restart_needed: list[str] | None = None) -> str | None:
        """Apply ``new``, all or nothing: None if applied, else why not (LiveConfig.apply)."""
        return self.live.apply(new, what, restart_needed)

    # --- management ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What the broker is doing, for ``zbroker status``."""
        return self.reports.status(self.control)

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the metrics endpoint exports, as plain data (on the event loop)."""
        return self.reports.metrics_snapshot()

    def get_settings(self, key: str | None = None) -> dict[str, Any]:
        """The running config's settings under dotted ``key`` (a setting or a section; all
        when None), by dotted key. Raises CommandError for an unknown key."""
        return self.live.get(key)

    def set_setting(self, key: str, value: Any) -> dict[str, Any]:
        """Apply one setting (``zbroker set``): {"key", "old", "new"}. Raises CommandError
        with the reason when the value is invalid or refused."""
        return self.live.set(key, value)

    def _start_control(self) -> None:
        assert self.loop is not None and self.zmq_context is not None
        assert self.config.broker.run_dir is not None
        control = ControlServer(
            self.config.broker.run_dir, self.zmq_context, self.loop, log=self.log,
            handlers={
                "status": lambda req: self.status(),
                "get": lambda req: self.get_settings(req.get("key")),
                "set": lambda req: self.set_setting(str(req.get("key")), req.get("value")),
                "reload": lambda req: self.live.reload_command(),
                "join-token": lambda req: self.clustering.write_join_file(),
                "stop": self._stop_command,
            })
        try:
            control.start()
        except CommandError as exc:
            raise StartupError(str(exc)) from None
        self.control = control

    def _stop_command(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.loop is not None
        self.loop.call_soon(self.request_stop, "zbroker stop")  # after the reply is sent
        return {"pid": os.getpid()}
