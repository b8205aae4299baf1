"""The broker's signals, handled on its event loop: SIGINT and SIGTERM stop it, SIGHUP reloads
its config."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable


class Signals:
    """The handlers of the broker's signals, installed on a loop and removed together."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._installed: list[int] = []

    def install(self, loop: asyncio.AbstractEventLoop, *, stop: Callable[[str], None],
                reload: Callable[[], None]) -> None:
        """SIGTERM and SIGINT call ``stop`` with the signal's name, SIGHUP calls ``reload``."""
        self._loop = loop
        for signum, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
            loop.add_signal_handler(signum, stop, name)
            self._installed.append(signum)
        loop.add_signal_handler(signal.SIGHUP, reload)
        self._installed.append(signal.SIGHUP)

    def remove(self) -> None:
        if self._loop is not None:
            for signum in self._installed:
                self._loop.remove_signal_handler(signum)
        self._installed = []
