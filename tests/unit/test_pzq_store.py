"""The pzq store on a real disk: group commit, recovery, torn tails, ACKs, retention,
write avoidance, failures."""

from __future__ import annotations

import errno
import os
import queue
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import wait_for

from zbroker.services.pzq.core import records
from zbroker.services.pzq.store import BatchResult, Store, list_segments, segment_name
from zbroker.services.pzq.writers import Writers, shared

WAIT = 10.0


class FakeClock:
    """A clock the test moves by hand, for a store and writer threads of its own: the
    store's windows and lingers pass when the test says, not in real time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.writers = Writers(threads=1, clock=self)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.writers.clock_moved()


class Harness:
    """A store whose reports come back to the test thread (standing in for the loop); with
    ``clock`` (a FakeClock), its time is that clock's."""

    def __init__(self, directory: Path, clock: FakeClock | None = None, **kw):
        self.clock = clock
        self.store = Store(directory, **kw) if clock is None else Store(directory, clock=clock,
                                                                        **kw)
        self.recovered = self.store.open()
        self.results: queue.Queue[BatchResult] = queue.Queue()
        self.writers = shared() if clock is None else clock.writers
        self.store.start(self.results.put, self.writers)
        self.completed: set[int] = set()
        self.failed: list[BatchResult] = []

    def timer(self, after: float | None = None) -> float:
        """When the writer's next look at the store is due (on ``clock``), once it has set
        that timer (one other than ``after``, the one it had)."""
        writers = self.writers
        return wait_for(lambda: (due := writers.due(self.store)) not in (None, after) and due,
                        WAIT, "the writer to set its timer")

    def append(self, seq: int, body: bytes = b"x" * 20) -> int:
        return self.store.append(seq, b"key-%d" % seq, b"id-%d" % seq, [body])

    def wait_batch(self, batch: int) -> None:
        while batch not in self.completed:
            self.take(WAIT)

    def take(self, timeout: float) -> BatchResult:
        r = self.results.get(timeout=timeout)
        self.store.complete(r)
        self.completed.update(r.batches)
        if r.error:
            self.failed.append(r)
        return r

    def settle(self) -> None:
        """Take reports until the writer has nothing left to do for the store (no turn now
        or by a timer; what the reports taken made it do, done)."""
        deadline = time.monotonic() + WAIT
        while True:
            try:
                self.take(0.01)
                continue
            except queue.Empty:
                pass
            if not self.writers.busy(self.store) and self.results.empty():
                return  # (a turn reports before it ends: nothing can come now)
            assert time.monotonic() < deadline, "the writer did not settle"

    def close(self) -> None:
        assert self.store.close()
        while not self.results.empty():
            self.store.complete(self.results.get())


def recover(directory: Path):
    """What a store finds on disk (opened and closed again)."""
    store = Store(directory)
    try:
        return store.open()
    finally:
        store.close()


def seqs(recovered) -> list[int]:
    return [m.seq for m in recovered.messages]


def test_messages_survive_reopen_and_acks_are_durable(tmp_path):
    h = Harness(tmp_path, sync="batch", sync_window=0.001)
    for seq in range(10):
        b = h.append(seq)
    h.wait_batch(b)
    for seq in (0, 3, 9):
        h.store.ack(seq)
    h.settle()
    h.close()
    again = recover(tmp_path)
    assert seqs(again) == [1, 2, 4, 5, 6, 7, 8]
    assert again.next_seq == 10
    m = again.messages[0]
    assert (m.key, m.msg_id, m.frames) == (b"key-1", b"id-1", (b"x" * 20,))


@pytest.mark.parametrize("sync", ["batch", "always", "none"])
def test_each_sync_mode_stores_and_counts_syncs(tmp_path, sync):
    h = Harness(tmp_path, sync=sync, sync_window=0.001)
    batches = [h.append(seq) for seq in range(20)]
    h.wait_batch(max(batches))
    assert set(batches) <= h.completed
    if sync == "always":
        assert len(set(batches)) == 20 and h.store.syncs >= 20
    elif sync == "batch":
        assert 1 <= h.store.syncs <= 20
    else:
        assert h.store.syncs == 0
    h.close()
    assert seqs(recover(tmp_path)) == list(range(20))


def test_group_commit_puts_many_messages_in_one_fsync(tmp_path):
    h = Harness(tmp_path, sync="batch", sync_window=0.05)
    batches = {h.append(seq) for seq in range(500)}
    h.wait_batch(max(batches))
    assert h.store.syncs <= 3, h.store.syncs
    h.close()


