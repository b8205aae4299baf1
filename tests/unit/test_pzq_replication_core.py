"""pzq replication without sockets, threads or disks: several queue cores (QueueCore and its
ReplicationCore) wired together in memory, with fake logs whose writes complete when the test
says. Every message between queues is encoded to frames and decoded again (peering.py), over
links that can lose and reorder them. The same scenarios run with real brokers in
test_pzq_cluster.py, test_pzq_cluster_channel.py and test_pzq_e2e.py."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest

from pzq import wire
from zbroker.services.pzq.core import peering
from zbroker.services.pzq.core.actions import (
    AckMany,
    Append,
    BatchResult,
    Confirm,
    ForgetTaken,
    Log,
    Move,
    OpenLog,
    RememberTaken,
    Reply,
    SendCluster,
    SendStatic,
)
from zbroker.services.pzq.core.queue import Limits, QueueCore
from zbroker.services.pzq.core.records import MessageRecord
from zbroker.services.pzq.core.replication import (
    NOT_CONFIGURED,
    ReplicationCore,
    ReplicationSettings,
)

FAILED = wire.REPLICATION_FAILED.encode()


def node_id_of(name: str) -> str:
    return hashlib.md5(name.encode()).hexdigest()


class FakeLog:
    """One log: appended records wait until ``write``; written ones survive a restart."""

    def __init__(self) -> None:
        self.pending: list[MessageRecord] = []
        self.records: dict[int, MessageRecord] = {}  # durable, not ACKed
        self.ever: set[bytes] = set()  # msg ids ever written
        self.next_seq = 0

    def append(self, a: Append) -> None:
        self.pending.append(MessageRecord(a.seq, a.key, a.msg_id, tuple(a.frames)))
        self.next_seq = max(self.next_seq, a.seq + 1)

    def write(self, fail: str | None = None) -> BatchResult:
        taken, self.pending = self.pending, []
        seqs = tuple(r.seq for r in taken)
        if fail is not None:
            return BatchResult((), 0, failed=seqs, error=fail)
        for r in taken:
            self.records[r.seq] = r
            self.ever.add(r.msg_id)
        return BatchResult((), 0, placed=seqs)


class Node:
    """A queue: its cores, its logs, what its producers and consumers got."""

    def __init__(self, net: Net, name: str, *, replicas: int = 0, static: tuple[str, ...] = (),
                 sources: tuple[str, ...] = (), cluster: bool = True, grace: float = 0.0,
                 max_origins: int = 16, logs: dict[str | None, FakeLog] | None = None,
                 taken: dict[str, list[bytes]] | None = None):
        self.net, self.name = net, name
        self.node_id = node_id_of(name)
        self.life = f"{name}-life{net.lives}"
        net.lives += 1
        self.static = static
        self.config = dict(replicas=replicas, static=static, sources=sources, cluster=cluster,
                           grace=grace, max_origins=max_origins)
        self.core = QueueCore(Limits(replicas=replicas, replication_timeout=1.0,
                                     ack_timeout=100.0))
        self.rep = ReplicationCore(self.core, ReplicationSettings(
            name="jobs", node_id=self.node_id, replicas=replicas,
            static_peers=len(static[:replicas]), cluster=cluster,
            sources=frozenset(node_id_of(s) for s in sources),
            node_timeout=4.0, max_origins=max_origins, rejoin_grace=grace),
            taken=dict(taken or {}))
        self.taken_file: dict[str, list[bytes]] = {k: list(v) for k, v in (taken or {}).items()}
        self.logs = logs if logs is not None else {None: FakeLog()}
        self.replies: dict[bytes, list[list[bytes]]] = {}  # producer -> its replies
        self.lines: list[Log] = []
        own = self.logs[None]
        hold = bool(replicas and not static and grace > 0)
        self.core.recover(sorted(own.records.values(), key=lambda r: r.seq), own.next_seq,
                          hold=hold)
        for log, fake in self.logs.items():
            if log is not None:
                assert self.rep.restore(log, sorted(fake.records.values(), key=lambda r: r.seq),
                                        fake.next_seq, net.now)
        self.rep.started(net.now)
        self.core.consumers_changed(1)

    def step(self) -> bool:
        """Carry out what the cores asked; True if there was anything."""
        out = self.rep.take_output()
        for a in out:
            t = type(a)
            if t is Append:
                self.logs[a.log].append(a)
            elif t is AckMany:
                log = self.logs[a.log]
                seqs = set(a.seqs)
                for seq in seqs:
                    log.records.pop(seq, None)
                log.pending = [r for r in log.pending if r.seq not in seqs]
            elif t is OpenLog:
                assert a.log not in self.logs
                self.logs[a.log] = FakeLog()
            elif t is Reply:
                if a.peer.startswith(b"node:"):  # a static peer's routing id: its answer
                    self.net.post(self.name, a.peer[5:].decode(), ("answer", a.frames))
                else:
                    self.replies.setdefault(a.peer, []).append(a.frames)
            elif t is SendCluster:
                dst = self.net.by_life.get(a.life)
                if dst is not None:
                    self.net.post(self.name, dst, ("cluster", peering.encode(a.message)))
            elif t is SendStatic:
                for dst in self.static[:self.config["replicas"]]:
                    self.net.post(self.name, dst, ("static", peering.encode_replica(a.message)))
            elif t is Log:
                self.lines.append(a)
            elif t is RememberTaken:
                self.taken_file.setdefault(a.node_id, []).extend(a.keys)
            elif t is ForgetTaken:
                self.taken_file.pop(a.node_id, None)
            elif t is Move:
                raise AssertionError("no compaction here")
            else:
                assert t is Confirm
        return bool(out)

    def write(self, log: str | None = None, fail: str | None = None) -> None:
        """The log ``log`` writes what waits."""
        result = self.logs[log].write(fail)
        if result.placed or result.failed:
            self.rep.log_core(log).batch_done(result)

    def produce(self, msg_id: bytes, body: bytes = b"body", producer: bytes = b"P") -> None:
        self.core.produce(producer, [msg_id, b"", body], self.net.now_us, self.net.now)

    def consume(self) -> list[list[bytes]]:
        out = []
        while (d := self.core.next_delivery(self.net.now, self.net.now_us)) is not None:
            out.append(d[1])
        return out

    def ack(self, key: bytes) -> None:
        self.core.consumer_ack([key, wire.OK])

    def held(self, origin: Node) -> int:
        o = self.rep.origins.get(origin.node_id)
        return len(o.core.messages) if o is not None else 0

    def restart(self) -> Node:
        """The same queue on the same logs, in a new life (what it had not written is lost)."""
        for log in self.logs.values():
            log.pending.clear()
        return self.net.add(Node(self.net, self.name, logs=self.logs, taken=self.taken_file,
                                 **self.config))


class Net:
    """Nodes and the links between them: messages wait in ``wire`` until delivered (in
    order, or shuffled, or lost, as the test says)."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.by_life: dict[str, str] = {}
        self.wire: list[tuple[str, str, tuple[str, list[Any]]]] = []
        self.now = 1000.0
        self.lives = 0

    @property
    def now_us(self) -> int:
        return int(self.now * 1e6)

    def add(self, node: Node) -> Node:
        self.nodes[node.name] = node
        self.by_life[node.life] = node.name
        return node

    def node(self, name: str, **kw: Any) -> Node:
        return self.add(Node(self, name, **kw))

    def post(self, src: str, dst: str, item: tuple[str, list[Any]]) -> None:
        self.wire.append((src, dst, item))

    def deliver(self, src: str, dst: str, item: tuple[str, list[Any]]) -> None:
        node, sender = self.nodes.get(dst), self.nodes.get(src)
        if node is None or sender is None:
            return
        kind, frames = item
        frames = [bytes(f) for f in frames]  # what crosses a link is bytes
        if kind == "cluster":
            if frames[0] == peering.QUEUES:
                msg = peering.decode(frames)
                for node_id in msg.hosted.values():
                    node.rep.peer_hosts(sender.life, node_id, self.now)
            else:
                assert node.rep.cluster_message(sender.life, frames, self.now, self.now_us)
        elif kind == "static":
            node.rep.receive(b"node:" + src.encode(), frames, self.now, self.now_us)
        else:
            node.rep.answer(frames)

    def run(self, writes: bool = True, rng: random.Random | None = None,
            loss: float = 0.0) -> None:
        """Until nothing moves: each node carries out its actions, its logs write (with
        ``writes``), the links deliver (shuffled and lossy with ``rng``)."""
        for _ in range(1000):
            moved = False
            for node in list(self.nodes.values()):
                moved |= node.step()
                if writes:
                    for log in list(node.logs):
                        if node.logs[log].pending:
                            node.write(log)
                            moved = True
                moved |= node.step()
            items, self.wire = self.wire, []
            if rng is not None:
                rng.shuffle(items)
            for src, dst, item in items:
                if rng is None or rng.random() >= loss:
                    self.deliver(src, dst, item)
            moved |= bool(items)
            if not moved:
                return
        raise AssertionError("the cores never settle")

    def join(self, *names: str) -> None:
        """The cluster's peers meet: each tells the others the queues it hosts (QUEUES)."""
        for a in names:
            for b in names:
                if a != b:
                    self.post(a, b, ("cluster", peering.encode(peering.Queues(
                        {"jobs": self.nodes[a].node_id}))))
        self.run()

    def lose(self, name: str) -> Node:
        """A broker dies: the cluster tells every other one (its heartbeats stop)."""
        node = self.nodes.pop(name)
        self.wire = [w for w in self.wire if name not in (w[0], w[1])]
        for other in self.nodes.values():
            other.rep.peer_gone(node.life, self.now, self.now_us)
        self.run()
        return node

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for node in self.nodes.values():
            node.rep.tick(self.now, self.now_us)
            node.core.tick(self.now)
        self.run()


