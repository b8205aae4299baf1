"""Replicated pzq queues in a deterministic simulation: the real cores (QueueCore and its
ReplicationCore) of several brokers on their real cluster cores, with simulated logs, links
and clock, and a nemesis that crashes, cuts off and pauses brokers, chosen from a seed.

Nothing here is a socket, a thread or a disk, so a run of a minute of simulated faults takes
a second, and a seed replays it exactly. What is modelled, and how it maps to the real thing:

- **Logs** (``SimLog``): appended records and ACKs wait until the log writes (each step, by
  chance, as a writer thread would); a crash loses what waits, never what was written. An
  ACK of a record not written yet drops it unwritten (the store's write avoidance). The file
  of keys taken over (RememberTaken) is written at once, as replica_files.py does.
- **The cluster**: the real cluster cores (NodeCore) of the brokers carry it, one node each on
  the in-memory network of tests/cluster_cores.py, whose clock is the simulation's: HELLOs,
  PINGs, lives (a peer's life begins and ends for each broker on its own), BYEs, numbered
  messages held while a link is down. A peer is lost when silent for ``peer_timeout`` (the
  network's timeout), or sooner when its connections closed (its process killed, or a cut:
  the links go down) and nothing came for the core's grace after that. A message of a life
  that ended is not delivered, whatever the sender did since. A kill also loses what the
  broker sent that no peer has read yet (a step's worth at most).
- **The pzq service** (zbroker/services/pzq/service.py) on each node: to a peer's life that
  begins it tells its queue (QUEUES, with its node id); a life that ends is the queue's
  ``peer_gone`` (with the cluster's ``alive``: the peer ended it and runs on); a peer's
  message is the queue's (``peer_hosts`` for QUEUES). The queue's core is told at once;
  what it asks (a message to a life, a write) is carried out at the broker's next turn, each
  step, as the queue's server does it at the loop's next turn: a re-copy's message the
  cluster refuses makes that life unreachable (``peer_unreachable``).
- **Pause** (SIGSTOP): the broker runs nothing, its clock jumps on resume; what its peers sent
  meanwhile is read before its timers judge them (its cluster core credits a stall).
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

from cluster_cores import Network, Node

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
SERVICE = "pzq"  # the service's name on the cluster channel


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
        self.node: Node | None = None  # its cluster node, once started
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

    def carry_out(self) -> None:
        while out := self.rep.take_output():  # (carrying them out may make more)
            self._execute(out)

    def _execute(self, out: list[Any]) -> None:
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
            elif t is SendCluster:  # as server.py does
                assert self.node is not None
                if not self.node.send(a.life, SERVICE, peering.encode(a.message)) and a.recopy:
                    self.rep.peer_unreachable(a.life)
            elif t is Log:
                self.events.append(a.event)
                self.sim.logged(self, a)
            elif t is RememberTaken:
                self.disk.taken.setdefault(a.node_id, []).extend(a.keys)
            elif t is ForgetTaken:
                self.disk.taken.pop(a.node_id, None)
            else:
                assert t is Confirm, a

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


class PzqService:
    """What the broker's pzq service (zbroker/services/pzq/service.py) does with what the
    cluster tells it, for one broker's queue: the queue's core is told at once, its outputs
    are carried out at the broker's next turn (as the queue's server flushes them)."""

    def __init__(self, broker: SimBroker) -> None:
        self.broker = broker

    def joined(self, life: Any) -> None:
        b = self.broker
        assert b.node is not None
        b.node.send(life.id, SERVICE, peering.encode(peering.Queues({QUEUE.decode(): b.node_id})))

    def left(self, life: Any, why: str, alive: bool) -> None:
        b = self.broker
        b.rep.peer_gone(life.id, b.sim.now, b.sim.now_us, alive=alive)

    def message(self, life: Any, service: str, frames: list[Any]) -> None:
        assert service == SERVICE, service
        sim, rep = self.broker.sim, self.broker.rep
        frames = [bytes(f) for f in frames]
        if frames[0] == peering.QUEUES:
            msg = peering.decode(frames)
            assert isinstance(msg, peering.Queues), frames
            for name, node_id in msg.hosted.items():
                if name == QUEUE.decode():
                    rep.peer_hosts(life.id, node_id, sim.now)
        else:
            assert frames[1] == QUEUE and rep.cluster_message(life.id, frames, sim.now,
                                                              sim.now_us), frames


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
        #: the cluster, whose clock is the simulation's
        self.net = Network(timeout=peer_timeout)
        self.net.now = 1000.0
        self.names = names
        self.disks = {n: Disk() for n in names}
        self.brokers: dict[str, SimBroker | None] = {n: None for n in names}
        self.paused: set[str] = set()
        self.cut: set[str] = set()
        self._ids = 0
        self.sent: set[bytes] = set()
        self.acked: dict[bytes, bytes] = {}  # id -> the answer's text ("" or the failure)
        self.refused: set[bytes] = set()
        self.deliveries: dict[bytes, list[tuple[str, bytes]]] = {}  # id -> (host, key)
        self.delivery_count = 0
        self.faults: list[str] = []  # what the nemesis did, with the time
        self.kill_after_takeover = False
        self.disk_faults = False  # the nemesis also fills disks (for 2-8 s)
        self._doomed: set[str] = set()
        self._restarts: list[tuple[float, str, str]] = []  # (when, what, whom)
        for n in names:
            self._start(n)

    @property
    def now(self) -> float:
        return self.net.now

    @property
    def now_us(self) -> int:
        return int(self.now * 1e6)

    # --- what the brokers do -------------------------------------------------------------------

    def _start(self, name: str) -> None:
        """``name``'s process starts: its queue on its disk, its cluster node (a new id) with
        the others as its seeds."""
        b = self.brokers[name] = SimBroker(self, name, self.disks[name])
        b.node = self.net.start(name, seeds=[n for n in self.names if n != name])
        b.node.service = PzqService(b)

    def running(self, name: str) -> SimBroker | None:
        b = self.brokers[name]
        return None if b is None or name in self.paused else b

    def life_of(self, who: str, whom: str) -> str | None:
        """The life ``who``'s services have of ``whom`` now."""
        b = self.brokers[who]
        return None if b is None or b.node is None else b.node.lives().get(whom)

    def peer_of(self, who: str, life: str) -> str:
        """The broker whose life ``life`` is, at ``who``."""
        b = self.brokers[who]
        assert b is not None and b.node is not None
        return next(name for name, its in b.node.lives().items() if its == life)

    def producer_answer(self, name: str, frames: list[bytes]) -> None:
        msg_id = bytes(frames[0])
        if frames[1] == wire.OK:
            self.acked[msg_id] = bytes(frames[3]) if len(frames) > 3 else b""
        else:
            self.refused.add(msg_id)

    def delivered(self, host: str, key: bytes, body: bytes) -> None:
        self.deliveries.setdefault(body, []).append((host, key))
        self.delivery_count += 1

    def logged(self, broker: SimBroker, line: Log) -> None:
        if (self.kill_after_takeover and line.event.startswith("pzq replica origin lost")
                and line.fields.get("messages")):
            self._doomed.add(broker.name)  # killed before its logs write again

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
        self.net.crash(name)
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
        self.net.pause(name)
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
        self.net.partition([name], [n for n in self.names if n != name])
        self._restarts.append((self.now + seconds, "link", name))

    def _heal_due(self, everything: bool = False) -> None:
        due = [r for r in self._restarts if everything or r[0] <= self.now]
        self._restarts = [r for r in self._restarts if r not in due]
        for _, what, name in due:
            if what == "start" and self.brokers[name] is None:
                self._start(name)
            elif what == "resume" and name in self.paused:
                self.paused.discard(name)
                self.net.resume(name)  # (it reads what came before its timers run)
            elif what == "link" and name in self.cut:
                self.cut.discard(name)
                self.net.partition([name], [n for n in self.names
                                            if n != name and n not in self.cut], cut=False)
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
        """``STEP`` seconds: the cluster's timers and messages, each at its time (what they
        tell the queues' cores); then each broker's turn: its queue's timers, its clients, its
        outputs, its logs' writes; then what they sent arrives."""
        rng = self.rng
        self.net.advance(self.now + STEP)
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
        self.net.deliver()
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
            count = self.delivery_count
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
