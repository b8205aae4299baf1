"""The pzq queue core with a log that writes, fails and avoids writes as the real one does,
under any sequence of messages (one by one and in batches, ids sent again), deliveries to a
batch consumer and to one of the original wire, their ACKs (and NACKs), writes that succeed
or fail, and timeouts. Checked after each step: a producer is told "stored" only once every
message of what it sent is durable (written) or ACKed by a consumer; nothing it was told is
stored is lost; what it was told failed is not kept; and a consumer's ACK is confirmed only
once it can no longer be undone. No sockets, no disk, no clock."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pzq import wire
from zbroker.services.pzq.core.actions import (
    AckMany,
    Append,
    AppendBatch,
    BatchResult,
    Confirm,
    Reply,
)
from zbroker.services.pzq.core.queue import Limits, QueueCore

IDS = [b"m%d" % i for i in range(8)]


class QueueModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.core = QueueCore(Limits(ack_timeout=5.0, idempotence_window=6))
        self.core.credit_consumer(b"C", 4, 1 << 20)
        self.core.consumers_changed(1)  # and one of the original wire (one by one)
        self.now = 0.0
        self.records: list[list[int]] = []  # appended, not written yet: seqs of each
        self.record_acked: set[int] = set()  # seqs ACKed while their record waits
        self.acks: list[int] = []  # consumer ACKs waiting for their ACK record
        self.durable: set[int] = set()  # seqs written
        self.consumed: set[int] = set()  # seqs a consumer ACKed
        self.ack_durable: set[int] = set()  # consumer ACKs that survive a crash
        #: what a producer sent (a message id, a batch id) -> the seqs stored for it that
        #: it has not been answered about yet
        self.parts: dict[bytes, set[int]] = {}
        self.batch_ids: dict[bytes, list[bytes]] = {}  # batch id -> its message ids
        #: message ids the producer was told are stored: some copy of each is durable or
        #: consumed (an id sent again past the idempotence window is stored again: its
        #: answers do not say which copy)
        self.kept: set[bytes] = set()
        self.failed_seqs: set[int] = set()  # seqs of failed writes
        self.msg_id: dict[int, bytes] = {}  # seq -> the producer's id for it
        self.delivered: dict[bytes, int] = {}  # key -> seq, delivered and not ACKed yet
        self.confirm_waits: dict[bytes, set[int]] = {}  # ACK id -> its seqs
        self.batches = 0
        self.confirmed: list[set[int]] = []  # the seqs of each ACK confirmed (ACKED)

    # --- producers --------------------------------------------------------------------------

    @rule(i=st.integers(0, len(IDS) - 1))
    def produce(self, i):
        msg_id = IDS[i]
        self.parts.setdefault(msg_id, set())
        self.core.produce(b"P", [msg_id, b"", b"body " + msg_id], self._us())
        self._pump(sent=msg_id)

    @rule(picks=st.lists(st.integers(0, len(IDS) - 1), min_size=1, max_size=4, unique=True))
    def produce_batch(self, picks):
        ids = [IDS[i] for i in picks]
        batch_id = b"b%d" % len(self.parts)  # (its ids may have been sent before)
        self.parts.setdefault(batch_id, set())
        self.batch_ids[batch_id] = ids
        self.core.produce_batch(b"P", [batch_id, wire.BATCH_HEADER, b"", wire.pack(
            ids, [b"body " + i for i in ids])], self._us())
        self._pump(sent=batch_id)

    # --- the consumer -----------------------------------------------------------------------

    @rule()
    def deliver(self):
        while (nxt := self.core.next_delivery(self.now, self._us())) is not None:
            d, frames = nxt
            if frames[0] == wire.BATCH:
                keys, bodies = wire.unpack(frames[3])
                seqs = d.seqs
            else:  # [key][sent][ACK timeout][""][body]
                keys, bodies, seqs = [frames[0]], [b"".join(frames[4:])], [d.seq]
            for seq, key, body in zip(seqs, keys, bodies, strict=True):
                assert body == b"body " + self.msg_id[seq]
                self.delivered[key] = seq
        self._pump()

    @rule(data=st.data(), ok=st.booleans())
    def consumer_ack_one(self, data, ok):
        """An original consumer's ACK ("1") or NACK ("0") of one key."""
        if not self.delivered:
            return
        key = data.draw(st.sampled_from(sorted(self.delivered)))
        self.core.consumer_ack([key, wire.OK if ok else wire.FAILED])
        del self.delivered[key]  # (NACKed: delivered again)
        self._pump()

    @rule(data=st.data())
    def consumer_ack(self, data):
        if not self.delivered:
            return
        keys = data.draw(st.lists(st.sampled_from(sorted(self.delivered)), min_size=1,
                                  unique=True))
        ack_id = b"a%d" % len(self.confirm_waits)
        self.confirm_waits[ack_id] = {self.delivered[k] for k in keys
                                      if self.delivered[k] in self.core.messages}
        self.core.consumer_acks(keys, b"C", ack_id)
        for k in keys:
            del self.delivered[k]
        self._pump()

    @rule(step=st.floats(0, 6))
    def time_passes(self, step):
        self.now += step
        for seq in self.core.tick(self.now):  # timed out: delivered again later
            self.delivered = {k: s for k, s in self.delivered.items() if s != seq}
        self._pump()

    # --- the log ----------------------------------------------------------------------------

    @rule(ok=st.booleans())
    def write(self, ok):
        """The log writes what waits (or fails to): records with their ACKed seqs as ACK
        records after them, and the ACK records waiting."""
        records, self.records = self.records, []
        seqs = [s for r in records for s in r]
        acked = tuple(self.acks) + tuple(s for s in seqs if s in self.record_acked)
        self.batches += 1
        if ok:
            self.durable.update(seqs)
            self.ack_durable.update(acked)
            self.acks = []
            self.core.batch_done(BatchResult((self.batches,), 0, placed=tuple(seqs),
                                             acked=acked))
        else:  # nothing of it is stored; the ACK records are tried again
            self.acks = [s for s in acked if s not in seqs]
            self.failed_seqs.update(seqs)
            self.core.batch_done(BatchResult((self.batches,), 0, failed=tuple(seqs),
                                             error="store failed: disk full"))
        self.record_acked.difference_update(seqs)
        self._pump()

    # --- what must hold ---------------------------------------------------------------------

    @invariant()
    def stored_means_durable_or_consumed_and_nothing_stored_is_lost(self):
        for msg_id in self.kept:
            copies = {s for s, i in self.msg_id.items() if i == msg_id}
            assert copies & (self.durable | self.consumed), msg_id
            assert copies & (set(self.core.messages) | self.consumed), msg_id

    @invariant()
    def confirmed_acks_survive_a_crash(self):
        for seqs in self.confirmed:
            assert seqs <= self.ack_durable, seqs

    # --- internals --------------------------------------------------------------------------

    def _us(self) -> int:
        return int(self.now * 1e6) + 1

    def _pump(self, sent: bytes | None = None) -> None:
        """Carry out the core's actions as the log and the sockets would."""
        while out := self.core.take_output():
            # the answers last: they tell of the state the core left, whatever the order
            out.sort(key=lambda a: type(a) is Reply)
            for a in out:
                if type(a) is Append:
                    self._appended(sent, [a.seq], [a.msg_id])
                elif type(a) is AppendBatch:  # (the ids it packs: the new ones)
                    self._appended(sent, list(range(a.first_seq, a.first_seq + a.count)),
                                   wire.unpack(a.packed)[0])
                elif type(a) is AckMany:
                    self._acked(a.seqs)
                elif type(a) is Reply:
                    self._answered(a.frames)
                elif type(a) is Confirm:
                    if a.status == wire.ACKED:
                        self.confirmed.append(self.confirm_waits.get(a.key, set()))

    def _appended(self, sent: bytes | None, seqs: list[int], ids: list[bytes]) -> None:
        self.records.append(seqs)
        for seq, msg_id in zip(seqs, ids, strict=True):
            self.msg_id[seq] = msg_id
        if sent is not None:
            self.parts[sent].update(seqs)

    def _acked(self, seqs: list[int]) -> None:
        """Consumer ACKs reach the log: a waiting record all of whose messages are ACKed is
        never written (write avoidance); other ACKs wait for their ACK record."""
        self.consumed.update(seqs)
        waiting = {s for r in self.records for s in r}
        for seq in seqs:
            if seq in waiting:
                self.record_acked.add(seq)
            else:
                self.acks.append(seq)
        for r in list(self.records):
            if set(r) <= self.record_acked:
                self.records.remove(r)
                self.record_acked.difference_update(r)
                self.ack_durable.update(r)
                self.core.unwritten(r)

    def _answered(self, frames: list[bytes]) -> None:
        sent, ok = frames[0], frames[1] == wire.OK
        if ok:
            self.kept.update(self.batch_ids.get(sent, [sent]))
        else:
            for seq in self.parts.get(sent, set()) & self.failed_seqs:
                assert seq not in self.core.messages, (sent, seq)
        self.parts[sent] = set()


QueueModel.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                        deadline=None)
test_the_queue_core_keeps_its_promises_under_any_sequence = QueueModel.TestCase