def acks(node: Node, producer: bytes = b"P") -> list[list[bytes]]:
    return node.replies.pop(producer, [])


@pytest.fixture
def net() -> Net:
    return Net()


# --- the cluster -------------------------------------------------------------------------------


def test_the_ack_waits_for_the_local_write_and_the_copy(net):
    a, b = net.node("a", replicas=1), net.node("b")
    net.join("a", "b")
    assert a.rep.placement.holders == [b.life] and a.core.replica_targets == 1
    a.produce(b"m1")
    a.step()
    net.run(writes=False)  # the copy went out, nothing is written yet
    assert acks(a) == [] and b.held(a) == 1
    b.write(a.node_id)  # the holder's copy is durable: CONFIRM
    net.run(writes=False)
    assert acks(a) == []  # our own write is still missing
    a.write()
    net.run()
    assert acks(a) == [[b"m1", b"1", b""]]
    assert a.core.counters["replicated"] == 1


def test_no_confirm_within_the_timeout_is_replication_failed(net):
    a = net.node("a", replicas=1)
    net.node("b")
    net.join("a", "b")
    a.produce(b"m1")
    a.step()
    a.write()
    net.wire.clear()  # the copy is lost on the way
    net.run()
    assert acks(a) == []
    net.advance(1.1)
    assert acks(a) == [[b"m1", b"1", b"", FAILED]]
    assert a.core.counters["replication_failed"] == 1


