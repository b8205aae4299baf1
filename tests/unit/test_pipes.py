"""The pipe table: named-pipe semantics, fan-out, all-or-none per writer, flow control."""

import pytest

from zbroker.services.zpipes.pipes import PipeTable, ReadEnd, WriteResult


def read_all(table, end, size=1 << 30):
    got, _ = table.read(end, size)
    return got if isinstance(got, ReadEnd) else b"".join(got)


def test_one_writer_one_reader_in_order():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    for chunk in (b"a", b"bc", b"def"):
        assert t.write(2, chunk)[0] is WriteResult.ACCEPTED
    assert read_all(t, 1, 4) == b"abcd"
    assert read_all(t, 1) == b"ef"
    assert read_all(t, 1) is ReadEnd.WAIT
    t.detach(2)
    assert read_all(t, 1) is ReadEnd.END
    assert read_all(t, 1) is ReadEnd.END  # end-of-stream is sticky, like EOF


def test_data_is_drained_before_end():
    t = PipeTable()
    t.attach_writer(b"p", 2)
    t.attach_reader(b"p", 1)
    t.write(2, b"tail")
    t.detach(2)
    assert read_all(t, 1) == b"tail"
    assert read_all(t, 1) is ReadEnd.END


def test_reader_that_opened_first_waits_for_a_writer():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    assert read_all(t, 1) is ReadEnd.WAIT  # not END: no writer has come yet


def test_write_waits_for_a_reader_and_the_reader_wakes_it():
    t = PipeTable()
    t.attach_writer(b"p", 2)
    assert t.write(2, b"x") == (WriteResult.WAIT, set())
    assert t.attach_reader(b"p", 1) == {2}
    assert t.write(2, b"x")[0] is WriteResult.ACCEPTED


def test_a_write_wakes_waiting_readers():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.read(1, 10)
    assert t.write(2, b"x") == (WriteResult.ACCEPTED, {1})


def test_last_detach_discards_the_pipe_and_its_contents():
    """Seed bug "zpipes retains data for disconnected pipes"."""
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.write(2, b"stale")
    t.detach(2)
    t.detach(1)
    assert t.pipes == {}
    t.attach_reader(b"p", 3)
    t.attach_writer(b"p", 4)
    t.detach(4)
    assert read_all(t, 3) is ReadEnd.END  # nothing stale survived


def test_fan_out_every_reader_gets_every_byte():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_reader(b"p", 2)
    t.attach_writer(b"p", 3)
    t.write(3, b"one")
    t.write(3, b"two")
    assert read_all(t, 1) == read_all(t, 2) == b"onetwo"


def test_a_late_reader_never_gets_a_partial_stream():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.write(2, b"first")
    t.attach_reader(b"p", 3)  # missed "first": gets none of writer 2
    t.write(2, b"second")
    t.attach_writer(b"p", 4)  # a writer whose stream starts now reaches both
    t.write(4, b"W4")
    assert read_all(t, 1) == b"firstsecondW4"
    assert read_all(t, 3) == b"W4"


def test_chunks_of_writers_are_never_interleaved_and_order_holds_per_writer():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.attach_writer(b"p", 3)
    for i in range(3):
        t.write(2, b"A%d" % i * 3)
        t.write(3, b"B%d" % i * 3)
    data = read_all(t, 1)
    assert data == b"A0A0A0B0B0B0A1A1A1B1B1B1A2A2A2B2B2B2"


def test_writer_whose_readers_all_left_gets_no_readers():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.write(2, b"x")
    t.detach(1)
    assert t.write(2, b"y")[0] is WriteResult.NO_READERS
    t.attach_reader(b"p", 3)  # a new reader does not revive a broken stream
    assert t.write(2, b"y")[0] is WriteResult.NO_READERS


def test_writer_waiting_on_a_full_reader_is_told_when_it_leaves():
    t = PipeTable(capacity=4)
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.write(2, b"1234")
    assert t.write(2, b"5")[0] is WriteResult.WAIT
    assert t.detach(1) == {2}
    assert t.write(2, b"5")[0] is WriteResult.NO_READERS


