"""The pzq log on a real disk, under any sequence of messages (one by one, runs of them queued
at once, and producers' batches as one record), consumer ACKs (one, many, of parts of
batches, of whole batches before they are written), writes completing at the writer's pace,
and the log closed and opened again: what it finds on opening is every message appended and
not ACKed, with its key, id and body, whatever was written, avoided or ACKed when."""

from __future__ import annotations

import queue
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule
from test_pzq_store import Harness

from pzq import wire
from zbroker.services.pzq.core.actions import Append


class StoreModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="pzq-store-model-"))
        self.h = Harness(self.directory, sync="batch", sync_window=0.002)
        self.next_seq = 0
        self.live: dict[int, tuple[bytes, bytes, bytes]] = {}  # seq -> key, id, body

    @rule(size=st.integers(0, 300))
    def append(self, size):
        seq = self.next_seq
        self.next_seq += 1
        body = bytes([seq % 251]) * size
        self.h.store.append(seq, b"key-%d" % seq, b"id-%d" % seq, [body])
        self.live[seq] = (b"key-%d" % seq, b"id-%d" % seq, body)

    @rule(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=5))
    def append_many(self, sizes):
        """Messages one by one, a run of them queued at once (as the server does)."""
        appends = []
        for size in sizes:
            seq = self.next_seq
            self.next_seq += 1
            body = bytes([seq % 251]) * size
            appends.append(Append(seq, b"key-%d" % seq, b"id-%d" % seq, [body]))
            self.live[seq] = (b"key-%d" % seq, b"id-%d" % seq, body)
        self.h.store.append_many(appends)

    @rule(n=st.integers(2, 6))
    def append_batch(self, n):
        first = self.next_seq
        self.next_seq += n
        ids = [b"bid-%d" % s for s in range(first, first + n)]
        bodies = [b"b%d" % s for s in range(first, first + n)]
        base = b"7|x"
        self.h.store.append_batch(first, n, base, wire.pack(ids, bodies))
        for seq, msg_id, body in zip(range(first, first + n), ids, bodies, strict=True):
            self.live[seq] = (wire.message_key(base, seq), msg_id, body)

    @rule(data=st.data())
    def ack(self, data):
        if self.live:
            seq = data.draw(st.sampled_from(sorted(self.live)))
            self.h.store.ack(seq)
            del self.live[seq]

    @rule(data=st.data(), in_order=st.booleans())
    def ack_many(self, data, in_order):
        """A batch consumer's ACK: what it was sent, in order, or any of them."""
        if not self.live:
            return
        pool = sorted(self.live)
        if in_order:
            start = data.draw(st.integers(0, len(pool) - 1))
            seqs = pool[start:start + data.draw(st.integers(1, 8))]
        else:
            seqs = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=8))
        self.h.store.ack_many(seqs)
        for seq in seqs:
            self.live.pop(seq, None)

    @rule()
    def settle(self):
        """The loop takes the writer's reports (writes done meanwhile)."""
        try:
            while True:
                self.h.take(0.01)
        except queue.Empty:
            pass

    @rule()
    def reopen(self):
        """Closed (all written) and opened again: it finds what is live, and goes on."""
        self.h.close()
        self.h = Harness(self.directory, sync="batch", sync_window=0.002)
        self._check(self.h.recovered)
        self.next_seq = max(self.next_seq, self.h.recovered.next_seq)

    def teardown(self):
        try:
            self.h.close()
            h = Harness(self.directory)
            try:
                self._check(h.recovered)
            finally:
                h.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _check(self, recovered) -> None:
        found = {m.seq: (m.key, m.msg_id, b"".join(m.frames)) for m in recovered.messages}
        assert found == self.live


StoreModel.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                        deadline=None)
test_the_log_finds_what_was_appended_and_not_acked = StoreModel.TestCase
