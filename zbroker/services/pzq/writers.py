"""The threads that write every queue's log: a few, shared, instead of one per queue.

A store (store.py) writes in *turns*: each turn takes what its group-commit policy says to take,
writes it and syncs it, and says when it wants its next turn (now, in so many seconds, or
when woken by new work). :class:`Writers` runs the turns of every store of the process on
``threads`` threads, as Kafka's log manager runs its logs on a pool: a store's turns never
overlap, stores with work are taken in the order they asked, and a store waiting for its
policy's window sits in a heap of timers rather than on a thread of its own. 2 000 queues
were 2 000 threads; now they are a handful, and an idle queue costs none.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

THREADS = 4  # writer threads of the process (a turn's fsync blocks its thread)
DONE = -1.0  # what a turn returns once its store has stopped


class Writable(Protocol):
    def turn(self) -> float | None:
        """Write what is due: the seconds until the next turn (0: at once), None to wait for
        :meth:`Writers.wake`, or DONE."""


class Writers:
    """The writer threads: ``add`` a store, ``wake`` it when it has new work, and it is
    given turns until one returns DONE."""

    def __init__(self, threads: int = THREADS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threads = threads
        #: when timers are due (seconds). A clock moved by hand (a test's) calls
        #: :meth:`clock_moved` after each move, so the threads look at their timers again
        self._clock = clock
        self._cond = threading.Condition()
        self._ready: deque[Any] = deque()  # stores whose turn is due, in order
        self._timers: list[tuple[float, int, Any]] = []  # (due, order, store)
        self._due: dict[Any, float] = {}  # store -> when its timer is due (the live one)
        self._state: dict[Any, str] = {}  # store -> "ready", "busy", "waiting"
        self._again: set[Any] = set()  # woken while busy: another turn at once
        self._order = itertools.count()
        self._workers: list[threading.Thread] = []

    def add(self, store: Writable) -> None:
        """Give ``store`` turns from now on (its first at once)."""
        with self._cond:
            self._state[store] = "waiting"
            self._make_ready(store)
            if len(self._workers) < self.threads:
                worker = threading.Thread(target=self._work, daemon=True,
                                          name=f"pzq-writer-{len(self._workers)}")
                self._workers.append(worker)
                worker.start()

    def wake(self, store: Writable) -> None:
        """``store`` has new work (or is stopping): its turn comes at once."""
        with self._cond:
            state = self._state.get(store)
            if state == "busy":
                self._again.add(store)
            elif state == "waiting":
                self._make_ready(store)

    def clock_moved(self) -> None:
        """The clock went forward other than with time: timers may be due now."""
        with self._cond:
            self._cond.notify_all()

    def due(self, store: Writable) -> float | None:
        """When ``store``'s next turn is due by its timer (the clock's time), None if it has
        no timer (it waits to be woken, or has a turn now)."""
        with self._cond:
            return self._due.get(store)

    def busy(self, store: Writable) -> bool:
        """Whether ``store`` has a turn now, or one to come by its timer (not only once
        woken)."""
        with self._cond:
            return self._state.get(store) in ("ready", "busy") or store in self._due

    @property
    def stores(self) -> int:
        with self._cond:
            return len(self._state)

    def _make_ready(self, store: Any) -> None:
        self._due.pop(store, None)  # (its timer, if any, is stale now)
        self._state[store] = "ready"
        self._ready.append(store)
        self._cond.notify()

    def _work(self) -> None:
        cond = self._cond
        while True:
            with cond:
                store = self._next()
                self._state[store] = "busy"
            try:
                wait = store.turn()
            except BaseException:  # a bug in a turn: that store stops, the others go on
                wait = DONE
            with cond:
                self._after(store, wait)

    def _next(self) -> Any:
        """The next store whose turn is due, waiting for one (called with the lock)."""
        while True:
            now = self._clock()
            timers = self._timers
            while timers and timers[0][0] <= now:
                due, _, store = heapq.heappop(timers)
                if self._due.get(store) == due and self._state.get(store) == "waiting":
                    del self._due[store]
                    self._state[store] = "ready"
                    self._ready.append(store)
            if self._ready:
                return self._ready.popleft()
            self._cond.wait(timers[0][0] - now if timers else None)

    def _after(self, store: Any, wait: float | None) -> None:
        """``store``'s turn ended, asking for its next in ``wait`` seconds (called with the
        lock)."""
        again = store in self._again
        self._again.discard(store)
        if wait is not None and wait == DONE:
            del self._state[store]
            self._due.pop(store, None)
            return
        self._state[store] = "waiting"
        if again or wait == 0.0:
            self._make_ready(store)
        elif wait is not None:
            due = self._clock() + wait
            self._due[store] = due
            heapq.heappush(self._timers, (due, next(self._order), store))
            if len(self._timers) > 2 * len(self._due) + 64:
                # a store woken before its timer leaves that timer behind, stale until due: a
                # store in a long backoff (a failing disk) woken by every append would pile
                # them up. Keep the live ones only
                self._timers = [(d, next(self._order), s) for s, d in self._due.items()]
                heapq.heapify(self._timers)
            self._cond.notify()  # (a sleeping worker may have to wake sooner)


_shared: Writers | None = None
_shared_lock = threading.Lock()


def shared() -> Writers:
    """The process's writer threads (made when the first store starts)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Writers()
        return _shared
