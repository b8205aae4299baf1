"""The pzq dispatcher against a model of what it must keep, under any sequence of adds,
deliveries (one by one and batches), sends given back, ACKs (one, many, late, duplicate),
NACKs, timeouts, consumers coming, going and pausing: every message is ready or in flight to
one consumer, its attempts count the sends that were not given back, a consumer never gets a
message beyond its credit or its byte window (one message at least) or while paused, a
message that goes alone is never in a batch, what times out is exactly what is still in
flight from a send whose deadline passed, and the counts of what is in flight add up. No
sockets, no clock."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from zbroker.services.pzq.core.dispatcher import READY, Deliveries, Dispatcher

TIMEOUT = 5.0
CONSUMERS = ("a", "b")


class DispatcherModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.d = Dispatcher(TIMEOUT, max_inflight_bytes=60)
        self.now = 0.0
        self.next_seq = 0
        self.where: dict[int, str] = {}  # seq -> READY or the consumer holding it
        self.sends: dict[int, int] = {}  # seq -> sends not given back
        self.size: dict[int, int] = {}
        self.deadline: dict[int, float] = {}  # seq in flight -> its send's deadline
        self.credit: dict[str, int] = {}
        self.max_bytes: dict[str, int] = {}
        self.paused: set[str] = set()
        self.alone: set[int] = set()  # messages that go alone, never in a batch
        self.last: Deliveries | None = None  # the latest send, while it may be given back

    # --- what the queue does ---------------------------------------------------------------

    @rule(size=st.integers(1, 20), n=st.integers(1, 4))
    def add(self, size, n):
        seqs = list(range(self.next_seq, self.next_seq + n))
        self.next_seq += n
        if n == 1:
            self.d.add(seqs[0], size)
        else:
            self.d.add_many(seqs, [size] * n)
        for seq in seqs:
            self.where[seq], self.sends[seq], self.size[seq] = READY, 0, size
        self.last = None

    @rule(cid=st.sampled_from(CONSUMERS), credit=st.integers(0, 4),
          max_bytes=st.sampled_from([1 << 62, 15, 40]))
    def set_consumer(self, cid, credit, max_bytes):
        self.d.set_consumer(cid, credit, max_bytes)
        self.credit[cid], self.max_bytes[cid] = credit, max_bytes
        self.last = None

    @rule(cid=st.sampled_from(CONSUMERS), paused=st.booleans())
    def pause(self, cid, paused):
        """Its connection is full (or drained again)."""
        self.d.pause(cid, paused)
        if paused and cid in self.credit:  # (an unknown consumer: nothing to pause)
            self.paused.add(cid)
        else:
            self.paused.discard(cid)
        self.last = None

    @rule(data=st.data())
    def goes_alone(self, data):
        self.alone.add(data.draw(st.integers(0, max(0, self.next_seq))))

    @rule(cid=st.sampled_from(CONSUMERS))
    def remove_consumer(self, cid):
        back = self.d.remove_consumer(cid)
        assert back == sorted(s for s, w in self.where.items() if w == cid)
        for seq in back:
            self.where[seq] = READY
            del self.deadline[seq]
        self.credit.pop(cid, None)
        self.max_bytes.pop(cid, None)
        self.paused.discard(cid)
        self.last = None

    @rule(step=st.floats(0, 3))
    def deliver(self, step):
        self.now += step
        loads = self._loads()
        got = self.d.next_delivery(self.now)
        if got is None:
            self.last = None
            return
        assert loads[got.consumer] < self.credit[got.consumer]  # it had credit
        assert got.consumer not in self.paused
        held = self._bytes(got.consumer)
        assert held == 0 or held + self.size[got.seq] <= self.max_bytes[got.consumer]
        self._sent(got.consumer, [got.seq], [got.attempt])
        self.last = Deliveries(got.consumer, [got.seq], [got.attempt])

    @rule(cid=st.sampled_from(CONSUMERS), limit=st.integers(1, 5))
    def deliver_more(self, cid, limit):
        if cid not in self.credit:
            return
        room = self.credit[cid] - self._loads()[cid]
        room_bytes = self.max_bytes[cid] - self._bytes(cid)
        more = self.d.more_to(cid, self.now, limit, self.alone)
        assert len(more.seqs) <= max(0, min(limit, room))
        assert sum(self.size[s] for s in more.seqs) <= max(0, room_bytes)
        assert self.alone.isdisjoint(more.seqs)
        self._sent(cid, more.seqs, more.attempts)
        self.last = more if more.seqs else None

    @precondition(lambda self: self.last is not None)
    @rule()
    def give_back(self):
        """The latest send could not be written to its consumer."""
        self.d.unsent(self.last)
        for seq in self.last.seqs:
            self.where[seq] = READY
            self.sends[seq] -= 1
            del self.deadline[seq]
        self.last = None

    @rule(data=st.data())
    def ack(self, data):
        seq = data.draw(st.integers(0, max(0, self.next_seq)))
        known = seq in self.where
        assert self.d.ack(seq) is known
        self._gone([seq])

    @rule(data=st.data())
    def ack_many(self, data):
        seqs = data.draw(st.lists(st.integers(0, max(0, self.next_seq)), max_size=6))
        self.d.ack_many(seqs)
        self._gone(seqs)

    @rule(data=st.data())
    def nack(self, data):
        seq = data.draw(st.integers(0, max(0, self.next_seq)))
        assert self.d.nack(seq) is (seq in self.where)
        if self.where.get(seq, READY) != READY:
            self.where[seq] = READY
            del self.deadline[seq]
        self.last = None

    @rule(step=st.floats(0, 4))
    def expire(self, step):
        self.now += step
        due = self.d.expire(self.now)
        assert sorted(due) == sorted(s for s, t in self.deadline.items() if t <= self.now)
        for seq in due:
            self.where[seq] = READY
            del self.deadline[seq]
        self.last = None

    # --- what must hold ---------------------------------------------------------------------

    @invariant()
    def each_message_is_in_one_place_with_its_attempts(self):
        assert len(self.d) == len(self.where)
        for seq, where in self.where.items():
            assert seq in self.d
            assert self.d.attempts(seq) == self.sends[seq]
            assert (self.d._where[seq] == READY) is (where == READY)
            if where != READY:
                assert seq in self.d.consumers[where].inflight

    @invariant()
    def what_is_in_flight_adds_up(self):
        flying = [s for s, w in self.where.items() if w != READY]
        assert self.d.inflight == len(flying)
        assert self.d.inflight_bytes == sum(self.size[s] for s in flying)
        assert self.d.inflight_bytes <= 60 or len(flying) == 1
        for cid, c in self.d.consumers.items():
            mine = [s for s in flying if self.where[s] == cid]
            assert c.inflight == set(mine)
            assert c.inflight_bytes == sum(self.size[s] for s in mine)

    @invariant()
    def the_next_deadline_is_the_earliest_send_still_in_flight(self):
        want = min(self.deadline.values()) if self.deadline else None
        assert self.d.next_deadline() == want

    # --- internals --------------------------------------------------------------------------

    def _bytes(self, cid: str) -> int:
        return sum(self.size[s] for s, w in self.where.items() if w == cid)

    def _loads(self) -> dict[str, int]:
        return {cid: sum(1 for w in self.where.values() if w == cid) for cid in CONSUMERS}

    def _sent(self, cid: str, seqs: list[int], attempts: list[int]) -> None:
        for seq, attempt in zip(seqs, attempts, strict=True):
            assert self.where[seq] == READY  # only a ready message is sent
            self.sends[seq] += 1
            assert attempt == self.sends[seq]
            self.where[seq] = cid
            self.deadline[seq] = self.now + TIMEOUT

    def _gone(self, seqs: list[int]) -> None:
        for seq in seqs:
            if seq in self.where:
                del self.where[seq], self.sends[seq], self.size[seq]
                self.deadline.pop(seq, None)
        self.last = None


DispatcherModel.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                             deadline=None)
test_the_dispatcher_keeps_what_its_model_keeps = DispatcherModel.TestCase
