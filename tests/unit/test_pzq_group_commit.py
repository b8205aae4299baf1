"""The group-commit policy of the pzq log, rule by rule, without threads, disk or clock: the
time is a number the test passes, and a writer that sleeps as the policy says is simulated
(the store's real writer on a real disk: test_pzq_store.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import pytest

from zbroker.services.pzq.core.group_commit import AVOIDING, BACKOFF_MAX, BACKOFF_MIN, GroupCommit

WINDOW = 0.010
LINGER = WINDOW / 10


@dataclass
class Rec:
    batch: int
    size: int
    at: float
    alive: bool = True


class Writer:
    """The policy with the records waiting for the writer, as the store holds them."""

    def __init__(self, sync: str = "batch", window: float = WINDOW,
                 max_batch_bytes: int = 1 << 20):
        self.policy = GroupCommit(sync, window, max_batch_bytes)
        self.waiting: list[Rec] = []

    def record(self, at: float, size: int = 100) -> tuple[int, bool]:
        batch, wake = self.policy.record(size, at)
        self.waiting.append(Rec(batch, size, at))
        return batch, wake

    def wait(self, now: float, stopping: bool = False) -> float | None:
        live = sum(r.size for r in self.waiting if r.alive)
        return self.policy.wait(self.waiting, live, now, stopping)

    def writes_at(self, now: float, arrivals: list[float] = (), avoided: list[float] = ()
                  ) -> float:
        """The writer looks at ``now`` and sleeps as the policy says, while records come at
        the times ``arrivals``, and consumers ACK records that wait at the times ``avoided``
        (one that says wake, wakes it): when it writes."""
        events = sorted([(at, "record") for at in arrivals] + [(at, "ack") for at in avoided])
        while (wait := self.wait(now)) != 0.0:
            wake = math.inf if wait is None else now + wait
            while events and events[0][0] <= wake:
                at, kind = events.pop(0)
                if self.record(at)[1] if kind == "record" else self.policy.ack(at, True):
                    wake = at
                    break
            assert wake < math.inf, "the writer would sleep for ever"
            now = wake
        return now

    def write(self) -> list[Rec]:
        """The records the write starting now takes."""
        n = self.policy.take(self.waiting)
        taken, self.waiting = self.waiting[:n], self.waiting[n:]
        return taken


def test_nothing_waiting_means_no_write_and_the_first_record_wakes_the_writer():
    w = Writer()
    assert w.wait(5.0) is None
    assert w.record(5.0) == (0, True)
    assert w.record(5.0001) == (0, False)  # the writer is looking already


def test_a_lone_record_is_written_after_a_linger_not_the_window():
    w = Writer()
    assert w.writes_at(1.0, [1.0]) == pytest.approx(1.0 + LINGER)
    assert len(w.write()) == 1
    assert w.wait(5.0) is None


def test_records_that_keep_coming_are_gathered_until_the_window_ends():
    w = Writer()
    steady = [1.0] + [1.0 + LINGER / 4 + i * LINGER / 2 for i in range(100)]  # 5 windows
    assert w.writes_at(1.0, steady) == pytest.approx(1.0 + WINDOW)
    assert len(w.write()) == 21  # one write for all that came within the window


def test_while_consumers_ack_records_that_wait_a_batch_gathers_up_to_avoiding_windows():
    w = Writer()
    steady = [1.0] + [1.0 + LINGER / 4 + i * LINGER / 2 for i in range(200)]  # 10 windows
    acks = [1.0 + LINGER / 3 + i * LINGER / 2 for i in range(200)]  # each consumed at once
    written = w.writes_at(1.0, steady, acks)
    assert written == pytest.approx(1.0 + AVOIDING * WINDOW)
    assert written > 1.0 + 2 * WINDOW  # well past the window of a batch nobody consumes
    # it takes what waited AVOIDING / 2 windows or more: the younger records are most
    # likely on their way to a consumer, and wait for the next write
    cut = written - AVOIDING / 2 * WINDOW
    taken = w.write()
    assert len(taken) == 1 + 2 * AVOIDING * 10 // 2
    assert max(r.at for r in taken) <= cut < min(r.at for r in w.waiting)
    first = w.waiting[0].at
    again = w.writes_at(written, [at for at in steady if at > written],
                        [at for at in acks if at > written])
    assert again == pytest.approx(first + AVOIDING * WINDOW)  # none waits more than that
    assert w.write()[0].at == first


def test_while_consumers_keep_up_no_record_waits_more_than_avoiding_windows():
    w = Writer()
    arrivals = [1.0 + i * LINGER * 0.7 for i in range(400)]  # 28 windows
    acks = [at + LINGER / 3 for at in arrivals]
    now, writes = 0.5, []
    while w.waiting or now < arrivals[-1]:
        now = w.writes_at(now, [at for at in arrivals if at > now],
                          [at for at in acks if at > now])
        writes.append((now, w.write()))
    taken = [(at, r) for at, batch in writes for r in batch]
    assert sorted(r.at for _, r in taken) == arrivals  # each once
    assert all(at - r.at <= AVOIDING * WINDOW + 1e-9 for at, r in taken)
    # while the ACKs came, every write took only what waited AVOIDING / 2 windows or more
    assert all(at - r.at >= AVOIDING / 2 * WINDOW - 1e-9
               for at, r in taken if at < acks[-1])
    assert len(writes) < len(arrivals) / 10


def test_records_acked_before_they_were_written_ride_along_up_to_the_first_young_live_one():
    w = Writer()
    w.policy.ack(1.0, True)  # a consumer ACKed a record that waited
    for at in (1.0, 1.0 + 4 * WINDOW, 1.0 + 4.2 * WINDOW, 1.0 + 4.5 * WINDOW):
        w.record(at)
    w.waiting[1].alive = w.waiting[3].alive = False  # ACKed: never written
    w.policy.ack(1.0 + 4.9 * WINDOW, True)
    assert w.wait(1.0 + AVOIDING * WINDOW) == 0.0  # its deadline
    assert [r.at for r in w.write()] == [1.0, 1.0 + 4 * WINDOW]
    assert len(w.waiting) == 2


def test_consumers_count_as_keeping_up_until_avoiding_windows_after_the_last_ack():
    w = Writer()
    steady = [1.0] + [1.0 + LINGER / 4 + i * LINGER / 2 for i in range(200)]
    acks = [1.0 + LINGER / 3 + i * LINGER / 2 for i in range(20)]  # for one window
    last = acks[-1]
    assert w.writes_at(1.0, steady, acks) == pytest.approx(1.0 + AVOIDING * WINDOW)
    w.write()  # (the records younger than AVOIDING / 2 windows wait)
    first = w.waiting[0].at
    # the gathering goes on as long as consumers keep up; once they have not ACKed a
    # record that waits for AVOIDING windows, what waits is past its own window: written
    # when the writer first looks then (it looks every AVOIDING lingers), all of it
    now = 1.0 + AVOIDING * WINDOW
    written = w.writes_at(now, [at for at in steady if at > now])
    assert last + AVOIDING * WINDOW <= written < last + AVOIDING * (WINDOW + LINGER) + 1e-9
    assert written > first + WINDOW
    w.write()
    assert all(r.at > written - LINGER * AVOIDING for r in w.waiting)


def test_while_consumers_keep_up_closed_batches_wait_up_to_avoiding_times_their_bytes():
    w = Writer(max_batch_bytes=300)
    for _ in range(4):
        w.record(1.0)  # the fourth closed batch 0
    assert w.wait(1.0) == 0.0  # nobody consumes: a closed batch is written at once
    w = Writer(max_batch_bytes=300)
    w.policy.ack(1.0, True)  # a consumer ACKed a record that waited
    for _ in range(3 * AVOIDING):
        w.record(1.0)
    assert w.waiting[-1].batch == AVOIDING - 1  # closed batches wait: AVOIDING x 300 B
    assert w.wait(1.0) > 0
    w.waiting[0].alive = False  # one of them consumed: never written, it costs no bytes
    w.record(1.0)
    assert w.wait(1.0) > 0
    w.record(1.0)  # past AVOIDING x 300 B of live records: written now
    assert w.wait(1.0) == 0.0
    assert [r.batch for r in w.write()] == [0, 0, 0]  # one write: at most 300 B live


def test_acks_that_avoid_nothing_do_not_lengthen_the_gathering():
    w = Writer()
    steady = [1.0] + [1.0 + LINGER / 4 + i * LINGER / 2 for i in range(100)]
    for at in steady[:40]:
        w.policy.ack(at)  # ACK records of messages written before: they must be written
    assert w.writes_at(1.0, steady) == pytest.approx(1.0 + WINDOW)


def test_the_writer_writes_once_a_linger_passed_without_anything_new():
    w = Writer()
    burst = [1.0 + i * LINGER / 2 for i in range(6)]  # a burst of 2.5 lingers, then nothing
    # it looks at 1.0, then at +L, +2L, +3L, each time after something new, and at +4L not
    assert w.writes_at(1.0, burst) == pytest.approx(1.0 + 4 * LINGER)
    assert len(w.write()) == 6


def test_what_waited_a_linger_during_a_write_is_written_as_soon_as_the_write_ends():
    """The disk is what the records wait for then: a further gathering would leave it idle
    (more of what comes is gathered during the next write). The same when the writer was
    slow to wake."""
    w = Writer()
    w.record(1.0)
    w.record(1.0 + LINGER / 2)  # came while the writer was writing
    # the write ends at 1.0 + 2L: they have waited 1.5 lingers and more, written then
    assert w.writes_at(1.0 + 2 * LINGER, [1.0 + 2.5 * LINGER]) == 1.0 + 2 * LINGER
    assert len(w.write()) == 2
    w.record(2.0)
    assert w.writes_at(2.0 + WINDOW) == 2.0 + WINDOW  # its window has passed: at once
    w.write()
    w.record(3.0 - LINGER / 2)  # came half a linger before the write ended: a linger to grow
    assert w.writes_at(3.0) == pytest.approx(3.0 + LINGER)
    w.write()
    fresh = Writer()
    fresh.record(5.0)  # the writer, idle, is woken by it, but gets to look only 1.5 L later
    assert fresh.writes_at(5.0 + 1.5 * LINGER) == 5.0 + 1.5 * LINGER
    w.policy.ack(4.0 - LINGER * 3, True)  # while consumers keep up it gathers on (see above)
    w.record(4.0 - LINGER * 2)
    assert w.wait(4.0) > 0


def test_after_a_write_the_writer_looks_afresh():
    w = Writer(max_batch_bytes=300)
    at = 1.0 + LINGER / 5
    assert w.writes_at(1.0, [1.0, at, at, at]) == at  # the fourth record closed batch 0
    assert len(w.write()) == 3  # batch 1, open, waits
    # the write ends at 1.0 + L/2: the writer looks then, not on its look of 1.0
    assert w.writes_at(1.0 + LINGER / 2) == pytest.approx(1.0 + LINGER / 2 + LINGER)


def test_an_ack_is_gathered_like_a_record():
    w = Writer()
    assert w.policy.ack(2.0) is True
    assert w.policy.ack(2.0001) is False
    assert w.writes_at(2.0) == pytest.approx(2.0 + LINGER)
    assert w.write() == []  # no record: the ACKs go alone
    assert w.wait(3.0) is None


def test_a_record_past_max_batch_bytes_closes_the_batch_which_is_written_at_once():
    w = Writer(max_batch_bytes=300)
    assert [w.record(1.0)[0] for _ in range(3)] == [0, 0, 0]  # 300 bytes: full, still open
    assert w.wait(1.0) > 0
    assert w.record(1.0) == (1, True)  # it would take batch 0 past 300: closed, wake up
    assert w.wait(1.0) == 0.0
    assert [r.batch for r in w.write()] == [0, 0, 0]  # the closed batch only
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
    assert w.writes_at(now, [now]) == now + BACKOFF_MAX
    w.write()
    w.policy.written(True, now + BACKOFF_MAX)
    w.record(now + BACKOFF_MAX)
    assert w.wait(now + BACKOFF_MAX) == 0.0  # a good write: no more backoff
    w.write()
    w.policy.written(False, now + 2)
    assert w.policy.backoff == BACKOFF_MIN  # it starts again from the least


def test_stopping_ends_every_wait():
    w = Writer()
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