def test_a_lone_message_is_written_without_waiting_out_the_window(tmp_path):
    """A producer that waits for each ACK sends nothing more: its message is written once
    nothing else came for a tenth of the window, not after the whole window."""
    clock = FakeClock()
    start = clock.now
    h = Harness(tmp_path, clock, sync="batch", sync_window=60.0)
    b = h.append(0)
    due = h.timer()
    assert due == pytest.approx(start + 6.0)  # it looks again in a linger, a tenth of 60 s
    clock.advance(due - clock.now - 0.1)
    assert h.results.empty() and h.timer() == due  # not yet
    clock.advance(due - clock.now)
    r = h.take(WAIT)  # queue.Empty here if it waited on for the 60 s window
    assert b in r.batches and h.store.syncs == 1
    h.close()


def test_records_that_keep_coming_are_gathered_into_one_batch(tmp_path):
    clock = FakeClock()
    h = Harness(tmp_path, clock, sync="batch", sync_window=20.0)  # lingers 2 s for the next
    batches = {h.append(0)}
    first = h.timer()  # the writer has looked: it lingers
    for seq in range(1, 10):
        clock.advance(0.05)
        batches.add(h.append(seq))
    assert len(batches) == 1
    clock.advance(first - clock.now)  # a linger after it looked: more came, so it lingers on
    again = h.timer(after=first)
    assert again == pytest.approx(first + 2.0) and h.results.empty()
    clock.advance(again - clock.now)  # nothing new for a linger: written
    r = h.take(WAIT)
    assert batches <= set(r.batches)
    assert h.store.syncs == 1  # ten records arriving 50 ms apart: one write, one fdatasync
    h.close()
    assert seqs(recover(tmp_path)) == list(range(10))


def test_write_avoidance_an_acked_pending_message_is_never_written(tmp_path):
    h = Harness(tmp_path, sync="batch", sync_window=0.2)  # a long window: it stays pending
    b = h.append(0, b"A" * 1000)
    h.append(1, b"B" * 1000)
    h.store.ack(0)  # consumed before its batch was written
    h.wait_batch(b)  # its batch still completes: its producer gets its ACK
    assert h.store.avoided_messages == 1 and h.store.avoided_bytes > 1000
    h.close()
    data = b"".join((tmp_path / segment_name(n)).read_bytes() for n in list_segments(tmp_path))
    assert b"A" * 1000 not in data and b"B" * 1000 in data
    assert seqs(recover(tmp_path)) == [1]


def test_segments_roll_and_fully_acked_ones_are_deleted(tmp_path):
    h = Harness(tmp_path, sync="none", sync_window=0, segment_size=4096)
    last = 0
    for seq in range(200):
        last = h.append(seq, b"y" * 100)
        if seq % 20 == 19:
            h.wait_batch(last)  # several batches, so several segments
    h.wait_batch(last)
    assert len(list_segments(tmp_path)) > 3
    for seq in range(190):
        h.store.ack(seq)
    h.settle()
    h.store.append(999, b"k", b"i", [b"z"])  # a write after the ACKs: the collector runs
    h.settle()
    h.close()
    left = list_segments(tmp_path)
    assert len(left) <= 3, left  # what holds the 10 unACKed ones and the newest
    assert seqs(recover(tmp_path)) == [*range(190, 200), 999]


def test_recovery_of_an_old_log_deletes_segments_without_live_messages(tmp_path):
    h = Harness(tmp_path, sync="none", sync_window=0, segment_size=4096)
    for seq in range(100):
        h.wait_batch(h.append(seq, b"y" * 100))
    for seq in range(100):
        h.store.ack(seq)
    h.settle()
    h.close()
    h2 = Harness(tmp_path, sync="none")
    assert seqs(h2.recovered) == []
    h2.settle()
    h2.close()
    assert len(list_segments(tmp_path)) <= 1


def _build_log(directory: Path) -> tuple[bytes, list[tuple[int, records.MessageRecord
                                                          | records.AckRecord]]]:
    """A one-segment log: 6 messages, then an ACK of 2 of them, then 2 more messages and an
    ACK; one fsynced batch per record. Returns the bytes and the (end, record) list."""
    h = Harness(directory, sync="batch", sync_window=0)
    for seq in range(6):
        h.wait_batch(h.append(seq))
    h.store.ack(1)
    h.store.ack(4)
    h.settle()
    for seq in (6, 7):
        h.wait_batch(h.append(seq))
    h.store.ack(6)
    h.settle()
    h.close()
    [segment] = list_segments(directory)
    data = (directory / segment_name(segment)).read_bytes()
    return data, list(records.scan(data))