def test_a_consumer_ack_deletes_the_copies(net):
    a, b = net.node("a", replicas=1), net.node("b")
    net.join("a", "b")
    for i in range(3):
        a.produce(b"m%d" % i)
    net.run()
    assert len(acks(a)) == 3 and b.held(a) == 3
    first = a.consume()[0]
    a.ack(first[0])
    net.run()
    assert b.held(a) == 2
    assert first[0] not in {m.msg_id for m in b.rep.origins[a.node_id].core.messages.values()}


def test_the_origin_lost_its_holder_delivers_and_the_restarted_origin_drops_them(net):
    a, b = net.node("a", replicas=1, grace=10.0), net.node("b")
    net.join("a", "b")
    for i in range(5):
        a.produce(b"m%d" % i)
    net.run()
    assert b.held(a) == 5
    net.lose("a")
    got = b.consume()
    assert len(got) == 5 and b.held(a) == 0  # taken over, dropped from the replica log
    assert b.rep.counters()["replicas_taken_over"] == 5 and len(b.taken_file[a.node_id]) == 5
    for frames in got[:3]:
        b.ack(frames[0])
    a = a.restart()  # its log still holds the 5: held for the grace, not delivered
    assert a.consume() == [] and len(a.core.held) == 5
    net.join("a", "b")  # b tells a what it delivered meanwhile (TAKEN)
    assert len(a.core.messages) == 0 and a.core.counters["taken_back"] == 5
    assert a.node_id not in b.taken_file
    net.advance(10.5)
    assert a.consume() == []


