"""Reader groups on a stream queue: each group its own committed offset, retention that
follows the slowest group (or limits that win over it, telling the group what it lost).
The core without sockets first, then real ``pzq`` processes (SIGKILL in the middle)."""

from __future__ import annotations

import threading

import pytest
from pzq_helpers import FakeStore, dealer, recv, wait_counter
from test_pzq_stream import STREAM, put

from pzq import wire
from pzq.client import Producer, StreamConsumer, StreamError
from zbroker.services.pzq.core.queue import QueueCore
from zbroker.services.pzq.core.stream import Offsets, Retention, StreamCore

# --- the core, without sockets -------------------------------------------------------------


class Reader:
    """Requests of one group to a StreamCore, with the offsets file written at once."""

    def __init__(self, st: StreamCore, group: str | None):
        self.st, self.group = st, group

    def ask(self, *request: bytes, write: bool = True) -> list[bytes] | None:
        prefix = [wire.GROUP, self.group.encode()] if self.group is not None else []
        reply = self.st.request([b"r", b"", *prefix, *request])
        if reply is None and write:
            replies = self.st.written(self.st.to_write(), None)
            assert len(replies) == 1, replies
            reply = replies[0]
        return reply[2:] if reply is not None else None


def stream_core(n: int = 10, retention: Retention | None = None
                ) -> tuple[QueueCore, StreamCore, FakeStore]:
    store = FakeStore()
    q = store.attach(QueueCore(stream=True))
    put(q, n)
    q.batch_done(store.done(placed=tuple(range(n))))
    return q, StreamCore(q, Offsets({"default": 0}), retention), store


def test_groups_commit_on_their_own_and_the_slowest_holds_the_messages():
    q, st, store = stream_core()
    a, b, old = Reader(st, "a"), Reader(st, "b"), Reader(st, None)
    assert old.ask(b"HEAD") == [b"OK", b"10", b"0"]  # the default group, as before
    assert a.ask(b"HEAD") == [b"OK", b"10", b"0", b"0", b"0"]  # made at the oldest offset
    assert b.ask(b"HEAD") == [b"OK", b"10", b"0", b"0", b"0"]
    assert a.ask(b"COMMIT", b"6") == [b"OK", b"10", b"6", b"0", b"0"]
    assert b.ask(b"HEAD")[2] == b"0" and old.ask(b"HEAD")[2] == b"0"
    assert len(q.messages) == 10  # b and default have read nothing
    old.ask(b"COMMIT", b"8")
    b.ask(b"COMMIT", b"4")
    assert sorted(q.messages) == [4, 5, 6, 7, 8, 9]  # below the slowest group, b
    reply = b.ask(b"RANGE", b"0", b"10")
    assert reply[1:7] == [b"10", b"4", b"10", b"6", b"0", b"0"]  # from its own offset
    assert st.offsets.groups == {"default": 8, "a": 6, "b": 4}
    assert st.counters()["group.b.lag"] == 6


def test_a_deleted_group_holds_nothing_and_a_new_one_starts_at_the_oldest_offset():
    q, st, store = stream_core()
    a, b = Reader(st, "a"), Reader(st, "b")
    a.ask(b"HEAD")
    Reader(st, None).ask(b"COMMIT", b"9")
    a.ask(b"COMMIT", b"3")
    assert min(q.messages) == 3
    assert b.ask(b"HEAD")[2] == b"3"  # a new group starts where the oldest message is
    assert a.ask(b"DELETE") == [b"OK"]
    b.ask(b"COMMIT", b"5")
    assert min(q.messages) == 5 and "a" not in st.offsets.groups
    assert a.ask(b"DELETE")[:1] == [b"ERROR"]  # gone


@pytest.mark.parametrize("request_, reason", [
    ([wire.GROUP, b"", b"HEAD"], "must not be empty"),
    ([wire.GROUP, b"x" * 256, b"HEAD"], "at most 255 bytes"),
    ([wire.GROUP, b"a b", b"HEAD"], "made of a-z"),
    ([wire.GROUP, b"a"], "GROUP takes a name and a request"),
    ([wire.GROUP, b"a", b"GROUPS"], "GROUP is followed by"),
    ([wire.GROUP, b"a", b"DELETE", b"1"], "DELETE takes no argument"),
    ([wire.GROUPS, b"1"], "GROUPS takes no argument"),
])
def test_bad_group_requests_get_a_reason(request_, reason):
    r = wire.decode_stream_request(request_)
    assert isinstance(r, wire.WireError) and reason in r.reason