def test_torn_tail_at_every_byte_offset_loses_nothing_acked(tmp_path):
    src = tmp_path / "src"
    data, recs = _build_log(src)
    assert recs[-1][0] == len(data)
    tail_start = recs[-5][0]  # the last four records: ack(1,4), msg 6, msg 7, ack(6)
    for cut in range(tail_start, len(data) + 1):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / segment_name(0)).write_bytes(data[:cut])
        found = recover(d)
        complete = [r for end, r in recs if end <= cut]
        expect = {r.seq for r in complete if isinstance(r, records.MessageRecord)}
        for r in complete:
            if isinstance(r, records.AckRecord):
                expect -= set(r.seqs)
        assert set(seqs(found)) == expect, cut
        good = max([end for end, _ in recs if end <= cut], default=0)
        assert (d / segment_name(0)).stat().st_size == good  # the torn tail is cut off
        assert found.truncated_bytes == cut - good
        # and the store goes on writing after it: a second recovery sees the new message
        h = Harness(d, sync="none", sync_window=0)
        h.wait_batch(h.append(100))
        h.close()
        assert set(seqs(recover(d))) == expect | {100}
        shutil.rmtree(d)


def test_garbage_tail_is_truncated(tmp_path):
    h = Harness(tmp_path, sync="none")
    h.wait_batch(h.append(0))
    h.close()
    seg = tmp_path / segment_name(list_segments(tmp_path)[0])
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(os.urandom(100))
    found = recover(tmp_path)
    assert seqs(found) == [0] and found.truncated_bytes == 100
    assert seg.stat().st_size == size


def test_a_failed_write_fails_its_batch_and_the_store_goes_on(tmp_path, monkeypatch):
    h = Harness(tmp_path, sync="batch", sync_window=0)
    h.wait_batch(h.append(0))
    real_writev = os.writev
    fail = {"on": True}

    def writev(fd, buffers):
        if fail["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", writev)
    b = h.append(1)
    h.wait_batch(b)
    assert h.failed and h.failed[-1].failed == (1,)
    assert "No space left on device" in h.failed[-1].error
    fail["on"] = False
    h.wait_batch(h.append(2))
    h.close()
    assert seqs(recover(tmp_path)) == [0, 2]


def test_a_batch_holds_at_most_max_batch_bytes_and_a_full_one_is_written_at_once(tmp_path):
    """Each fdatasync covers at most max_batch_bytes, so the first messages of a burst are
    ACKed after their own part of it; a full batch does not wait for the sync window."""
    body = b"b" * 1000
    record = records.HEADER.size + sum(
        len(p) for p in records.message_parts(0, b"key-0", b"id-0", [body]))
    h = Harness(tmp_path, sync="batch", sync_window=60.0, max_batch_bytes=3 * record)
    batches = [h.append(seq, body) for seq in range(10)]
    assert batches == [batches[0]] * 3 + [batches[3]] * 3 + [batches[6]] * 3 + [batches[9]]
    assert len(set(batches)) == 4
    h.wait_batch(batches[6])  # three full batches: written long before the 60 s window
    assert batches[9] not in h.completed  # the open one still gathers
    h.close()
    assert seqs(recover(tmp_path)) == list(range(10))
    assert h.store.syncs == 4  # one per batch, the last at close


def test_a_message_larger_than_max_batch_bytes_is_a_batch_of_its_own(tmp_path):
    h = Harness(tmp_path, sync="batch", sync_window=60.0, max_batch_bytes=4096)
    small = h.append(0, b"s" * 100)
    big = h.append(1, b"B" * 10_000)
    after = h.append(2, b"s" * 100)
    assert small < big < after
    h.wait_batch(big)
    assert small in h.completed and after not in h.completed
    h.close()
    assert seqs(recover(tmp_path)) == [0, 1, 2]


def test_short_writes_are_continued(tmp_path, monkeypatch):
    real_writev = os.writev

    def writev(fd, buffers):  # the kernel may write less than asked: 777 bytes at most
        out, left = [], 777
        for b in buffers:
            if left <= 0:
                break
            out.append(memoryview(b)[:left])
            left -= len(out[-1])
        return real_writev(fd, out)

    monkeypatch.setattr(os, "writev", writev)
    h = Harness(tmp_path, sync="batch", sync_window=0.001)
    bodies = {seq: bytes([65 + seq]) * (300 + 2000 * seq) for seq in range(6)}
    last = 0
    for seq, body in bodies.items():
        last = h.append(seq, body)
    h.wait_batch(last)
    h.close()
    monkeypatch.undo()
    got = recover(tmp_path)
    assert [(m.seq, m.frames) for m in got.messages] == [(s, (b,)) for s, b in bodies.items()]