def test_keys_taken_over_and_written_after_the_origin_is_back_are_told_at_once(net):
    """Holder b takes a lost origin's copies over; its queue has not written them when the
    origin, restarted, announces its queue: b's TAKEN list is empty then (a key is told only
    once written) and ends. The keys written a moment later were told only at the origin's
    next return, and the origin delivered them after its grace while b did too (seen in the
    fault runs, seed 120: 369 delivered twice). They are told as soon as they are written."""
    a, b = net.node("a", replicas=1, grace=10.0), net.node("b")
    net.join("a", "b")
    for i in range(5):
        a.produce(b"m%d" % i)
    net.run()
    assert b.held(a) == 5
    del net.nodes["a"]  # a dies; b's queue adopts its copies, not written yet
    b.rep.peer_gone(a.life, net.now, net.now_us)
    net.run(writes=False)
    assert b.rep.taken_over == 5 and not b.taken_file
    a = a.restart()
    for src, dst in (("a", "b"), ("b", "a")):  # they meet; b's list ends, with nothing in it
        net.post(src, dst, ("cluster", peering.encode(peering.Queues(
            {"jobs": net.nodes[src].node_id}))))
    net.run(writes=False)
    assert b.rep.fence.hosts and not b.taken_file
    assert a.core.counters["taken_back"] == 0 and len(a.core.held) == 5
    b.write()  # b's queue writes what it took over
    net.run()
    assert len(b.taken_file[a.node_id]) == 5
    assert a.core.counters["taken_back"] == 5 and not a.core.messages
    net.advance(10.5)
    assert a.consume() == [] and len(b.consume()) == 5


def test_the_held_recovered_messages_are_released_after_the_grace(net):
    a = net.node("a", replicas=1, grace=10.0)
    net.node("b")
    net.join("a", "b")
    a.produce(b"m1")
    net.run()
    a = a.restart()
    net.join("a", "b")
    assert a.consume() == []
    net.advance(5)
    assert a.consume() == []
    net.advance(6)
    assert len(a.consume()) == 1
    assert any(line.event == "pzq recovered messages released to consumers" for line in a.lines)


def test_a_lost_holder_is_replaced_and_the_backlog_copied_again(net):
    a = net.node("a", replicas=1)
    b, c = net.node("b"), net.node("c")
    net.join("a", "b", "c")
    for i in range(300):
        a.produce(b"m%d" % i)
    net.run()
    holder = b if b.held(a) == 300 else c
    spare = c if holder is b else b
    assert spare.held(a) == 0
    net.lose(holder.name)
    assert spare.held(a) == 300 and a.rep.placement.holders == [spare.life]
    assert a.rep.counters()["recopy_backlog"] == 0
    a.produce(b"later")
    net.run()
    assert acks(a)[-1] == [b"later", b"1", b""] and spare.held(a) == 301


def test_the_recopy_goes_a_window_at_a_time(net, monkeypatch):
    from zbroker.services.pzq.core import placement
    monkeypatch.setattr(placement, "RECOPY_WINDOW", 10)
    monkeypatch.setattr(placement.Recopy.next_keys, "__defaults__", (10,))
    a = net.node("a", replicas=1)
    for i in range(35):
        a.produce(b"m%d" % i)
    net.run()  # no holder yet: REPLICATION_FAILED at once
    assert all(r[3:] == [FAILED] for r in acks(a))
    b = net.node("b")
    a.rep.peer_hosts(b.life, b.node_id, net.now)
    a.step()
    copies = [peering.decode(item[1]) for _, _, item in net.wire if item[1][0] == b"COPY"]
    assert sum(len(m.items) for m in copies) == 10  # one window; the rest as CONFIRMs come
    net.run()
    assert b.held(a) == 35 and a.rep.counters()["recopy_backlog"] == 0