def test_commits_of_an_unknown_group_or_past_the_head_are_refused_and_change_nothing():
    q, st, store = stream_core()
    a = Reader(st, "a")
    reply = a.ask(b"COMMIT", b"3")
    assert reply[0] == b"ERROR" and b"no group 'a'" in reply[1]
    a.ask(b"HEAD")
    reply = a.ask(b"COMMIT", b"11")
    assert reply == [b"ERROR", b"COMMIT end 11 is past the head 10"]
    assert st.offsets.groups == {"default": 0, "a": 0} and len(q.messages) == 10
    assert Reader(st, None).ask(b"COMMIT", b"11")[2] == b"10"  # the default group: clamped


def test_no_more_than_max_groups():
    q, st, store = stream_core()
    for i in range(63):
        Reader(st, f"g{i}").ask(b"HEAD")
    reply = Reader(st, "one-too-many").ask(b"HEAD")
    assert reply[0] == b"ERROR" and b"too many groups" in reply[1]


def test_a_failed_write_fails_what_waited_and_changes_nothing():
    q, st, store = stream_core()
    assert st.request([b"r", b"", wire.GROUP, b"a", b"HEAD"]) is None
    assert st.written(st.to_write(), "commit failed: disk full") == [
        [b"r", b"", b"ERROR", b"commit failed: disk full"]]
    assert "a" not in st.offsets.groups
    assert Reader(st, "a").ask(b"HEAD")[2] == b"0"  # asked again: made


def test_retention_bytes_drop_the_oldest_and_the_groups_behind_are_told_until_they_commit():
    # each message costs len(id) + len(body) + 32 = 3 + 5 + 32 = 40 bytes
    q, st, store = stream_core(10, Retention(bytes=200))
    a, b = Reader(st, "a"), Reader(st, "b")
    a.ask(b"HEAD")
    b.ask(b"HEAD")
    b.ask(b"COMMIT", b"7")
    st.enforce_retention(0)  # 400 bytes, 200 allowed: offsets 0..4 go
    st.written(st.to_write(), None)
    assert sorted(q.messages) == [5, 6, 7, 8, 9]  # a and default are moved to 5
    head = a.ask(b"HEAD")
    assert head == [b"OK", b"10", b"5", b"0", b"5"]  # a lost [0, 5)
    reply = a.ask(b"RANGE", b"0", b"10")
    assert reply[1:7] == [b"10", b"5", b"10", b"5", b"0", b"5"]  # 5 messages, lost [0, 5)
    assert b.ask(b"HEAD")[3:] == [b"0", b"0"]  # b had read them: nothing lost
    assert Reader(st, None).ask(b"HEAD") == [b"OK", b"10", b"5"]  # the old format
    assert a.ask(b"COMMIT", b"5")[3:] == [b"0", b"0"]  # told: it goes on from here
    assert st.retention_dropped == 5 and st.counters()["stream_retention_dropped"] == 5


def test_retention_seconds_drop_messages_older_than_the_limit():
    q, st, store = stream_core(10, Retention(seconds=1.0))
    # keys start with their arrival time: 1 000 + i µs (put)
    assert st.next_deadline() == 1_000 + 1_000_000
    st.enforce_retention(1_000 + 1_000_000 + 5)  # offsets 0..4 are more than a second old
    st.written(st.to_write(), None)
    assert sorted(q.messages) == [5, 6, 7, 8, 9]
    assert Reader(st, "x").ask(b"HEAD")[2] == b"5"


# --- real pzq processes ------------------------------------------------------------------


def produce_n(q, n: int, start: int = 0) -> None:
    with Producer(q.receive, window=1024, batch=128) as p:
        for i in range(start, start + n):
            p.send(b"m%05d" % i, msg_id=b"id%05d" % i)
        p.flush(30)


