"""A queue's logs, by the name the cores' log actions carry (actions.py): ``None`` for its
own, a node id for the log of the copies it holds for that node (replica_files.py). Each log
is a Store (store.py) with its writer thread; each write's report comes back on the loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import Any

from zbroker.services.pzq.core.actions import Append, BatchResult

from .replica_files import open_logs
from .settings import QueueError, QueueSettings
from .store import Recovered, Store


class QueueLogs:
    def __init__(self, settings: QueueSettings, loop: asyncio.AbstractEventLoop, log: Any,
                 written: Callable[[str | None, BatchResult], None]):
        """``written(name, result)`` on the loop after each write of log ``name``."""
        self.settings, self.loop, self.log, self._written = settings, loop, log, written
        self.own = settings.store(log)
        self.stores: dict[str | None, Store] = {None: self.own}

    def __getitem__(self, name: str | None) -> Store:
        return self.stores[name]

    def append(self, appends: list[Append]) -> None:
        """Queue Append actions, in order: each run of one log's under one lock."""
        for name, run in groupby(appends, attrgetter("log")):
            self.stores[name].append_many(list(run))

    async def open_own(self) -> Recovered:
        """Open the queue's own log: what it found on disk (QueueError if it cannot)."""
        s = self.settings
        try:
            return await self.loop.run_in_executor(None, self.own.open)
        except OSError as exc:
            raise QueueError(f"queue {s.name!r}: cannot open its data directory "
                             f"{str(s.data_dir)!r}: {exc.strerror or exc}") from None

    async def open_copies(self, replicas_dir: Path,
                          restore: Callable[[str, Recovered], bool]) -> None:
        """Open the logs of the copies found on disk (replica_files.open_logs)."""
        s = self.settings
        self.stores.update(await self.loop.run_in_executor(
            None, open_logs, replicas_dir, s.max_replica_origins, restore,
            functools.partial(s.store, self.log), self.log))

    def start(self) -> None:
        """Start the writers of the logs opened so far."""
        for name, store in self.stores.items():
            store.start(functools.partial(self._report, name))

    def open_origin(self, name: str) -> None:
        """Open and start a new origin's log (OpenLog): empty, as origins are never dropped
        at run time."""
        store = self.stores[name] = self.settings.store(self.log, name)
        store.open()
        store.start(functools.partial(self._report, name))

    def _report(self, name: str | None, result: BatchResult) -> None:
        """(A writer thread.)"""
        try:
            self.loop.call_soon_threadsafe(self._written, name, result)
        except RuntimeError:
            pass  # the loop is closed

    async def close(self, timeout: float) -> bool:
        """Write what waits and stop the writers, the copies' first; False if the queue's
        own writer did not stop within ``timeout``."""
        for name, store in self.stores.items():
            if name is not None:
                await self.loop.run_in_executor(None, store.close)
        return await self.loop.run_in_executor(None, self.own.close, timeout)

    def close_now(self) -> None:
        """Close every log (a start that failed)."""
        for store in self.stores.values():
            store.close()