def test_no_holder_left_fails_replication_at_once(net):
    a = net.node("a", replicas=1)
    net.node("b")
    net.join("a", "b")
    net.lose("b")
    assert a.rep.placement.holders == [] and a.core.replica_targets == 0
    a.produce(b"m1")
    net.run()
    assert acks(a) == [[b"m1", b"1", b"", FAILED]]


def test_a_returning_holder_drops_copies_acked_while_it_was_away(net):
    a, b = net.node("a", replicas=1), net.node("b")
    net.join("a", "b")
    for i in range(4):
        a.produce(b"m%d" % i)
    net.run()
    b_logs = b.logs
    net.nodes.pop("b")  # b goes away without a's noticing yet
    a.rep.peer_gone(b.life, net.now, net.now_us)
    for frames in a.consume():
        a.ack(frames[0])
    net.run()
    b = net.add(Node(net, "b", logs=b_logs))  # back, with its 4 stale copies
    assert b.held(a) == 4
    net.join("a", "b")  # a sends RELEASE first
    assert b.held(a) == 0 and a.rep.placement.holders == [b.life]


def test_hostile_cluster_frames_are_refused_and_change_nothing(net):
    a, b = net.node("a", replicas=1), net.node("b")
    net.join("a", "b")
    a.produce(b"m1")
    net.run()
    node = a.node_id.encode()
    for frames in ([], [b""], [b"COPY", b"jobs"], [b"COPY", b"jobs", b"xx", b"k"],
                   [b"COPY", b"jobs", node, b"k", b"2", b"b"], [b"DELETE", b"jobs"],
                   [b"CONFIRM", b"jobs", b"1"], [b"TAKEN", b"jobs"],
                   [b"TAKEN", b"jobs", b"f" * 32, b"k"], [b"RELEASE", b"jobs", b"x"],
                   [b"WHAT", b"jobs", b"x"], [b"QUEUES", b"{}"]):
        assert not b.rep.cluster_message(a.life, frames, net.now, net.now_us), frames
        assert not a.rep.cluster_message(b.life, frames, net.now, net.now_us), frames
    net.run()
    assert b.held(a) == 1 and len(a.core.messages) == 1


# --- static peers ------------------------------------------------------------------------------


def test_static_copies_are_confirmed_and_deleted(net):
    b = net.node("b", sources=("a",), cluster=False)
    a = net.node("a", replicas=1, static=("b",), cluster=False)
    a.produce(b"r1", b"copied")
    net.run()
    assert acks(a) == [[b"r1", b"1", b""]] and b.held(a) == 1 and not b.core.messages
    a.ack(a.consume()[0][0])
    net.run()
    assert b.held(a) == 0


def test_static_copies_from_a_node_not_accepted_are_refused(net):
    b = net.node("b", cluster=False)  # no replica_sources
    a = net.node("a", replicas=1, static=("b",), cluster=False)
    a.produce(b"r1")
    a.step()
    copy = net.wire[0][2][1]
    net.run()
    assert acks(a) == [] and b.rep.refused == 1 and not b.rep.origins
    # refused as a producer's message would be
    b.rep.receive(b"X", copy, net.now, net.now_us)
    b.step()
    assert b.replies[b"X"] == [[copy[0], b"0", b"", NOT_CONFIGURED.encode()]]
    net.advance(1.1)
    assert acks(a) == [[b"r1", b"1", b"", FAILED]]


def test_a_silent_static_origin_is_taken_over(net):
    b = net.node("b", sources=("a",), cluster=False)
    a = net.node("a", replicas=1, static=("b",), cluster=False)
    for i in range(3):
        a.produce(b"m%d" % i)
    net.run()
    assert b.held(a) == 3
    net.nodes.pop("a")  # silent from now on: no PING
    net.advance(2)
    assert b.consume() == []
    net.advance(3)
    assert len(b.consume()) == 3 and b.held(a) == 0


