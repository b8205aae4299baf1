"""A stream queue's core (stream.py on queue.py) against a model, under any sequence of
messages (some of several body frames), writes that succeed or fail, and readers of two
groups asking HEAD, RANGE (plain and packed: BATCH) and COMMIT: a RANGE answers the durable
messages of its range from its group's committed offset on, in order and capped, a packed
answer the same ones up to the first of several frames (which comes alone), the committed
offsets only go forward, and a message is kept until every group has committed past it.
No sockets, no disk, no clock."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from pzq_helpers import FakeStore

from pzq import wire
from zbroker.services.pzq.core.queue import QueueCore
from zbroker.services.pzq.core.stream import Offsets, StreamCore

GROUPS = (None, b"g")  # None: the default group (no GROUP frame)


class StreamModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.store = FakeStore()
        self.q = self.store.attach(QueueCore(stream=True))
        self.st = StreamCore(self.q, Offsets({}))
        self.next_seq = 0
        self.pending: list[int] = []  # appended, not written yet
        self.body: dict[int, tuple[bytes, ...]] = {}  # durable (or pending) seq -> frames
        self.durable: set[int] = set()
        self.head = 0
        self.committed: dict[bytes | None, int] = {}

    # --- producers and the log -------------------------------------------------------------

    @rule(n=st.integers(1, 4), multi=st.booleans())
    def put(self, n, multi):
        for _ in range(n):
            seq = self.next_seq
            self.next_seq += 1
            frames = (b"a%d" % seq, b"b") if multi and seq % 3 == 0 else (b"m%d" % seq,)
            self.q.produce(b"P", [b"id%d" % seq, b"", *frames], 1_000 + seq)
            self.pending.append(seq)
            self.body[seq] = frames
        self.store.pump()

    @rule(ok=st.booleans())
    def write(self, ok):
        seqs, self.pending = tuple(self.pending), []
        if ok:
            self.q.batch_done(self.store.done(placed=seqs))
            self.durable.update(seqs)
            if seqs:
                self.head = max(self.head, max(seqs) + 1)
        else:
            self.q.batch_done(self.store.done(failed=seqs, error="store failed: disk full"))
            for seq in seqs:
                del self.body[seq]
        self.store.pump()

    # --- readers ----------------------------------------------------------------------------

    @rule(group=st.sampled_from(GROUPS))
    def head_request(self, group):
        values, _ = self._ask(group, b"HEAD")
        assert values[:2] == [self.head, self.committed[group]]

    @rule(group=st.sampled_from(GROUPS), start=st.integers(0, 12), span=st.integers(1, 12),
          most=st.integers(1, 5), batch=st.booleans())
    def range_request(self, group, start, span, most, batch):
        end = start + span
        request = [b"RANGE", b"%d" % start, b"%d" % end, b"%d" % (1 << 20), b"%d" % most]
        values, got = self._ask(group, *request, *([b"BATCH"] if batch else []))
        committed = self.committed[group]
        assert values[:2] == [self.head, committed]
        want = sorted(s for s in self.durable if max(start, committed) <= s < min(end,
                                                                                  self.head))
        want = want[:most]
        if batch and want and len(self.body[want[0]]) == 1:  # packed up to a multi-frame one
            cut = next((i for i, s in enumerate(want) if len(self.body[s]) != 1), len(want))
            want = want[:cut]
        elif batch and want:
            want = want[:1]  # one of several frames: alone
        assert [e.offset for e in got] == want
        assert [e.frames for e in got] == [self.body[s] for s in want]
        assert values[3] == len(want)
        # the next offset to ask from: past what came, and nothing skipped before it
        nxt = values[2]
        assert not [s for s in self.durable if max(start, committed) <= s < nxt
                    and s not in want]

    @rule(group=st.sampled_from(GROUPS), data=st.data())
    def commit(self, group, data):
        if group not in self.committed:
            return  # a named group is made by its first HEAD or RANGE
        end = data.draw(st.integers(0, self.head))
        values, _ = self._ask(group, b"COMMIT", b"%d" % end)
        self.committed[group] = max(self.committed[group], end)
        assert values[:2] == [self.head, self.committed[group]]

    # --- what must hold ---------------------------------------------------------------------

    @invariant()
    def a_message_is_kept_until_every_group_committed_past_it(self):
        if not self.committed:
            return
        floor = min(self.committed.values())
        kept = set(self.q.messages)
        assert all(s >= floor for s in kept)
        assert {s for s in self.durable if s >= floor} <= kept

    # --- internals --------------------------------------------------------------------------

    def _ask(self, group: bytes | None, *request: bytes):
        """A request of ``group``, answered (its offsets file written first if it waits for
        it): the reply's numbers and messages."""
        if group not in self.committed:  # made by this request, at the oldest offset kept
            kept = set(self.q.messages)
            self.committed[group] = (min(self.committed.values()) if self.committed
                                     else min(kept) if kept else self.head)
        frames = [b"r", b"", *([b"GROUP", group] if group else []), *request]
        reply = self.st.request(frames)
        if reply is None:
            replies = self.st.written(self.st.to_write(), None)
            assert len(replies) == 1
            reply = replies[0]
        self.store.pump()
        assert reply[2] == wire.STREAM_OK, reply
        return wire.decode_stream_reply(reply[2:], grouped=group is not None)


StreamModel.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                         deadline=None)
test_a_stream_queue_keeps_what_its_model_keeps = StreamModel.TestCase
