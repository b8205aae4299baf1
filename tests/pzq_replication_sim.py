"""Replicated pzq queues in a deterministic simulation: the real cores (QueueCore and its
ReplicationCore) of several brokers, with simulated logs, links, cluster sessions and clock,
and a nemesis that crashes, cuts off and pauses brokers, chosen from a seed.

Nothing here is a socket, a thread or a disk, so a run of a minute of simulated faults takes
a second, and a seed replays it exactly. What is modelled, and how it maps to the real thing:

- **Logs** (``SimLog``): appended records and ACKs wait until the log writes (each step, by
  chance, as a writer thread would); a crash loses what waits, never what was written. An
  ACK of a record not written yet drops it unwritten (the store's write avoidance). The file
  of keys taken over (RememberTaken) is written at once, as replica_files.py does.
- **Sessions** (the cluster's lives): each broker has its own life of each peer. A peer not
  heard for ``peer_timeout`` (or at once, plus 0.5 s, when its process died: the kernel
  closes its connections) is lost: its life ends (``peer_gone``). Two running brokers whose
  link works and who lack a life of each other start new lives on both sides and tell each
  other their queues (QUEUES). A message is taken while its receiver still has the life of
  its sender that it had when it was sent, whatever the sender did since (what came before
  the sender's BYE), and dropped otherwise, as the cluster drops a late message of an old
  life; a message on a cut link waits (TCP).
- **Pause** (SIGSTOP): the broker runs nothing, its clock jumps on resume; what its peers sent
  meanwhile is read before its timers judge them (the cluster credits a stall).
- **Clients**: a producer per broker (unique ids, the body is the id), a consumer per broker
  slower than it (a backlog builds up, as copies to take over) that ACKs each delivery after
  a while (lost with a crash of its broker, so redelivered); when draining, as fast as it can.

The checker's promises: every id ACKed "1" to its producer (REPLICATION_FAILED or not) is
delivered once every broker is back and the queues are drained; nothing is delivered that
was not sent.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pzq import wire
from zbroker.services.pzq.core import peering
from zbroker.services.pzq.core.actions import (
    AckMany,
    Append,
    BatchResult,
    Confirm,
    ForgetTaken,
    Log,
    OpenLog,
    RememberTaken,
    Reply,
    SendCluster,
)
from zbroker.services.pzq.core.queue import Limits, QueueCore
from zbroker.services.pzq.core.records import MessageRecord
from zbroker.services.pzq.core.replication import ReplicationCore, ReplicationSettings

QUEUE = b"jobs"
PRODUCER = b"P"
STEP = 0.05  # seconds of simulated time a step
CLOSED_NOTICED = 0.5  # a dead process's peers notice its closed connection this much later


def node_id_of(name: str) -> str:
    return hashlib.md5(name.encode()).hexdigest()


class SimLog:
    """One log: records and ACKs wait until ``write``; written ones survive a crash."""

    def __init__(self) -> None:
        self.records: dict[int, MessageRecord] = {}  # written, not ACKed
        self.pending: dict[int, MessageRecord] = {}
        self.pending_acks: set[int] = set()  # ACKs of written records, not written yet
        self.acked_unwritten: list[int] = []  # records ACKed before they were written
        self.next_seq = 0

    def append(self, a: Append) -> None:
        self.pending[a.seq] = MessageRecord(a.seq, a.key, a.msg_id, tuple(a.frames))
        self.next_seq = max(self.next_seq, a.seq + 1)

    def ack(self, seqs: list[int]) -> list[int]:
        """The seqs dropped before they were written."""
        dropped = [seq for seq in seqs if self.pending.pop(seq, None) is not None]
        self.acked_unwritten += dropped
        self.pending_acks.update(seq for seq in seqs if seq in self.records)
        return dropped

    def write(self, full: bool = False) -> BatchResult | None:
        """What the writer does now; with ``full`` (no space left), as the store does: the
        records fail (their producers get "0"), the ACKs wait for the next write."""
        if full:
            if not (self.pending or self.acked_unwritten):
                return None
            failed = tuple(sorted(self.pending))
            avoided = tuple(self.acked_unwritten)
            self.pending, self.acked_unwritten = {}, []
            return BatchResult((), 0, failed=failed, error="No space left on device",
                               acked=avoided)
        if not (self.pending or self.pending_acks or self.acked_unwritten):
            return None
        placed = tuple(sorted(self.pending))
        self.records.update(self.pending)
        for seq in self.pending_acks:
            self.records.pop(seq, None)
        acked = (*self.pending_acks, *self.acked_unwritten)
        self.pending, self.pending_acks, self.acked_unwritten = {}, set(), []
        return BatchResult((), 0, placed=placed, acked=acked)

    def crash(self) -> None:
        self.pending, self.pending_acks, self.acked_unwritten = {}, set(), []

    def recovered(self) -> list[MessageRecord]:
        return sorted(self.records.values(), key=lambda r: r.seq)


@dataclass
class Disk:
    logs: dict[str | None, SimLog] = field(default_factory=lambda: {None: SimLog()})
    taken: dict[str, list[bytes]] = field(default_factory=dict)
    full: bool = False  # no space left: every write fails


class SimBroker:
    """One broker's queue ``jobs`` in one process life, on its disk."""

    def __init__(self, sim: Sim, name: str, disk: Disk):
        self.sim, self.name, self.disk = sim, name, disk
        self.node_id = node_id_of(name)
        self.core = QueueCore(Limits(replicas=sim.replicas, replication_timeout=0.5,
                                     ack_timeout=sim.ack_timeout))
        self.rep = ReplicationCore(self.core, ReplicationSettings(
            name=QUEUE.decode(), node_id=self.node_id, replicas=sim.replicas, cluster=True,
            node_timeout=10.0, rejoin_grace=2 * sim.peer_timeout,
            lease=sim.lease), taken={k: list(v) for k, v in disk.taken.items()})
        own = disk.logs[None]
        self.core.recover(own.recovered(), own.next_seq, hold=True)
        for log, sim_log in disk.logs.items():
            if log is not None:
                self.rep.restore(log, sim_log.recovered(), sim_log.next_seq, sim.now)
        self.rep.started(sim.now)
        self.core.consumers_changed(1)
        self.unacked: list[tuple[float, bytes]] = []  # the consumer's: (when to ACK, key)
        self.credit = 0.0  # what the consumer can take now (it takes consume_rate a second)
        self.events: list[str] = []  # log events, in order

    def carry_out(self) -> bool:
        out = self.rep.take_output()
        logs = self.disk.logs
        for a in out:
            t = type(a)
            if t is Append:
                logs[a.log].append(a)
            elif t is AckMany:
                dropped = logs[a.log].ack(list(a.seqs))
                core = self.rep.log_core(a.log)
                if dropped and core is not None:
                    core.unwritten(dropped)
            elif t is OpenLog:
                logs.setdefault(a.log, SimLog())
            elif t is Reply:
                if a.peer == PRODUCER:
                    self.sim.producer_answer(self.name, a.frames)
            elif t is SendCluster:
                self.sim.send(self.name, a.life, peering.encode(a.message))
            elif t is Log:
                self.events.append(a.event)
                self.sim.logged(self, a)
            elif t is RememberTaken:
                self.disk.taken.setdefault(a.node_id, []).extend(a.keys)
            elif t is ForgetTaken:
                self.disk.taken.pop(a.node_id, None)
            else:
                assert t is Confirm, a
        return bool(out)

    def write_some(self, rng: random.Random, chance: float) -> None:
        for log, sim_log in list(self.disk.logs.items()):
            if rng.random() < chance and (result := sim_log.write(self.disk.full)) is not None:
                core = self.rep.log_core(log)
                if core is not None:
                    core.batch_done(result)
                self.carry_out()

    def produce(self, msg_id: bytes) -> None:
        self.core.produce(PRODUCER, [msg_id, b"", msg_id], self.sim.now_us, self.sim.now)

    def consume(self, rng: random.Random, draining: bool) -> None:
        sim = self.sim
        self.credit = min(self.credit + sim.consume_rate * STEP, sim.consume_rate)
        while (draining or self.credit >= 1) and (
                d := self.core.next_delivery(sim.now, sim.now_us)) is not None:
            self.credit -= 1
            frames = d[1]
            sim.delivered(self.name, bytes(frames[0]), bytes(frames[-1]))
            self.unacked.append((sim.now + rng.uniform(0.0, 0.4), bytes(frames[0])))
        due = [key for at, key in self.unacked if at <= sim.now]
        self.unacked = [(at, key) for at, key in self.unacked if at > sim.now]
        for key in due:
            self.core.consumer_ack([key, wire.OK])

    def clock(self) -> None:
        self.rep.wakeup(self.sim.now, self.sim.now_us)