def test_compaction_frees_segments_held_by_a_few_old_messages(tmp_path):
    """One old unACKed message must not keep every later segment on disk."""
    h = Harness(tmp_path, sync="none", sync_window=0, segment_size=4096)
    bodies = {}
    for seq in range(400):
        bodies[seq] = b"%05d" % seq + b"y" * 95
        b = h.store.append(seq, b"key-%d" % seq, b"id-%d" % seq, [bodies[seq]])
        if seq % 20 == 19:
            h.wait_batch(b)
            for done in range(max(1, seq - 19), seq + 1):
                h.store.ack(done)  # everything but seq 0 is ACKed once written
            for old in h.store.to_compact(backlog_bytes=100):  # what QueueCore does
                h.store.move(old, b"key-%d" % old, b"id-%d" % old, [bodies[old]])
    h.settle()
    h.store.append(1000, b"k", b"i", [b"last"])
    h.settle()
    assert h.store.moved_messages >= 1
    h.close()
    assert len(list_segments(tmp_path)) <= 4, list_segments(tmp_path)
    again = recover(tmp_path)
    assert seqs(again) == [0, 1000]  # one copy of 0, however many moves


def test_an_ack_during_a_move_is_not_lost(tmp_path):
    h = Harness(tmp_path, sync="batch", sync_window=0.2)
    h.wait_batch(h.append(0))
    h.store.move(0, b"key-0", b"id-0", [b"x" * 20])  # pending: the writer waits its window
    h.store.ack(0)
    h.settle()
    h.close()
    assert seqs(recover(tmp_path)) == []


def test_reports_say_which_consumer_acks_a_crash_can_no_longer_undo(tmp_path):
    h = Harness(tmp_path, sync="batch", sync_window=0.2)
    b = h.append(0)
    h.append(1)
    h.store.ack(0)  # before its write: never written, final once its batch completes
    r = h.take(WAIT)
    assert b in r.batches and r.acked == (0,) and r.placed == (1,)
    h.store.ack(1)  # written: final once its ACK record is synced
    r = h.take(WAIT)
    assert r.acked == (1,) and r.batches == ()
    h.close()
    assert seqs(recover(tmp_path)) == []


def test_an_ack_waiting_for_the_lock_while_the_writer_takes_the_acks_is_written(tmp_path):
    """The writer takes the queued ACKs, under the store's lock, by leaving a new list in
    their place: an ACK that waited for that lock goes in the new list (and the next write),
    never in the list already being written."""
    h = Harness(tmp_path, sync="batch", sync_window=0.01)
    h.append(0)
    h.append(1)
    h.settle()  # both written: an ACK of either needs an ACK record
    store = h.store

    def waits_for_the_lock() -> bool:
        frame = sys._current_frames().get(acking.ident)  # its innermost: taking the lock
        return (frame is not None and frame.f_code is threading.Condition.__enter__.__code__
                and frame.f_back is not None and frame.f_back.f_code.co_name == "ack_many")

    with store._cond:  # as the writer holds it while it takes what waits
        acking = threading.Thread(target=store.ack, args=(1,))
        acking.start()
        wait_for(waits_for_the_lock, WAIT, "the ACK to wait for the lock")
        taken, store._pending_acks = store._pending_acks, []  # as the writer's take does
    acking.join(WAIT)
    assert taken == []
    h.settle()
    h.close()
    assert seqs(recover(tmp_path)) == [0]


def test_the_log_checksum_is_zlibs_crc32_whichever_library_computes_it(tmp_path):
    """Records are checksummed with ISA-L's CRC-32 where it is installed: it must be the very
    CRC-32 zlib computes, whole and continued part by part, or logs written before (or by a
    queue without ISA-L) would read as torn."""
    import random
    import zlib

    rng = random.Random(7)
    for size in (0, 1, 100, 4095, 4097, 65536, 300_001):
        data = rng.randbytes(size)
        assert records.crc32(data) == zlib.crc32(data)
        assert records.crc32(memoryview(data)[size // 3:]) == zlib.crc32(data[size // 3:])
        parts = [data[:size // 2], data[size // 2:], b"tail"]
        assert records.frame_record(parts)[0] == records.HEADER.pack(
            sum(map(len, parts)), zlib.crc32(b"".join(parts)))
    # a log checksummed by zlib reads back whole, and one the store writes checks with zlib
    body = rng.randbytes(70_000)
    payload = b"".join(records.message_parts(1, b"k1", b"i1", [body]))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / segment_name(0)).write_bytes(
        records.HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
    assert [(m.seq, m.frames) for m in recover(tmp_path / "old").messages] == [(1, (body,))]
    h = Harness(tmp_path / "new", sync="none", sync_window=0)
    h.wait_batch(h.append(2, body))
    h.close()
    data = (tmp_path / "new" / segment_name(0)).read_bytes()
    size, crc = records.HEADER.unpack_from(data, 0)
    assert crc == zlib.crc32(data[records.HEADER.size:records.HEADER.size + size])


def test_isal_computes_the_checksum_where_it_has_a_wheel():
    """The dependency is declared for these machines: falling back to zlib's (4x slower on
    64 KiB) there would be a silent loss."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        pytest.skip("no ISA-L wheel for this machine")
    assert records.crc32.__module__.startswith("isal")