def test_static_frames_are_the_originals(net):
    node = "ab" * 16
    copy = peering.ReplicaCopy(node, b"k1", [b"a", b"b"])
    assert peering.encode_replica(copy) == [b"k1", b"REPLICA:" + node.encode(), b"", b"a", b"b"]
    assert peering.decode_replica(peering.encode_replica(copy)) == copy
    delete = peering.ReplicaDelete(node, b"k1")
    assert peering.encode_replica(delete) == [b"k1", b"REPLICA-ACK:" + node.encode(), b"", b"-"]
    assert peering.decode_replica(peering.encode_replica(delete)) == delete
    ping = peering.ReplicaPing(node)
    assert peering.encode_replica(ping) == [b"-", b"REPLICA-PING:" + node.encode(), b"", b"-"]
    assert peering.decode_replica(peering.encode_replica(ping)) == ping
    # an extra header before the delimiter is kept out of the body
    got = peering.decode_replica([b"k", b"REPLICA:" + node.encode(), b"h", b"", b"body"])
    assert got == peering.ReplicaCopy(node, b"k", [b"body"])
    for frames in ([b"k", b"REPLICA:" + node.encode(), b"x"],  # no delimiter
                   [b"k", b"REPLICA:nope", b"", b"x"], [b"k", b"REPLICA-X:" + node.encode(),
                                                         b"", b"x"]):
        assert peering.decode_replica(frames) is None


def test_cluster_messages_round_trip(net):
    node = "cd" * 16
    for msg in (peering.Queues({"jobs": node}),
                peering.Copy(b"jobs", node, [(b"k1", [b"a"]), (b"k2", [b"b", b"c"])]),
                peering.Confirm(b"jobs", True, [b"k1"]), peering.Confirm(b"jobs", False, [b"k"]),
                peering.Delete(b"jobs", node, [b"k1", b"k2"]),
                peering.Taken(b"jobs", node, [b"k1"]), peering.Release(b"jobs", node)):
        assert peering.decode(peering.encode(msg)) == msg
    assert peering.encode(peering.Copy(b"jobs", node, [(b"k1", [b"a", b"b"])])) == [
        b"COPY", b"jobs", node.encode(), b"k1", b"2", b"a", b"b"]
    assert peering.encode(peering.Confirm(b"q", False, [b"k"])) == [b"CONFIRM", b"q", b"0", b"k"]


# --- loss and reordering ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_lossy_reordering_links_never_break_the_promises(net, seed):
    """Whatever the links do: every producer gets one answer per message; a plain "1" only
    for a message a holder had written; nothing raises."""
    rng = random.Random(seed)
    a = net.node("a", replicas=2)
    b, c = net.node("b"), net.node("c")
    net.join("a", "b", "c")
    keys = {}
    for round_ in range(20):
        for i in range(rng.randint(1, 10)):
            msg_id = b"m%d-%d" % (round_, i)
            a.produce(msg_id)
            keys[msg_id] = a.core.messages[a.core.next_seq - 1].key
        net.run(rng=rng, loss=0.2)
        for frames in a.consume():
            if rng.random() < 0.5:
                a.ack(frames[0])
        net.run(rng=rng, loss=0.2)
        net.advance(0.3)
    net.advance(2)
    got = acks(a)
    assert sorted(r[0] for r in got) == sorted(keys)
    held_by = [n.logs[a.node_id].ever if a.node_id in n.logs else set() for n in (b, c)]
    for r in got:
        assert r[1:3] == [b"1", b""]
        if r[3:] != [FAILED]:  # both holders had written it
            assert all(keys[r[0]] in written for written in held_by), r
    assert a.core.counters["replicated"] + a.core.counters["replication_failed"] == len(keys)
    assert 0 < a.core.counters["replicated"] < len(keys)


# --- a message taken over, known again ---------------------------------------------------------


def adopted(core: QueueCore) -> list:
    from zbroker.services.pzq.core.actions import Adopted
    return [a for a in core.take_replication() if type(a) is Adopted]


def written(core: QueueCore) -> None:
    appended = [a.seq for a in core.take_output() if type(a) is Append]
    core.batch_done(BatchResult((), 0, placed=tuple(appended)))


def test_a_copy_taken_over_keeps_the_first_key_of_its_message():
    core = QueueCore(Limits(replicas=1))
    core.adopt(b"replica:k1", (b"body",), 1, ("origin", b"k1"), copy_key=b"k1")
    (m,) = core.messages.values()
    assert m.key.startswith(b"k1" + wire.ADOPTED) and wire.root_key(m.key) == b"k1"
    # taken over again elsewhere: still one level
    assert wire.adopted_key(m.key, b"new") == b"k1" + wire.ADOPTED + b"new"