def read_some(endpoint: str, group: str, limit: int, commit: bool = True) -> list[bytes]:
    """What ``group`` reads from its committed offset, at most ``limit`` messages,
    committed after."""
    with StreamConsumer(endpoint, group=group) as s:
        head, committed = s.offsets()
        r = s.range(committed, head, max_messages=limit)
        if commit and r.messages:
            s.commit(r.messages[-1].offset + 1)
        return [m.body for m in r.messages]


def test_two_groups_at_their_own_speeds_across_a_sigkill(start_pzq):
    q = start_pzq(*STREAM)
    n = 3000
    seen: dict[str, list[bytes]] = {"fast": [], "slow": []}
    for group in seen:  # both made before anything is committed: each holds everything
        read_some(q.stream, group, 1, commit=False)
    producer = threading.Thread(target=produce_n, args=(q, n))
    producer.start()
    for _ in range(20):
        seen["fast"] += read_some(q.stream, "fast", 300)
        seen["slow"] += read_some(q.stream, "slow", 40)
    producer.join(60)
    q.kill()
    q = q.restart()
    with StreamConsumer(q.stream, group="fast") as f, StreamConsumer(q.stream,
                                                                     group="slow") as s:
        assert f.committed() != s.committed()  # each its own offset, kept across the kill
        for name, c in (("fast", f), ("slow", s)):
            head, committed = c.offsets()
            seen[name] += [m.body for m in c.read(committed, head)]
            c.commit(head)
    every = [b"m%05d" % i for i in range(n)]
    for name, got in seen.items():
        assert sorted(set(got)) == every, name  # each group: everything, nothing skipped
    assert q.counters()["messages"] == 0


def test_the_slowest_group_holds_the_segments_until_retention_drops_them(start_pzq, ctx):
    q = start_pzq(*STREAM, "--segment-size", "4096", "--retention-bytes", "40000")
    with StreamConsumer(q.stream, group="lazy") as lazy:
        lazy.offsets()  # made: it holds everything from here
        for i in range(0, 500, 25):  # 500 x (7 + 6 + 32) = 22 500 bytes: within the limit
            produce_n(q, 25, i)  # (in many writes: the log has many segments)
        read_some(q.stream, "busy", 1000)
        counters = q.counters()
        assert counters["messages"] == 500 and counters["segments"] > 2  # lazy holds them
        produce_n(q, 1000, 500)  # past the limit: the oldest go, read by lazy or not
        counters = wait_counter(q, "backlog_bytes", lambda n: n <= 40000)
        r = lazy.range(0, 1500)
        assert r.lost is not None and r.lost[0] == 0 and r.lost[1] == r.committed > 0
        assert r.messages[0].offset == r.committed  # nothing silently skipped: it was told
        assert counters["stream_retention_dropped"] > 0
        lazy.commit(r.next)
        assert lazy.lost is None and lazy.range(r.next, 1500).lost is None
    assert "pzq stream retention dropped unread messages" in q.log()


def test_bad_group_input_over_the_wire_disturbs_no_one(start_pzq, ctx):
    q = start_pzq(*STREAM)
    produce_n(q, 100)
    with StreamConsumer(q.stream, group="good") as good:
        head, committed = good.offsets()
        s = dealer(ctx, q.stream)
        for request in ([wire.GROUP, b"", wire.HEAD], [wire.GROUP, b"x" * 300, wire.HEAD],
                        [wire.GROUP, b"nosuch", wire.COMMIT, b"5"],
                        [wire.GROUP, b"good", wire.COMMIT, b"1000"],
                        [wire.GROUP, b"nosuch", wire.DELETE]):
            s.send_multipart([b"id", b"", *request])
            reply = recv(s)
            assert reply[2] == wire.STREAM_ERROR and reply[3], (request, reply)
        with pytest.raises(StreamError, match="past the head"):
            good.commit(head + 5)
        assert [m.offset for m in good.read(committed, head)] == list(range(100))
        assert good.commit(head) == head
        assert good.groups() == {"good": 100}  # the only group: its commit drops them
    assert q.counters()["messages"] == 0
