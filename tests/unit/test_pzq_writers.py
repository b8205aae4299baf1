"""The writer threads every queue's log shares (zbroker/services/pzq/writers.py), with real
threads and real stores on a real disk."""

from __future__ import annotations

import threading
import time

from helpers import wait_for

from zbroker.services.pzq.store import Store
from zbroker.services.pzq.writers import DONE, Writers


class Turns:
    """A store stand-in that counts its turns and checks they never overlap."""

    def __init__(self, plan: list[float | None]) -> None:
        self.plan = list(plan)  # what each turn returns, in order (then None)
        self.turns = 0
        self.inside = threading.Lock()
        self.overlapped = False
        self.at: list[float] = []

    def turn(self) -> float | None:
        if not self.inside.acquire(blocking=False):
            self.overlapped = True
            return DONE
        try:
            self.turns += 1
            self.at.append(time.monotonic())
            time.sleep(0.001)
            return self.plan.pop(0) if self.plan else None
        finally:
            self.inside.release()


def wait_until(predicate, timeout: float = 5.0) -> None:
    wait_for(predicate, timeout, "the writer threads", interval=0.005)


def test_a_store_gets_turns_when_woken_and_when_its_timer_is_due_never_two_at_once():
    writers = Writers(threads=3)
    s = Turns([0.0, 0.05, None])
    writers.add(s)
    wait_until(lambda: s.turns == 3)  # at once, at once again, then 50 ms later
    assert s.at[2] - s.at[1] >= 0.045
    time.sleep(0.05)
    assert s.turns == 3  # idle until woken
    for _ in range(50):  # woken many times, even while in a turn: turns one after another
        writers.wake(s)
    wait_until(lambda: s.turns >= 4)
    assert not s.overlapped
    s.plan = [DONE]
    writers.wake(s)
    wait_until(lambda: writers.stores == 0)


def test_hundreds_of_stores_share_a_few_threads(tmp_path):
    before = threading.active_count()
    writers = Writers(threads=2)
    stores, results = [], []
    for i in range(200):
        store = Store(tmp_path / f"q{i}", sync="always")
        store.open()
        store.start(results.append, writers)
        stores.append(store)
    assert threading.active_count() - before <= 2
    for i, store in enumerate(stores):
        store.append(1, b"k", b"id-%d" % i, [b"body %d" % i])
    wait_until(lambda: sum(len(r.batches) for r in results) >= 200, timeout=30)
    for store in stores:
        assert store.close()
    assert writers.stores == 0
    # and what they wrote is there
    for i in range(200):
        again = Store(tmp_path / f"q{i}")
        found = again.open()
        assert [list(m.frames) for m in found.messages] == [[b"body %d" % i]]
        again.close()


def test_timers_left_behind_by_early_wakes_do_not_pile_up():
    """A store in a long backoff, woken by every append: each turn leaves a timer that an
    early wake made stale."""
    writers = Writers(threads=1)
    s = Turns([])
    s.plan = [60.0] * 10_000  # each turn asks for its next in a minute
    writers.add(s)
    for _ in range(2000):
        writers.wake(s)
        time.sleep(0.0002)
    wait_until(lambda: s.turns >= 500)
    assert len(writers._timers) <= 2 * 1 + 64 + 1
    s.plan = [DONE]
    writers.wake(s)
    wait_until(lambda: writers.stores == 0)
