"""What the broker says of itself: ``zbroker status`` and the snapshot the metrics endpoint
exports, assembled from its parts (plain data, on the event loop)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from zbroker import logs
from zbroker.management import ControlServer

from .clustering import Clustering
from .hosted import HostedServices
from .live_config import LiveConfig
from .metrics_endpoint import MetricsEndpoint


class Reports:
    """The status and the metrics of broker ``name`` (started when this is made) from its
    running config, services, cluster and metrics endpoint."""

    def __init__(self, name: str, live: LiveConfig, hosted: HostedServices,
                 clustering: Clustering, metrics: MetricsEndpoint) -> None:
        self.name = name
        self.live = live
        self.hosted = hosted
        self.clustering = clustering
        self.metrics = metrics
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self._build: tuple[str, str] | None = None  # (zbroker version, Python version)

    def status(self, control: ControlServer | None) -> dict[str, Any]:
        """What the broker is doing, for ``zbroker status`` (``control``: its management
        socket, when it runs)."""
        config = self.live.config
        log = config.log
        return {
            "name": self.name,
            "pid": os.getpid(),
            "started": self.started_at,
            "uptime": round(time.monotonic() - self._started_mono, 3),
            # (absolute: the commands that read it may run elsewhere, check-config)
            "config": str(Path(config.source).absolute()) if config.source else None,
            "reloads": dict(self.live.reloads),
            "run_dir": str(config.broker.run_dir),
            "services": self.hosted.status(),
            "logs": {**logs.status(), "format": log.format,
                     "file": str(log.file) if log.file else None},
            "management": control.status() if control else None,
            "metrics": self.metrics.url,
            "metrics_endpoint": self.metrics.status(),
            "cluster": self.clustering.status(),
        }

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
            "reloads": dict(self.live.reloads),
            "services": self.hosted.metrics(),
            "cluster": self.clustering.metrics(),
            "syslog": status["syslog"], "log_write_errors": status["write_errors"],
        }
