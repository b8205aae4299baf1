"""The broker's metrics endpoint (zbroker.metrics), when ``metrics.bind`` is set: bound at
start, moved or turned off by a reload (the new address bound first, so a reload that cannot
bind it is refused whole), stopped with the broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .startup import StartupError


class MetricsEndpoint:
    """The endpoint that serves, on the event loop, the snapshots the broker takes; ``log``
    is the broker's."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.server: Any = None  # the MetricsServer, while one serves
        self.loop: asyncio.AbstractEventLoop | None = None
        self._snapshot: Callable[[], dict[str, Any]] | None = None

    def attach(self, loop: asyncio.AbstractEventLoop,
               snapshot: Callable[[], dict[str, Any]]) -> None:
        """Serve on ``loop`` what ``snapshot`` takes (plain data; called on the loop): from
        now on an endpoint can be bound."""
        self.loop, self._snapshot = loop, snapshot

    def start(self, bind: str | None) -> None:
        """Bind ``bind`` (nothing when None); raises StartupError."""
        if bind is None:
            return
        from zbroker.metrics import MetricsError

        try:
            self.server = self.serve(bind)
        except MetricsError as exc:
            raise StartupError(str(exc)) from None
        self.log.info("metrics endpoint", bind=bind, url=self.server.url)
        self._warn_if_exposed(bind)

    def serve(self, bind: str) -> Any:
        """A metrics endpoint listening on ``bind``, served on the loop (call it there);
        raises MetricsError."""
        from zbroker.metrics import MetricsServer

        assert self.loop is not None and self._snapshot is not None
        server = MetricsServer(self.loop, self._snapshot, log=self.log)
        server.start(bind)
        return server

    def move(self, server: Any, bind: str | None) -> None:
        """A reload's: ``server`` (from ``serve``, for ``bind``; None: no endpoint now) in
        place of the one that served."""
        if self.server is not None:
            self.server.stop(wait=False)
        self.server = server
        self.log.info("metrics endpoint moved" if server else "metrics endpoint off",
                      **({"url": server.url} if server else {}))
        if bind is not None:
            self._warn_if_exposed(bind)

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    def _warn_if_exposed(self, bind: str) -> None:
        from zbroker.metrics import beyond_loopback

        if beyond_loopback(bind):
            self.log.warning("metrics endpoint beyond loopback: whoever reaches it reads the "
                             "broker's counters, with the names of its pipes and queues",
                             bind=bind)

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def status(self) -> dict[str, Any] | None:
        return self.server.status() if self.server is not None else None