def test_our_own_message_come_back_is_held_once_and_claimed_by_nobody():
    """Our message k, taken over by a peer (its key k~x) and copied on to us: taken over
    here, it is already here; we tell nobody to drop anything for it (the peer tells us to
    drop k, when it is back, and keeps k~x: one of the two is delivered)."""
    core = QueueCore(Limits(replicas=1))
    core.produce(b"P", [b"id1", b"", b"body"], 1)
    written(core)
    (own,) = core.messages.values()
    core.take_replication()
    core.adopt(b"replica:" + own.key + b"~x", (b"body",), 2, ("peer", own.key + b"~x"),
               copy_key=own.key + b"~x")
    assert len(core.messages) == 1
    ((a),) = adopted(core)
    assert a.ok and not a.claim


def test_a_message_delivered_here_before_is_claimed_when_it_comes_back():
    core = QueueCore(Limits(replicas=1))
    core.produce(b"P", [b"id1", b"", b"body"], 1)
    written(core)
    (own,) = core.messages.values()
    core.consumer_ack([own.key, wire.OK])
    core.take_replication()
    core.adopt(b"replica:" + own.key + b"~x", (b"body",), 2, ("peer", own.key + b"~x"),
               copy_key=own.key + b"~x")
    assert not core.messages
    ((a),) = adopted(core)
    assert a.ok and a.claim  # delivered: its holder may drop it


def test_the_same_message_taken_over_from_two_holders_is_held_once():
    core = QueueCore(Limits(replicas=1))
    core.adopt(b"replica:k1~a", (b"body",), 1, ("a", b"k1~a"), copy_key=b"k1~a")
    core.adopt(b"replica:k1~b", (b"body",), 1, ("b", b"k1~b"), copy_key=b"k1~b")
    assert len(core.messages) == 1
    written(core)
    got = {a.token[0]: a.claim for a in adopted(core)}
    assert got == {"a": True, "b": False}  # only the copy held is claimed


def test_a_copy_taken_over_as_its_roots_are_trimmed_is_still_known_from_another_holder():
    """The first keys of copies taken over are let go once their messages are gone (a trim,
    when they outnumber the messages held); the trim that the copy being taken over makes
    keeps that copy's own: it is not in the queue yet, and taken over again from another
    holder it is held once."""
    core = QueueCore(Limits(replicas=1))
    for i in range(70):  # taken over, then delivered: their roots outlive them
        core.adopt(b"replica:old%d~a" % i, (b"body",), 1, ("a", b"old%d~a" % i),
                   copy_key=b"old%d~a" % i)
    written(core)
    for m in list(core.messages.values()):
        core.consumer_ack([m.key, wire.OK])
    assert not core.messages and len(core.adoption.roots) >= 64
    core.adopt(b"replica:k1~a", (b"body",), 2, ("a", b"k1~a"), copy_key=b"k1~a")
    assert len(core.adoption.roots) < 64  # trimmed
    core.adopt(b"replica:k1~b", (b"body",), 2, ("b", b"k1~b"), copy_key=b"k1~b")
    assert len(core.messages) == 1


def fenced_origin(answers: dict[str, float]) -> tuple[ReplicationCore, dict[str, str]]:
    """An origin of three hosts, in a cluster with a lease of 0.5 s, whose copies go to b:
    each peer's life (by name) answered the LEASE asked at the time in ``answers``."""
    rep = ReplicationCore(QueueCore(Limits(replicas=1)), ReplicationSettings(
        name="jobs", node_id=node_id_of("a"), replicas=1, cluster=True, rejoin_grace=4.0,
        lease=0.5))
    rep.started(0.0)
    lives = {"b": "b#1", "c": "c#1"}
    for name, life in lives.items():
        rep.peer_hosts(life, node_id_of(name), 0.0)
        rep.cluster_message(life, peering.encode(peering.Taken(b"jobs", node_id_of("a"), [])),
                            0.0, 0)  # (its list: nothing taken)
    for name, asked in answers.items():
        rep.cluster_message(lives[name], peering.encode(peering.Lease(
            b"jobs", node_id_of(name), repr(asked).encode(), answer=True)), asked, 0)
    assert rep.placement.holders == ["b#1"] and rep.queue.deliver_until > 0.0
    rep.take_output()
    return rep, lives


