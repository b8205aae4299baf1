"""The config the broker runs with, and how it changes while it runs: SIGHUP and ``zbroker
reload`` read it again, ``zbroker set`` changes one setting, ``zbroker get`` reads them.

A change is applied all or nothing, to the services, logging, the connection budget, the
metrics endpoint and the cluster: a config that fails to load, a key that cannot be read, or a
change that a service refuses is refused whole, logged, and the broker runs on. Keys that only
change with a restart keep their running values and are named; a ``set`` of one is refused. A
new cluster key makes the cluster node start anew with it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from zbroker import logs
from zbroker.config import (
    Config,
    ConfigError,
    config_diff,
    iter_settings,
    load_config,
    moved_keys,
    with_setting,
    with_value,
)
from zbroker.management import CommandError
from zbroker.service import Service, ServiceError
from zbroker.zmtp.admission import PROCESS_BUDGET

from .clustering import Clustering
from .hosted import HostedServices
from .metrics_endpoint import MetricsEndpoint

#: keys a running broker cannot change: a reload keeps their running values and names them
#: ("restart needed for: ..."), a ``set`` of one is refused
RESTART_KEYS = ("broker.name", "broker.run_dir")
#: the cluster keys a reload applies (a new key: the cluster node starts anew with it and links
#: its peers again); every other cluster key of a running cluster needs a restart
CLUSTER_RELOAD_KEYS = ("cluster.key_file", "cluster.insecure")


class LiveConfig:
    """The running ``config`` of the broker, loaded from ``config_path`` and ``overrides``
    (a reload loads it again from them; with no path: the same search as at start), and the
    parts a change is applied to; ``log`` is the broker's."""

    def __init__(self, config: Config, *, config_path: str | os.PathLike[str] | None,
                 overrides: Mapping[str, Any] | None, hosted: HostedServices,
                 clustering: Clustering, metrics: MetricsEndpoint, log: Any) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self.name = config.broker.name
        self.hosted = hosted
        self.clustering = clustering
        self.metrics = metrics
        self.log = log
        self.reloads = {"ok": 0, "refused": 0}  # config reloads by result (metrics)
        #: what the last reload or set applied: keys changed, keys that need a restart
        self.last_applied: dict[str, Any] = {}

    # --- get and set -------------------------------------------------------------------------

    def get(self, key: str | None = None) -> dict[str, Any]:
        """The running config's settings under dotted ``key`` (a setting or a section; all
        when None), by dotted key (a key that moved: by its new name). Raises CommandError for
        an unknown key."""
        key = moved_keys().get(key, key) if key is not None else None
        found = {k: v for k, v in iter_settings(self.config)
                 if key is None or k == key or k.startswith(key + ".")}
        if not found:
            try:  # for the precise message
                with_setting(self.config, key or "", None, origin="get")
            except ConfigError as exc:
                raise CommandError(str(exc)) from None
            raise CommandError(f"get: unknown key {key!r}")
        return found

    def set(self, key: str, value: Any) -> dict[str, Any]:
        """Apply one setting (``zbroker set``): {"key", "old", "new"}. Raises CommandError
        with the reason when the value is invalid or refused. A key that moved is set, and
        answered, by its new name."""
        key = moved_keys().get(key, key)
        try:
            new = with_setting(self.config, key, value)
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        new = dataclasses.replace(new, source=self.config.source)
        old_value = dict(iter_settings(self.config))[key]
        reason = self.apply(new, what=f"set {key}")
        if reason is not None:
            raise CommandError(f"set: {key}: {reason}")
        return {"key": key, "old": old_value, "new": dict(iter_settings(self.config))[key]}

    # --- reload ------------------------------------------------------------------------------

    def reload_command(self) -> dict[str, Any]:
        """``zbroker reload``: what was applied; CommandError with why it was refused."""
        self.log.info("reload requested", budget="reloads", by="zbroker reload")
        self.last_applied = {}
        reason = self.try_reload()
        if reason is not None:
            raise CommandError(f"reload refused: {reason}")
        return {"config": str(self.config.source) if self.config.source else None,
                "changed": self.last_applied.get("changed", []),
                "restart_needed": self.last_applied.get("restart_needed", []),
                "cluster_key_changed": self.last_applied.get("cluster_key_changed", False)}

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
        for note in new.notes:  # (keys that moved: said at each reload, under its budget)
            self.log.warning("config key moved", budget="reloads", note=note)
        from zbroker.config_checks import config_problems

        problems = config_problems(new, self.hosted.registry)  # a config that could not start
        if problems:
            self._reopen_log()
            self.log.error("config reload refused", budget="reloads", reason="; ".join(problems))
            self.reloads["refused"] += 1
            return "\n".join(problems)
        reason = self.apply(new, restart_needed=renamed)
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

    def apply(self, new: Config, what: str = "config reload",
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
        fixed = [*(restart_needed or []), *(k for k in changed if self.restart_needed(k))]
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
            from zbroker.cluster.security import KeyFileError

            try:
                new_keys, keys_moved = self.clustering.keys_for(new)
            except KeyFileError as exc:
                reason = f"cluster key: {exc}"
                self.log.error(f"{what} refused", reason=reason)
                return reason
        new_metrics = None
        if new.metrics.bind != old.metrics.bind and self.metrics.loop is not None \
                and new.metrics.bind is not None:
            # the new address is bound first: a reload that cannot bind it is refused whole
            from zbroker.metrics import MetricsError

            try:
                new_metrics = self.metrics.serve(new.metrics.bind)
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
        if new.metrics.bind != old.metrics.bind and self.metrics.loop is not None:
            self.metrics.move(new_metrics, new.metrics.bind)
        self.clustering.configure(new)
        keys_changed = [k for k in changed if k not in fixed]
        if new_keys is not None:
            self.clustering.relink(new_keys)
        elif keys_moved is not None:  # the same key elsewhere
            self.clustering.key_moved(keys_moved)
        self.last_applied = {"changed": keys_changed, "restart_needed": fixed,
                             "cluster_key_changed": new_keys is not None}
        if what == "config reload":
            self.log.info(
                "config reloaded", budget="reloads",
                config=str(new.source) if new.source else "defaults",
                changed=keys_changed, **({"cluster_key": "changed: the peers are linked anew"}
                                         if new_keys is not None else {}))
        else:
            self.log.info(f"{what} applied", budget="reloads", changed=keys_changed)
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

    def restart_needed(self, key: str) -> bool:
        """Whether a change of ``key`` only takes effect with a restart."""
        if key.startswith("cluster."):
            return key == "cluster.enabled" or (self.clustering.keys is not None
                                                and key not in CLUSTER_RELOAD_KEYS)
        return key in RESTART_KEYS or self.hosted.needs_restart(key)