@dataclass
class Session:
    """A broker's life of a peer."""

    life: str
    heard: float


class Sim:
    def __init__(self, seed: int, names: tuple[str, ...] = ("a", "b", "c"), *,
                 replicas: int = 1, peer_timeout: float = 2.0, lease: float | None = None,
                 ack_timeout: float = 3.0, rate: float = 20.0, consume_rate: float = 15.0,
                 write_chance: float = 0.6):
        self.seed = seed
        self.rng = random.Random(seed)
        self.replicas, self.peer_timeout = replicas, peer_timeout
        self.lease = peer_timeout / 4 if lease is None else lease
        self.ack_timeout, self.rate, self.write_chance = ack_timeout, rate, write_chance
        self.consume_rate = consume_rate  # each consumer's, at most (a backlog builds up)
        self.now = 1000.0
        self.names = names
        self.disks = {n: Disk() for n in names}
        self.brokers: dict[str, SimBroker | None] = {n: None for n in names}
        self.paused: set[str] = set()
        self.cut: set[str] = set()
        self.sessions: dict[tuple[str, str], Session] = {}  # (who, of whom)
        self.wire: list[tuple[str, str, tuple[str, str], list[bytes]]] = []
        self._lives = 0
        self._ids = 0
        self.sent: set[bytes] = set()
        self.acked: dict[bytes, bytes] = {}  # id -> the answer's text ("" or the failure)
        self.refused: set[bytes] = set()
        self.deliveries: dict[bytes, list[tuple[str, bytes]]] = {}  # id -> (host, key)
        self.faults: list[str] = []  # what the nemesis did, with the time
        self.kill_after_takeover = False
        self.disk_faults = False  # the nemesis also fills disks (for 2-8 s)
        self._doomed: set[str] = set()
        self._restarts: list[tuple[float, str, str]] = []  # (when, what, whom)
        for n in names:
            self.brokers[n] = SimBroker(self, n, self.disks[n])

    @property
    def now_us(self) -> int:
        return int(self.now * 1e6)

    # --- what the brokers do -------------------------------------------------------------------

    def running(self, name: str) -> SimBroker | None:
        b = self.brokers[name]
        return None if b is None or name in self.paused else b

    def linked(self, x: str, y: str) -> bool:
        return x not in self.cut and y not in self.cut

    def send(self, src: str, life: str, frames: list[Any]) -> None:
        dst = next((y for (x, y), s in self.sessions.items() if x == src and s.life == life),
                   None)
        if dst is not None:
            self.wire.append((src, dst, self._tag(src, dst), [bytes(f) for f in frames]))

    def _tag(self, x: str, y: str) -> tuple[str, str]:
        sx, sy = self.sessions.get((x, y)), self.sessions.get((y, x))
        return (sx.life if sx else "", sy.life if sy else "")

    def producer_answer(self, name: str, frames: list[bytes]) -> None:
        msg_id = bytes(frames[0])
        if frames[1] == wire.OK:
            self.acked[msg_id] = bytes(frames[3]) if len(frames) > 3 else b""
        else:
            self.refused.add(msg_id)

    def delivered(self, host: str, key: bytes, body: bytes) -> None:
        self.deliveries.setdefault(body, []).append((host, key))

    def logged(self, broker: SimBroker, line: Log) -> None:
        if (self.kill_after_takeover and line.event.startswith("pzq replica origin lost")
                and line.fields.get("messages")):
            self._doomed.add(broker.name)  # killed before its logs write again

    # --- the cluster ---------------------------------------------------------------------------

    def _end(self, x: str, y: str) -> None:
        """``x``'s life of ``y`` ends (and with it, what is under way between them)."""
        s = self.sessions.pop((x, y), None)
        if s is None:
            return
        b = self.brokers[x]
        if b is not None:
            b.rep.peer_gone(s.life, self.now, self.now_us)

    def _cluster(self) -> None:
        names = self.names
        for x in names:
            if self.running(x) is None:
                continue
            for y in names:
                if y == x:
                    continue
                s = self.sessions.get((x, y))
                if s is not None and self.running(y) is not None and self.linked(x, y):
                    s.heard = self.now  # its traffic, or its pings
                if s is not None and self.now - s.heard >= self.peer_timeout:
                    self._end(x, y)
        for x in names:
            for y in names:
                if (x < y and self.running(x) is not None and self.running(y) is not None
                        and self.linked(x, y) and ((x, y) not in self.sessions
                                                   or (y, x) not in self.sessions)):
                    self._meet(x, y)

    def _meet(self, x: str, y: str) -> None:
        self._end(x, y)
        self._end(y, x)
        for a, b in ((x, y), (y, x)):
            self._lives += 1
            self.sessions[(a, b)] = Session(f"{b}#{self._lives}", self.now)
        for a, b in ((x, y), (y, x)):
            self.wire.append((a, b, self._tag(a, b), peering.encode(
                peering.Queues({QUEUE.decode(): node_id_of(a)}))))

    def _deliver(self) -> None:
        waiting = []
        for src, dst, tag, frames in self.wire:
            if self._tag(src, dst)[1] != tag[1] or not tag[1]:
                continue  # the receiver's life of the sender ended (or had not started)
            b = self.running(dst)
            if b is None or not self.linked(src, dst):
                waiting.append((src, dst, tag, frames))
                continue
            life = self.sessions[(dst, src)].life
            if frames[0] == peering.QUEUES:
                msg = peering.decode(frames)
                assert isinstance(msg, peering.Queues)
                for node_id in msg.hosted.values():
                    b.rep.peer_hosts(life, node_id, self.now)
            else:
                assert b.rep.cluster_message(life, frames, self.now, self.now_us), frames
        self.wire = waiting

    # --- the nemesis ---------------------------------------------------------------------------

    def crash(self, name: str, restart_after: float) -> None:
        b = self.brokers[name]
        if b is None:
            return
        self.faults.append(f"{self.now - 1000:7.2f} kill {name}, restart in {restart_after:.1f} s")
        for sim_log in self.disks[name].logs.values():
            sim_log.crash()
        self.brokers[name] = None
        self.paused.discard(name)
        for (x, y), s in list(self.sessions.items()):
            if x == name:
                del self.sessions[(x, y)]
            elif y == name and self.linked(x, y):
                s.heard = min(s.heard, self.now - self.peer_timeout + CLOSED_NOTICED)
        self.wire = [w for w in self.wire if name not in (w[0], w[1])]
        self._restarts.append((self.now + restart_after, "start", name))

    def restart_at(self, name: str, at: float) -> None:
        """A broker killed is started again at ``at`` (instead of when its kill said)."""
        self._restarts = [(at if (what, who) == ("start", name) else when, what, who)
                          for when, what, who in self._restarts]

    def pause(self, name: str, seconds: float) -> None:
        if self.brokers[name] is None or name in self.paused:
            return
        self.faults.append(f"{self.now - 1000:7.2f} pause {name} for {seconds:.1f} s")
        self.paused.add(name)
        self._restarts.append((self.now + seconds, "resume", name))

    def fill_disk(self, name: str, seconds: float) -> None:
        """``name``'s disk is full for ``seconds``: its writes fail."""
        if self.disks[name].full:
            return
        self.faults.append(f"{self.now - 1000:7.2f} fill {name}'s disk for {seconds:.1f} s")
        self.disks[name].full = True
        self._restarts.append((self.now + seconds, "free", name))

    def cut_off(self, name: str, seconds: float) -> None:
        if name in self.cut:
            return
        self.faults.append(f"{self.now - 1000:7.2f} cut {name} off for {seconds:.1f} s")
        self.cut.add(name)
        self._restarts.append((self.now + seconds, "link", name))

    def _heal_due(self, everything: bool = False) -> None:
        due = [r for r in self._restarts if everything or r[0] <= self.now]
        self._restarts = [r for r in self._restarts if r not in due]
        for _, what, name in due:
            if what == "start" and self.brokers[name] is None:
                self.brokers[name] = SimBroker(self, name, self.disks[name])
            elif what == "resume":
                self.paused.discard(name)
                for (x, y), s in self.sessions.items():
                    if x == name and self.running(y) is not None and self.linked(x, y):
                        s.heard = self.now  # read before its timers run
            elif what == "link":
                self.cut.discard(name)
            elif what == "free":
                self.disks[name].full = False

    def random_fault(self) -> None:
        rng = self.rng
        name = rng.choice(self.names)
        kind = rng.choice(("kill", "cut", "pause", *(("full",) if self.disk_faults else ())))
        if kind == "full":
            self.fill_disk(name, rng.uniform(2, 8))
        elif kind == "kill":
            self.crash(name, rng.uniform(1, 5))
        elif kind == "cut":
            self.cut_off(name, rng.uniform(2, 10))
        else:
            self.pause(name, rng.uniform(1, 6))

    # --- running -------------------------------------------------------------------------------

    def step(self, produce: bool = True) -> None:
        rng = self.rng
        self.now += STEP
        self._heal_due()
        for name in self.names:
            b = self.running(name)
            if b is None:
                continue
            b.clock()
            if produce:
                for _ in range(_poisson(rng, self.rate * STEP)):
                    self._ids += 1
                    msg_id = b"%s-%d" % (name.encode(), self._ids)
                    self.sent.add(msg_id)
                    b.produce(msg_id)
            b.consume(rng, draining=not produce)
            b.carry_out()
            b.write_some(rng, self.write_chance)
            b.carry_out()
        for name in sorted(self._doomed):
            self.faults.append(f"{self.now - 1000:7.2f} {name} took copies over: killed")
            self.crash(name, rng.uniform(0.5, 2))
        self._doomed.clear()
        self._deliver()  # (a broker resumed reads what came before it judges its peers)
        self._cluster()
        self._deliver()
        for name in self.names:
            b = self.running(name)
            if b is not None:
                b.carry_out()

    def run(self, seconds: float, faults: bool = True, every: tuple[float, float] = (3, 8)
            ) -> None:
        """``seconds`` of traffic, with a random fault every ``every`` seconds."""
        end = self.now + seconds
        next_fault = self.now + self.rng.uniform(*every)
        while self.now < end:
            if faults and self.now >= next_fault:
                self.random_fault()
                if self.rng.random() < 0.2:
                    self.random_fault()  # two at once
                next_fault = self.now + self.rng.uniform(*every)
            self.step()

    def heal_and_drain(self, quiet: float = 10.0, limit: float = 120.0) -> float:
        """Every broker back, every link up; run until nothing new is delivered for
        ``quiet`` seconds and every queue is empty. Returns how long that took."""
        start = self.now
        self._heal_due(everything=True)
        last = (self.now, -1)
        while self.now - start < limit:
            self.step(produce=False)
            count = sum(len(v) for v in self.deliveries.values())
            if count != last[1]:
                last = (self.now, count)
            empty = all(b is not None and not b.core.messages and not b.unacked
                        for b in self.brokers.values())
            if empty and self.now - last[0] >= quiet:
                return self.now - start
        raise AssertionError(f"seed {self.seed}: the queues never drained: " + "; ".join(
            f"{n}: {len(b.core.messages) if b else 'down'}" for n, b in self.brokers.items()))

    # --- the checker ---------------------------------------------------------------------------

    def check(self) -> Verdict:
        delivered = set(self.deliveries)
        lost = sorted(set(self.acked) - delivered)
        unexpected = sorted(delivered - self.sent)
        why: Counter[str] = Counter()
        for deliveries in self.deliveries.values():
            if len(deliveries) > 1:
                hosts = {h for h, _ in deliveries}
                keys = {k for _, k in deliveries}
                why["two hosts" if len(hosts) > 1 else "two keys" if len(keys) > 1
                    else "redelivery"] += 1
        return Verdict(self.seed, len(self.sent), len(self.acked), lost, unexpected, why,
                       list(self.faults))


@dataclass
class Verdict:
    seed: int
    sent: int
    acked: int
    lost: list[bytes]
    unexpected: list[bytes]
    duplicates: Counter[str]
    faults: list[str]

    @property
    def duplicated(self) -> int:
        return sum(self.duplicates.values())

    def __str__(self) -> str:
        dup = self.duplicated
        return (f"seed {self.seed}: sent {self.sent}, acked {self.acked}, lost {len(self.lost)}"
                f" {self.lost[:5]}, unexpected {len(self.unexpected)}, duplicated {dup} "
                f"({100 * dup / max(1, self.acked):.2f} %: {dict(self.duplicates)})\n"
                + "\n".join(self.faults))


def _poisson(rng: random.Random, mean: float) -> int:
    n, p, limit = 0, 1.0, pow(2.718281828459045, -mean)
    while True:
        p *= rng.random()
        if p < limit:
            return n
        n += 1