def test_capacity_bounds_what_is_buffered():
    t = PipeTable(capacity=10)
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    accepted = 0
    while t.write(2, b"abc")[0] is WriteResult.ACCEPTED:
        accepted += 1
    assert accepted == 4 and t.buffered_bytes() == 12  # at most one chunk over capacity
    assert t.read(1, 2)[1] == set()  # 10 bytes left: still full
    assert t.read(1, 1)[1] == {2}  # room again: the writer is woken
    assert t.write(2, b"abc")[0] is WriteResult.ACCEPTED


def test_the_slowest_reader_of_the_audience_throttles_the_writer():
    t = PipeTable(capacity=3)
    t.attach_reader(b"p", 1)
    t.attach_reader(b"p", 2)
    t.attach_writer(b"p", 3)
    t.write(3, b"abc")
    read_all(t, 1)
    assert t.write(3, b"d")[0] is WriteResult.WAIT
    read_all(t, 2)
    assert t.write(3, b"d")[0] is WriteResult.ACCEPTED


def test_ends_cannot_be_reused():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    with pytest.raises(ValueError):
        t.attach_writer(b"q", 1)
    assert t.detach(99) == set()


def test_end_comes_only_when_every_writer_has_gone():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.attach_writer(b"p", 3)
    t.write(2, b"a")
    t.detach(2)
    assert read_all(t, 1) == b"a"
    assert read_all(t, 1) is ReadEnd.WAIT  # writer 3 is still there
    t.detach(3)
    assert read_all(t, 1) is ReadEnd.END


def test_a_lost_writer_fails_its_audience_after_the_data_it_sent():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.write(2, b"abc")
    t.attach_reader(b"p", 3)  # late: not in writer 2's audience
    t.detach(2, "disconnected")
    assert read_all(t, 1, 2) == b"ab"
    assert read_all(t, 1) == b"c"
    assert read_all(t, 1) is ReadEnd.FAILED
    assert t.failure(1) == "writer lost: disconnected"
    assert read_all(t, 1) is ReadEnd.FAILED  # sticky
    assert read_all(t, 3) is ReadEnd.WAIT  # it saw none of that stream: nothing was cut
    assert t.failure(3) is None


def test_a_lost_writer_that_had_not_started_breaks_nothing():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.detach(2, "expired")
    assert read_all(t, 1) is ReadEnd.WAIT  # not END: nobody closed a stream
    t.attach_writer(b"p", 3)
    t.detach(3)
    assert read_all(t, 1) is ReadEnd.END


def test_a_broken_reader_takes_no_more_data_and_holds_no_writer_back():
    t = PipeTable(capacity=4)
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.attach_writer(b"p", 3)
    t.write(2, b"ab")
    t.write(3, b"cd")  # reader 1 is full now
    t.detach(2, "disconnected")
    assert t.write(3, b"ef")[0] is WriteResult.NO_READERS  # not WAIT for ever, not ACCEPTED
    t.attach_reader(b"p", 4)
    t.attach_writer(b"p", 5)
    assert t.write(5, b"gh")[0] is WriteResult.ACCEPTED  # a new stream skips the broken reader
    assert read_all(t, 1) == b"abcd"
    assert read_all(t, 4) == b"gh"


def test_break_writer_fails_its_writes_and_its_readers_after_its_data():
    t = PipeTable()
    t.attach_reader(b"p", 1)
    t.attach_writer(b"p", 2)
    t.write(2, b"ok")
    t.break_writer(2, "too big")
    assert t.write(2, b"x")[0] is WriteResult.FAILED and t.failure(2) == "too big"
    t.detach(2)  # a close after the break
    assert read_all(t, 1) == b"ok"
    assert read_all(t, 1) is ReadEnd.FAILED and t.failure(1) == "writer lost: too big"
