"""The group-commit policy of the pzq log, rule by rule, without threads, disk or clock: the
time is a number the test passes (the store's writer on a real disk: test_pzq_store.py)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import pytest

from zbroker.pzq.group_commit import BACKOFF_MAX, BACKOFF_MIN, GroupCommit

WINDOW = 0.010  # a linger of 1 ms


@dataclass
class Rec:
    batch: int
    size: int
    at: float
    alive: bool = True


class Writer:
    """The policy with the records waiting for the writer, as the store holds them."""

    def __init__(self, sync: str = "batch", window: float = WINDOW, max_batch_bytes: int = 1000):
        self.policy = GroupCommit(sync, window, max_batch_bytes)
        self.waiting: list[Rec] = []

    def record(self, at: float, size: int = 100) -> tuple[int, bool]:
        batch, wake = self.policy.record(size, at)
        self.waiting.append(Rec(batch, size, at))
        return batch, wake

    def wait(self, now: float, stopping: bool = False) -> float | None:
        return self.policy.wait(self.waiting, now, stopping)

    def write(self) -> list[Rec]:
        """The records the write starting now takes."""
        n = self.policy.take(self.waiting)
        taken, self.waiting = self.waiting[:n], self.waiting[n:]
        return taken


def test_nothing_waiting_means_no_write_and_the_first_record_wakes_the_writer():
    w = Writer()
    assert w.wait(5.0) is None
    assert w.record(5.0) == (0, True)
    assert w.record(5.0001) == (0, False)  # the writer is waiting for it already


def test_a_lone_record_is_written_after_the_linger_not_the_window():
    w = Writer()
    w.record(1.0)
    assert w.wait(1.0) == pytest.approx(WINDOW / 10)
    assert w.wait(1.0 + WINDOW / 10) == 0.0
    assert len(w.write()) == 1
    assert w.wait(1.0 + WINDOW) is None


def test_records_that_keep_coming_are_gathered_until_the_window_ends():
    w = Writer(max_batch_bytes=1 << 20)
    step = WINDOW / 20  # every half linger: the linger never runs out
    for i in range(15):
        now = 1.0 + i * step
        w.record(now)
        assert w.wait(now) > 0, i
    now = 1.0 + 15 * step
    w.record(now)
    assert w.wait(now) == pytest.approx(WINDOW / 10)  # the linger, shorter than the window
    w.record(1.0 + 19 * step)
    assert w.wait(1.0 + 19 * step) == pytest.approx(step)  # then the window's end
    assert w.wait(1.0 + WINDOW) == 0.0
    assert len(w.write()) == 17


def test_an_ack_is_gathered_like_a_record():
    w = Writer()
    assert w.policy.ack(2.0) is True
    assert w.policy.ack(2.0001) is False
    assert w.wait(2.0001) == pytest.approx(WINDOW / 10)
    assert w.wait(2.0001 + WINDOW / 10) == 0.0
    assert w.write() == []  # no record: the ACKs go alone
    assert w.wait(3.0) is None


def test_a_record_past_max_batch_bytes_closes_the_batch_which_is_written_at_once():
    w = Writer(max_batch_bytes=300)
    assert [w.record(1.0)[0] for _ in range(3)] == [0, 0, 0]  # 300 bytes: full, still open
    assert w.wait(1.0) > 0
    assert w.record(1.0) == (1, True)  # it would take batch 0 past 300: closed, wake up
    assert w.wait(1.0) == 0.0
    taken = w.write()
    assert [r.batch for r in taken] == [0, 0, 0]  # the closed batch only
    assert w.wait(1.0) > 0  # the open one gathers on


def test_one_write_takes_whole_batches_up_to_max_batch_bytes_of_live_records():
    w = Writer(max_batch_bytes=300)
    for _ in range(10):
        w.record(1.0)
    assert [r.batch for r in w.waiting] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert [r.batch for r in w.write()] == [0, 0, 0]
    for r in w.waiting[:3]:
        r.alive = False  # batch 1, ACKed before it was written: it costs no bytes
    assert [r.batch for r in w.write()] == [1, 1, 1, 2, 2, 2]
    assert [r.batch for r in w.write()] == [3]  # the open batch: taken, so it closes
    assert w.record(1.0)[0] == 4


def test_a_record_larger_than_max_batch_bytes_is_a_batch_of_its_own():
    w = Writer(max_batch_bytes=300)
    assert w.record(1.0, 100)[0] == 0
    assert w.record(1.0, 5000)[0] == 1
    assert w.record(1.0, 100)[0] == 2
    assert [r.size for r in w.write()] == [100]
    assert [r.size for r in w.write()] == [5000]  # alone, over the cap: one batch at least
    assert [r.size for r in w.write()] == [100]


def test_sync_always_writes_one_message_a_write_and_does_not_gather():
    w = Writer(sync="always")
    assert [w.record(1.0)[0] for _ in range(3)] == [0, 1, 2]
    assert w.wait(1.0) == 0.0
    w.waiting[0].alive = False  # ACKed before it was written: rides with the next live one
    assert [r.batch for r in w.write()] == [0, 1]
    assert w.wait(1.0) == 0.0
    assert [r.batch for r in w.write()] == [2]
    assert w.wait(1.0) is None


@pytest.mark.parametrize("sync, window", [("none", WINDOW), ("batch", 0.0)])
def test_without_a_window_what_comes_is_written_at_once(sync, window):
    w = Writer(sync=sync, window=window, max_batch_bytes=300)
    for _ in range(4):
        w.record(1.0)
    assert w.wait(1.0) == 0.0
    assert len(w.write()) == 3  # max_batch_bytes still bounds one write
    assert w.wait(1.0) == 0.0


def test_after_a_write_the_window_runs_from_the_oldest_record_left():
    w = Writer(max_batch_bytes=300)
    for i in range(4):
        w.record(1.0 + i * 0.001)
    w.write()  # batch 0; the record of batch 1 came at 1.003: its window ends at 1.013
    w.record(1.0125)  # not from the first record (1.0) nor from this one
    assert w.wait(1.0125) == pytest.approx(1.003 + WINDOW - 1.0125)


def test_a_failed_write_holds_the_next_for_a_backoff_doubling_to_its_cap():
    w = Writer(sync="always")
    now = 10.0
    waits = []
    for _ in range(10):
        w.record(now)
        w.write()
        w.policy.written(False, now)
        w.record(now)
        waits.append(w.wait(now))
        w.write()
    assert waits[:3] == pytest.approx([BACKOFF_MIN, 2 * BACKOFF_MIN, 4 * BACKOFF_MIN])
    assert all(a <= b for a, b in pairwise(waits))
    assert waits[-1] == BACKOFF_MAX
    assert w.wait(now) is None  # nothing waiting: no backoff to wait out
    w.record(now)
    assert w.wait(now + BACKOFF_MAX) == 0.0
    w.write()
    w.policy.written(True, now + BACKOFF_MAX)
    w.record(now + BACKOFF_MAX)
    assert w.wait(now + BACKOFF_MAX) == 0.0  # a good write: no more backoff
    w.write()
    w.policy.written(False, now + 2)
    assert w.policy.backoff == BACKOFF_MIN  # it starts again from the least


def test_stopping_ends_every_wait():
    w = Writer(max_batch_bytes=300)
    w.record(1.0)
    w.policy.written(False, 1.0)
    assert w.wait(1.0) > 0
    assert w.wait(1.0, stopping=True) == 0.0
    w.write()
    assert w.wait(1.0, stopping=True) is None  # nothing left: the writer can stop


@pytest.mark.parametrize("kw", [{"sync": "sometimes"}, {"max_batch_bytes": 0}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        GroupCommit(**kw)
