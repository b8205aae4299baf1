"""The idempotence window of a queue (zbroker/services/pzq/core/id_window.py): what it remembers
is what an ordered dict trimmed one oldest id at a time would remember, ids added one by one or a
batch at a time, forgotten early, or remembered again; and it holds no more than twice the
ids it remembers (and a constant), however many were forgotten early."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from zbroker.services.pzq.core.id_window import IdWindow


class Reference:
    """The window as it was first written: an OrderedDict, trimmed one id at a time."""

    def __init__(self, max_ids: int, max_bytes: int):
        self.max_ids, self.max_bytes = max_ids, max_bytes
        self.ids: OrderedDict[bytes, int] = OrderedDict()
        self.bytes = 0

    def add(self, msg_id: bytes, seq: int) -> None:
        if msg_id in self.ids:
            self.bytes -= len(msg_id)
            del self.ids[msg_id]
        self.ids[msg_id] = seq
        self.bytes += len(msg_id)
        while self.ids and (len(self.ids) > self.max_ids or self.bytes > self.max_bytes):
            old, _ = self.ids.popitem(last=False)
            self.bytes -= len(old)

    def forget(self, msg_id: bytes) -> int | None:
        seq = self.ids.pop(msg_id, None)
        if seq is not None:
            self.bytes -= len(msg_id)
        return seq


NAMES = st.binary(min_size=1, max_size=6)
OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), NAMES),
    st.tuples(st.just("batch"), st.lists(NAMES, min_size=1, max_size=12, unique=True)),
    st.tuples(st.just("forget"), NAMES)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20), st.integers(1, 60), OPS)
def test_it_remembers_what_an_ordered_dict_trimmed_one_id_at_a_time_would(max_ids, max_bytes,
                                                                          ops):
    window, ref = IdWindow(max_ids, max_bytes), Reference(max_ids, max_bytes)
    seq = 0
    for op, arg in ops:
        if op == "add":
            window.add(arg, seq)
            ref.add(arg, seq)
            seq += 1
        elif op == "batch":
            if window.any_known(arg):  # as the queue does: only new ids go in a batch
                assert any(i in ref.ids for i in arg)
                continue
            window.add_many(list(arg), seq)
            for i in arg:
                ref.add(i, seq)
                seq += 1
        else:
            assert window.forget(arg) == ref.forget(arg)
        assert {i: window.get(i) for i in ref.ids} == dict(ref.ids)
        assert len(window) == len(ref.ids) and window.bytes == ref.bytes


def test_a_batch_is_remembered_and_its_oldest_ids_go_first():
    window = IdWindow(5, 1 << 20)
    window.add_many([b"a", b"b", b"c"], 10)
    window.add_many([b"d", b"e", b"f"], 13)  # one too many: "a" goes
    assert [window.get(i) for i in (b"a", b"b", b"f")] == [None, 11, 15]
    window.add(b"b", 16)  # again, newer: now the last to go
    window.add_many([b"g", b"h"], 17)  # two too many: "c" and "d" go, not "b"
    assert {i for i in b"abcdefgh" if bytes([i]) in window} == set(b"befgh")
    assert window.get(b"b") == 16 and window.bytes == 5


def test_ids_forgotten_early_do_not_pile_up():
    window = IdWindow(100_000, 1 << 30)
    for n in range(50_000):
        window.add_many([b"x%d" % n, b"y%d" % n], 2 * n)
        window.forget(b"x%d" % n)
        window.forget(b"y%d" % n)
    assert len(window) == 0 and window.bytes == 0
    assert window._held <= 1024 + 2  # the groups were compacted as they went stale