@pytest.mark.parametrize("answers", [{"b": 1.0, "c": 1.0}, {"b": 1.4, "c": 1.0}],
                         ids=["lease-run-out-unnoticed", "quorum-lost-with-the-holder"])
def test_a_holder_lost_with_the_quorum_is_waited_for_like_one_lost_after(answers):
    """The origin's links close (its holder b and c are lost at once, the connections'
    grace ending as the lease does): b's life ends with the quorum, before a timer of the
    origin judged the lease, or its answer was the last to count. b may have taken the
    copies over (it died before it could tell c): the origin must wait for b's TAKEN list
    when b is back, as it does for a holder it had when its lease ran out first."""
    rep, lives = fenced_origin(answers)
    now = 1.6
    rep.peer_gone(lives["b"], now, int(now * 1e6))
    rep.peer_gone(lives["c"], now, int(now * 1e6))
    assert node_id_of("b") in rep.fence.waiting_takers
    assert rep.queue.deliver_until <= now


def test_a_holder_lost_while_the_quorum_holds_is_not_waited_for():
    rep, lives = fenced_origin({"b": 1.0, "c": 1.4})
    rep.peer_gone(lives["b"], 1.6, 1_600_000)  # c still answers: a new holder, no fence
    assert not rep.fence.waiting_takers and rep.queue.deliver_until > 1.6
    assert rep.placement.holders == ["c#1"]


@pytest.mark.parametrize("alive", [True, False], ids=["ended-by-the-origin", "origin-lost"])
def test_a_holder_takes_nothing_over_from_an_origin_that_ended_its_life_alive(alive):
    """Holder b, paused past peer_timeout, runs again: what its origin a sent meanwhile is read
    first, then a's HELLO that starts afresh (a had lost b: it took c as its holder, went on
    delivering, and sent its DELETEs there) ends b's life of a; a is cut off just after, so
    nothing more comes from it, while c answers b's LEASEs. b's copies are stale: taken over,
    c (a's holder now) and b both delivered a's backlog (seen in the fault runs, seed 26: 879
    delivered twice). The cluster says that life ended with a running (``alive``): the copies
    wait for a's RELEASE. Lost (silent, its connection closed), a's copies are taken over."""
    a, b, c = (node_id_of(n) for n in "abc")
    rep = ReplicationCore(QueueCore(Limits()), ReplicationSettings(
        name="jobs", node_id=b, cluster=True, rejoin_grace=4.0, lease=0.5))
    rep.started(0.0)
    rep.peer_hosts("a#1", a, 0.0)
    rep.peer_hosts("c#1", c, 0.0)
    copies = [(b"k%d" % i, [b"body"]) for i in range(5)]
    for msg in peering.copies(b"jobs", a, copies):
        assert rep.cluster_message("a#1", peering.encode(msg), 0.0, 0)
    assert len(rep.origins[a].core.messages) == 5

    def answered_by_c(now: float) -> None:
        rep.tick(now, int(now * 1e6))  # (our LEASE, asked at ``now``; c answers at once)
        rep.cluster_message("c#1", peering.encode(peering.Lease(
            b"jobs", c, repr(now).encode(), answer=True)), now, int(now * 1e6))

    now = 5.0  # resumed
    answered_by_c(now)
    assert rep.cluster_message("a#1", peering.encode(peering.Lease(b"jobs", a, b"4.9")),
                               now, int(now * 1e6))  # sent by a before it lost b, read now
    assert rep.fence.quorum_without(a, now)
    rep.peer_gone("a#1", now, int(now * 1e6), alive=alive)
    for i in range(1, 13):  # c answers every quarter lease, for 1.5 s; a says nothing
        answered_by_c(now + i * 0.125)
    if alive:
        assert rep.taken_over == 0 and len(rep.origins[a].core.messages) == 5
        assert any(line.event.startswith("pzq replica origin ended its life with us, its "
                                          "copies kept") for line in rep.take_output()
                   if type(line) is Log)
    else:
        assert rep.taken_over == 5
