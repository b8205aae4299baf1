"""Fault injection for replicated pzq queues, black-box, in the manner of Jepsen.

Three brokers in network namespaces (netns.py), one cluster (a shared key, static seeds, no
zeroconf), a push queue ``jobs`` with ``replicas: 1`` on each. On each host a producer and a
consumer (pzq_faults_workload.py) log every event to files. A nemesis injects a fault every
3-8 s for the run's duration, from a plan drawn from the seed alone (so a run is replayed by
its seed): a broker SIGKILLed and restarted from its data dir, a host cut off the network, a
broker SIGSTOPped then SIGCONTed, sometimes two at once, and a broker SIGKILLed within a few
ms of logging that it took a lost origin's messages over. Then everything is healed, the
producers stop, the queues drain, and the checker (a pure function of the event logs) says
what the promises came to: every message ACKed "1" delivered (lost), how many were delivered
twice and why (duplicates), nothing delivered that was never sent (unexpected), the
throughput during the faults, the time to drain.

    result = run(seed=7, duration=35, base=tmp_path)   # root: see netns.available()
    print(result.report.text())                         # and result.report.lost, ...
    print(story(result, result.report.lost))            # what the brokers did, in order

    plan(seed, duration)     the faults of a run: the same for the same seed
    check(events, window)    the checker
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import netns
import pzq_faults_workload as workload
import yaml

QUEUE = "jobs"
RECEIVE = "tcp://127.0.0.1:11131"  # each host's own loopback: every broker has the same
SEND = "tcp://127.0.0.1:11132"
HOSTS = 3
PEER_TIMEOUT = 2.0
RATE = 200.0  # messages a second offered by each producer
#: what a consumer takes at most, over the rate offered: a backlog builds up during a run
#: (and the copies a holder takes over with it); the drain lifts the bound
CONSUMER_SHARE = 0.8
WORKLOAD = Path(__file__).resolve().with_name("pzq_faults_workload.py")
CLIENT_LIFE_S = 3600.0  # a client left behind (its run killed) stops by itself after this
TAKEOVER = "pzq replica origin lost: its messages taken over"

# the targets a run is held to
MAX_LOST = 0
MAX_DUPLICATES_PERCENT = 2.0  # of the ids ACKed "1"
MAX_UNEXPECTED = 0
MIN_THROUGHPUT = 0.8  # messages ACKed a second during the faults, over the rate offered


# --- the checker ---------------------------------------------------------------------------

WHY_HOSTS = "delivered on two hosts"
WHY_KEYS = "under two different keys"
WHY_AFTER_ACK = "the same key again after its consumer ACKed it"
WHY_NO_ACK = "the same key again, not ACKed before"


@dataclass(frozen=True)
class Window:
    """The times (wall clock) a report is measured against."""

    faults_from: float
    faults_to: float
    last_heal: float  # the last fault undone: from then on every broker runs, every link is up
    offered_rate: float  # messages a second, all producers together


@dataclass
class Report:
    sent: int
    acked: int  # answered "1", with or without REPLICATION_FAILED
    replication_failed: int
    refused: dict[str, int]  # reason of a "0" -> how many
    unanswered: int  # no answer when its producer stopped
    delivered: int  # ids delivered at least once
    deliveries: int
    lost: list[str]  # ACKed "1", never delivered
    duplicates: dict[str, str]  # id delivered more than once -> why
    unexpected: list[str]  # delivered, never sent
    throughput: float  # ACKed "1" a second during the faults
    offered: float
    #: from the last heal until all sent before it was delivered (the consumers' catching up
    #: with their backlog, once the producers stop, included)
    drain_s: float | None

    @property
    def duplicate_percent(self) -> float:
        return 100.0 * len(self.duplicates) / max(self.acked, 1)

    def whys(self) -> Counter[str]:
        return Counter(self.duplicates.values())

    def targets(self) -> list[tuple[str, str, str, bool]]:
        """(what, measured, target, met) for each target."""
        ratio = self.throughput / self.offered if self.offered else 0.0
        return [
            ("lost", f"{len(self.lost)}", f"{MAX_LOST}", len(self.lost) <= MAX_LOST),
            ("duplicates", f"{len(self.duplicates)} ({self.duplicate_percent:.2f} %)",
             f"<= {MAX_DUPLICATES_PERCENT:g} %",
             self.duplicate_percent <= MAX_DUPLICATES_PERCENT),
            ("unexpected", f"{len(self.unexpected)}", f"{MAX_UNEXPECTED}",
             len(self.unexpected) <= MAX_UNEXPECTED),
            ("throughput", f"{self.throughput:.0f}/s of {self.offered:.0f}/s ({100 * ratio:.0f} %)",
             f">= {100 * MIN_THROUGHPUT:.0f} %", ratio >= MIN_THROUGHPUT),
        ]

    def text(self) -> str:
        refused = sum(self.refused.values())
        lines = [f"sent {self.sent}, ACKed \"1\" {self.acked} (REPLICATION_FAILED "
                 f"{self.replication_failed}), refused \"0\" {refused}, unanswered "
                 f"{self.unanswered}; delivered {self.delivered} ids in {self.deliveries} "
                 f"deliveries"]
        for what, measured, target, met in self.targets():
            lines.append(f"  {what:<11} {measured:<28} target {target:<8} "
                         f"{'PASS' if met else 'FAIL'}")
        for why, n in self.whys().most_common():
            lines.append(f"    duplicates {why}: {n}")
        if self.refused:
            lines.append(f"  refused: {dict(self.refused)}")
        drain = "-" if self.drain_s is None else f"{self.drain_s:.1f} s"
        lines.append(f"  drain       {drain} (from the last heal until every message sent "
                     f"before it was delivered)")
        if self.lost:
            lines.append(f"  lost ids: {', '.join(self.lost[:20])}"
                         + (" ..." if len(self.lost) > 20 else ""))
        if self.unexpected:
            lines.append(f"  unexpected ids: {', '.join(self.unexpected[:20])}")
        return "\n".join(lines)


def check(events: Iterable[Mapping[str, Any]], window: Window) -> Report:
    """What the producers' and consumers' events (pzq_faults_workload.py) say happened."""
    sent: dict[str, float] = {}
    answers: dict[str, Mapping[str, Any]] = {}
    deliveries: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    consumer_acks: dict[tuple[str, str], float] = {}
    for e in events:
        ev = e.get("ev")
        if ev == "sent":
            sent.setdefault(e["id"], e["t"])
        elif ev == "ack":
            answers.setdefault(e["id"], e)
        elif ev == "delivered":
            deliveries[e["id"]].append(e)
        elif ev == "acked":
            consumer_acks.setdefault((e["id"], e["key"]), e["t"])
    acked = {i for i, a in answers.items() if a["ok"]}
    refused = Counter(a["text"] for a in answers.values() if not a["ok"])
    duplicates = {}
    for msg_id, ds in deliveries.items():
        if len(ds) > 1:
            ds.sort(key=lambda d: d["t"])
            duplicates[msg_id] = _why_duplicate(msg_id, ds, consumer_acks)
    faults = max(window.faults_to - window.faults_from, 1e-9)
    firsts = [min(d["t"] for d in ds) for i, ds in deliveries.items()
              if sent.get(i, window.last_heal) < window.last_heal]
    return Report(
        sent=len(sent),
        acked=len(acked),
        replication_failed=sum(1 for i in acked if answers[i]["text"]),
        refused=dict(refused),
        unanswered=len(sent.keys() - answers.keys()),
        delivered=len(deliveries),
        deliveries=sum(map(len, deliveries.values())),
        lost=sorted(acked - deliveries.keys(), key=_id_order),
        duplicates=duplicates,
        unexpected=sorted(deliveries.keys() - sent.keys()),
        throughput=sum(1 for i in acked
                       if window.faults_from <= answers[i]["t"] <= window.faults_to) / faults,
        offered=window.offered_rate,
        drain_s=max(max(firsts) - window.last_heal, 0.0) if firsts else None,
    )


def _why_duplicate(msg_id: str, ds: list[Mapping[str, Any]],
                   consumer_acks: Mapping[tuple[str, str], float]) -> str:
    if len({d["host"] for d in ds}) > 1:
        return WHY_HOSTS
    if len({d["key"] for d in ds}) > 1:
        return WHY_KEYS
    acked_at = consumer_acks.get((msg_id, ds[0]["key"]))
    return WHY_AFTER_ACK if acked_at is not None and acked_at <= ds[1]["t"] else WHY_NO_ACK


def _id_order(msg_id: str) -> tuple[str, int, int]:
    host, _, rest = msg_id.partition(".")
    inc, _, n = rest.partition(".")
    return (host, int(inc) if inc.isdigit() else 0, int(n) if n.isdigit() else 0)


# --- the plan --------------------------------------------------------------------------------

KILL, CUT, STOP, TAKEOVER_KILL = "kill", "cut", "stop", "kill-after-takeover"
WEIGHTS = {KILL: 3, CUT: 3, STOP: 3, TAKEOVER_KILL: 2}
HOLDS = {KILL: (1.0, 5.0), CUT: (2.0, 10.0), STOP: (1.0, 6.0), TAKEOVER_KILL: (2.0, 5.0)}
GAP = (3.0, 8.0)  # seconds between two faults
TWO_AT_ONCE = 0.2  # how often a second fault starts with one
MAX_FAULTED = 2  # hosts in a fault at once: one broker always works
SETTLE_S = 3.0  # a host is left alone this long after its fault (restart, rejoin)
WATCH_S = 6.0  # how long the holder's takeover is watched for after its origin's kill


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the faults begin
    kind: str
    host: int  # index of the host in the run
    hold: float  # seconds down, cut off or stopped (the origin's, for TAKEOVER_KILL)
    then: float = 0.0  # TAKEOVER_KILL: seconds the holder stays down after its kill

    def until(self) -> float:
        """When the hosts it involves are free again."""
        if self.kind == TAKEOVER_KILL:
            return self.at + max(self.hold, WATCH_S + self.then) + SETTLE_S
        return self.at + self.hold + SETTLE_S

    def __str__(self) -> str:
        h = f"h{self.host + 1}"
        return {KILL: f"SIGKILL {h}, restart after {self.hold:.1f} s",
                CUT: f"cut {h} off for {self.hold:.1f} s",
                STOP: f"SIGSTOP {h} for {self.hold:.1f} s",
                TAKEOVER_KILL: f"SIGKILL {h}, restart after {self.hold:.1f} s; SIGKILL the "
                               f"holder that takes its messages over, restart after "
                               f"{self.then:.1f} s"}[self.kind]


def plan(seed: int, duration: float, hosts: int = HOSTS) -> list[Fault]:
    """The faults of a run, from the seed alone."""
    rng = random.Random(seed)
    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
    busy = [0.0] * hosts
    faults: list[Fault] = []
    t = rng.uniform(*GAP)
    while t < duration:
        for _ in range(2 if rng.random() < TWO_AT_ONCE else 1):
            kind = rng.choices(kinds, weights)[0]  # every draw made whatever is used
            hold, then, pick = rng.uniform(*HOLDS[kind]), rng.uniform(*HOLDS[KILL]), rng.random()
            free = [h for h in range(hosts) if busy[h] <= t]
            if hosts - len(free) >= MAX_FAULTED or not free:
                continue
            if kind == TAKEOVER_KILL and len(free) < hosts:
                kind = KILL  # it needs every host: the holder is not known beforehand
            f = Fault(round(t, 1), kind, free[int(pick * len(free))], round(hold, 1),
                      round(then, 1) if kind == TAKEOVER_KILL else 0.0)
            faults.append(f)
            for h in range(hosts) if kind == TAKEOVER_KILL else [f.host]:
                busy[h] = f.until()
        t += rng.uniform(*GAP)
    return faults


# --- a broker's log, read as it grows -------------------------------------------------------

class LogTail:
    """The JSON lines appended to a file since the last look."""

    def __init__(self, path: Path, at_end: bool = False):
        self.path = path
        self.offset = path.stat().st_size if at_end and path.exists() else 0
        self._file: Any = None
        self._partial = b""

    def new(self) -> list[dict[str, Any]]:
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except FileNotFoundError:
                return []
        self._file.seek(self.offset)
        data = self._file.read()
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def wall_time(event: Mapping[str, Any]) -> float:
    """A broker log line's time, as time.time() gives it."""
    return datetime.fromisoformat(event["timestamp"]).timestamp()


# --- the hosts ------------------------------------------------------------------------------

def broker_config(host: netns.Host, hosts: list[netns.Host], key: Path) -> dict[str, Any]:
    return {
        "cluster": {"enabled": True, "bind": f"tcp://{host.address}:{netns.PEER_PORT}",
                    "discovery": False,
                    "peers": [h.endpoint for h in hosts if h is not host],
                    "peer_timeout": PEER_TIMEOUT, "insecure": False, "key_file": str(key)},
        "services": {"pzq": {"enabled": True, "queues": {QUEUE: {
            "receive_endpoint": RECEIVE, "send_endpoint": SEND,
            "data_dir": str(host.dir / "data"), "replicas": 1,
            # copies confirmed in time on a loaded machine; a lost holder is not waited for
            "replication_timeout": 1.0, "ack_timeout": 5.0, "reaper_frequency": 0.5}}}},
    }


class Node:
    """One host of a run: its broker, and its producer and consumer (started again, as new
    incarnations, whenever the broker is)."""

    START_S = 30.0  # a broker's queue is up within this

    def __init__(self, host: netns.Host, config: dict[str, Any], rate: float,
                 consumer_share: float):
        self.host, self.name, self.config, self.rate = host, host.name, config, rate
        # messages a consumer works on at once: it takes at most that many a WORK_S
        self.at_once = max(1, round(rate * consumer_share * workload.WORK_S))
        self.lock = threading.RLock()
        self.incarnation = 0
        self.producer: subprocess.Popen | None = None
        self.consumer: subprocess.Popen | None = None
        self.paused = self.cut = False
        self.brokers: list[subprocess.Popen] = []  # every broker process it started
        self.node_id = ""
        self._starts = 0
        self._log = LogTail(host.log_path)

    def _scan(self) -> None:
        for e in self._log.new():
            if e.get("event") == "pzq queue started":
                self._starts += 1
                self.node_id = e.get("node", self.node_id)

    def current_node_id(self) -> str:
        """The node id its queue last logged at start."""
        self._scan()
        return self.node_id

    def running(self) -> bool:
        return self.host.broker is not None and self.host.broker.poll() is None

    def start_broker(self, wait: bool = True) -> None:
        """Start the broker on its data dir (as netns.Host.start_broker does, its standard
        output in a file: it prints how to join the cluster)."""
        with self.lock:
            self._scan()
            before = self._starts
            host = self.host
            cfg = {"log": {"format": "json", "file": str(host.log_path), "level": "info"},
                   "broker": {"run_dir": str(host.dir / "run")}, **self.config}
            path = host.dir / "zbroker.cfg"
            path.write_text(yaml.safe_dump(cfg))
            with open(host.dir / "broker.stderr", "ab") as out:
                host.broker = host.popen([sys.executable, "-m", "zbroker", "local", "-c",
                                          str(path)], stdout=out, stderr=out)
            self.brokers.append(host.broker)
        if wait:
            self.wait_started(before)

    def wait_started(self, before: int) -> None:
        deadline = time.monotonic() + self.START_S
        while True:
            self._scan()
            if self._starts > before:
                return
            if not self.running():
                raise RuntimeError(f"{self.name}: broker exited at start:\n"
                                   + (self.host.dir / "broker.stderr").read_text()[-2000:])
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: queue not started in {self.START_S} s\n"
                                   + self.host.log_tail())
            time.sleep(0.05)

    def start_clients(self) -> None:
        with self.lock:
            self.stop_producer(gently=False)  # those of before, if still there
            self.stop_consumer()
            self.incarnation += 1
            inc, d = str(self.incarnation), self.host.dir
            until = str(time.time() + CLIENT_LIFE_S)
            with open(d / "clients.stderr", "ab") as err:
                self.producer = self.host.popen(
                    [sys.executable, str(WORKLOAD), "producer", self.name, inc, RECEIVE,
                     str(d / f"producer-{inc}.jsonl"), until, str(self.rate)], stderr=err)
                self.consumer = self.host.popen(
                    [sys.executable, str(WORKLOAD), "consumer", self.name, inc, SEND,
                     str(d / f"consumer-{inc}.jsonl"), until, str(self.at_once)], stderr=err)

    def stop_producer(self, gently: bool) -> None:
        _stop(self.producer, signal.SIGINT if gently else signal.SIGTERM, 30 if gently else 5)

    def hurry_consumer(self) -> None:
        """Let the consumer take all it can (the drain)."""
        if self.consumer is not None and self.consumer.poll() is None:
            self.consumer.send_signal(signal.SIGUSR1)

    def stop_consumer(self) -> None:
        _stop(self.consumer, signal.SIGTERM, 5)

    def kill(self) -> float:
        """SIGKILL the broker; its clients are told to stop (they start again with it).
        Returns when the signal went (time.monotonic())."""
        with self.lock:
            at = time.monotonic()
            if self.running():
                self.host.broker.kill()
                self.host.broker.wait(10)
            for proc in (self.producer, self.consumer):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            return at

    def restart(self) -> None:
        with self.lock:
            if self.running():
                return
            self.start_broker()
            self.start_clients()

    def pause(self, stopped: bool) -> None:
        with self.lock:
            if self.running():
                self.host.broker.send_signal(signal.SIGSTOP if stopped else signal.SIGCONT)
            self.paused = stopped

    def link(self, up: bool) -> None:
        with self.lock:
            self.host.link(up)
            self.cut = not up

    def heal(self) -> bool:
        """Every fault of this host undone; whether there was one to undo."""
        with self.lock:
            undone = self.cut or self.paused or not self.running()
            self.link(True)
            self.pause(False)
            self.restart()
            return undone

    def crashes(self) -> list[str]:
        """Its brokers that exited but not by the nemesis' SIGKILL."""
        return [f"{self.name}: a broker exited by itself ({p.returncode})"
                for p in self.brokers if p.poll() not in (None, -signal.SIGKILL)]


def _stop(proc: subprocess.Popen | None, sig: int, timeout: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# --- the nemesis ----------------------------------------------------------------------------

class Nemesis:
    """Carries out a plan: each fault in a thread of its own, at its time; every wait ends
    early once ``healing`` is set (the end of the run, an error or Ctrl-C)."""

    def __init__(self, nodes: list[Node], say: Callable[[str], None]):
        self.nodes = nodes
        self.say = say
        self.healing = threading.Event()
        self.actions: list[tuple[float, str]] = []  # (wall clock, what was done)
        self.errors: list[str] = []
        self.last_heal = 0.0  # when a fault was last undone (wall clock)
        self._threads: list[threading.Thread] = []
        self._start = 0.0

    def note(self, text: str, heal: bool = False) -> None:
        now = time.time()
        self.actions.append((now, text))
        if heal:
            self.last_heal = max(self.last_heal, now)
        self.say(f"[{now - self._start:7.2f} s] {text}")

    def run(self, faults: list[Fault], duration: float) -> None:
        """Inject the faults for ``duration`` seconds from now."""
        self._start = time.time()
        begin = time.monotonic()
        for f in faults:
            if self.healing.wait(max(0.0, begin + f.at - time.monotonic())):
                return
            t = threading.Thread(target=self._carry_out, args=(f,), daemon=True)
            self._threads.append(t)
            t.start()
        self.healing.wait(max(0.0, begin + duration - time.monotonic()))

    def stop(self, timeout: float = 60.0) -> None:
        self.healing.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _carry_out(self, f: Fault) -> None:
        try:
            {KILL: self._kill, CUT: self._cut, STOP: self._stop,
             TAKEOVER_KILL: self._kill_after_takeover}[f.kind](f)
        except Exception as exc:  # noqa: BLE001 - said, and the heal puts things right
            self.errors.append(f"{f}: {exc!r}")
            self.note(f"fault failed: {f}: {exc!r}")

    def _kill(self, f: Fault) -> None:
        node = self.nodes[f.host]
        node.kill()
        self.note(f"SIGKILL {node.name}")
        self.healing.wait(f.hold)
        node.restart()
        self.note(f"{node.name} restarted (incarnation {node.incarnation})", heal=True)

    def _cut(self, f: Fault) -> None:
        node = self.nodes[f.host]
        node.link(False)
        self.note(f"{node.name} cut off")
        self.healing.wait(f.hold)
        node.link(True)
        self.note(f"{node.name} linked again", heal=True)

    def _stop(self, f: Fault) -> None:
        node = self.nodes[f.host]
        node.pause(True)
        self.note(f"SIGSTOP {node.name}")
        self.healing.wait(f.hold)
        node.pause(False)
        self.note(f"SIGCONT {node.name}", heal=True)

    def _kill_after_takeover(self, f: Fault) -> None:
        origin = self.nodes[f.host]
        others = [n for n in self.nodes if n is not origin]
        node_id = origin.current_node_id()
        tails = {n.name: (n, LogTail(n.host.log_path, at_end=True)) for n in others}
        origin.kill()
        killed = time.monotonic()
        self.note(f"SIGKILL {origin.name}, watching for the takeover of its messages")
        found = self._watch(tails, node_id, killed + WATCH_S)
        for _, tail in tails.values():
            tail.close()
        holder: Node | None = None
        if found is None:
            self.note(f"no takeover of {origin.name}'s messages seen in {WATCH_S:g} s")
        else:
            holder, event, seen = found
            since_line = time.time() - wall_time(event)
            lag = holder.kill() - seen
            self.note(f"SIGKILL {holder.name} {lag * 1000:.1f} ms after its takeover of "
                      f"{origin.name}'s {event.get('messages')} messages was seen in its log "
                      f"({since_line * 1000:.1f} ms after the line's time)")
        holder_back = time.monotonic() + f.then
        self.healing.wait(max(0.0, killed + f.hold - time.monotonic()))
        origin.restart()
        self.note(f"{origin.name} restarted (incarnation {origin.incarnation})", heal=True)
        if holder is not None:
            self.healing.wait(max(0.0, holder_back - time.monotonic()))
            holder.restart()
            self.note(f"{holder.name} restarted (incarnation {holder.incarnation})", heal=True)

    def _watch(self, tails: dict[str, tuple[Node, LogTail]], node_id: str,
               deadline: float) -> tuple[Node, dict[str, Any], float] | None:
        """The first holder to log the takeover of ``node_id``'s messages, its line, when."""
        while time.monotonic() < deadline and not self.healing.is_set():
            for node, tail in tails.values():
                for e in tail.new():
                    if e.get("event") == TAKEOVER and e.get("node") == node_id:
                        return node, e, time.monotonic()
            time.sleep(0.001)
        return None


# --- a run ----------------------------------------------------------------------------------

#: what the brokers log that tells a story of replication (story())
STORY_EVENTS = {"broker started", "pzq queue started", "peer joined", "peer left",
                "pzq replica holder chosen", "pzq replica holder lost", TAKEOVER,
                "pzq replica origin is back", "pzq stale copies dropped",
                "pzq messages delivered by a peer in our absence dropped",
                "pzq told a returning queue what was delivered in its absence",
                "pzq recovered messages released to consumers",
                "pzq log: torn or corrupt tail truncated", "pzq cannot record taken-over keys",
                "pzq replica traffic refused"}


STORY_WIDTH = 240  # characters of a line of story() at most


@dataclass
class Result:
    seed: int
    duration: float
    faults: list[Fault]
    report: Report
    window: Window
    actions: list[tuple[float, str]]  # what the nemesis did (wall clock, text)
    broker_events: list[dict[str, Any]]  # STORY_EVENTS of every broker, with "host" and "t"
    names: dict[str, str]  # node ids and cluster lives -> host names
    events: list[dict[str, Any]] = field(repr=False, default_factory=list)  # the clients'
    problems: list[str] = field(default_factory=list)  # crashes, tracebacks, failed faults


def run(seed: int, duration: float, base: Path, *, drain_quiet: float = 8.0,
        drain_max: float = 120.0, rate: float = RATE, consumer_share: float = CONSUMER_SHARE,
        say: Callable[[str], None] = print) -> Result:
    """One run: set up, ``duration`` s of faults, heal, stop the producers, drain until no
    delivery for ``drain_quiet`` s (at most ``drain_max``), check. Cleans up whatever
    happens (Ctrl-C included)."""
    faults = plan(seed, duration)
    say(f"seed {seed}: {duration:g} s of faults, {len(faults)} planned:")
    for f in faults:
        say(f"  at {f.at:5.1f} s: {f}")
    base.mkdir(parents=True, exist_ok=True)
    key = base / "cluster.key"
    subprocess.run([sys.executable, "-m", "zbroker", "keygen", str(key)], check=True,
                   capture_output=True)
    bed = netns.Testbed(HOSTS, base)
    nodes: list[Node] = []
    nemesis = Nemesis(nodes, say)
    try:
        nodes += [Node(h, broker_config(h, bed.hosts, key), rate, consumer_share)
                  for h in bed.hosts]
        for n in nodes:
            n.start_broker(wait=False)
        for n in nodes:
            n.wait_started(0)
        bed.wait_for_cluster(timeout=30)
        _wait(lambda: all(_logged(n, "pzq replica holder chosen") for n in nodes), 20,
              "every queue has a holder of its copies")
        for n in nodes:
            n.start_clients()
        _wait(lambda: all(_delivered_any(n) for n in nodes), 20, "every consumer gets messages")
        faults_from = time.time()
        nemesis.run(faults, duration)
        faults_to = time.time()
        nemesis.stop()
        undone = [n.name for n in nodes if n.heal()]
        healed_at = time.time()
        say(f"[{healed_at - faults_from:7.2f} s] healed ({', '.join(undone) or 'nothing'} "
            f"to undo)")
        bed.wait_for_cluster(timeout=30)
        for n in nodes:
            n.stop_producer(gently=True)
            n.hurry_consumer()
        stopped = time.time()
        say(f"[{stopped - faults_from:7.2f} s] producers stopped; draining")
        _drain(nodes, drain_quiet, drain_max)
        for n in nodes:
            n.stop_consumer()
        say(f"[{time.time() - faults_from:7.2f} s] drained")
        events = _client_events(nodes)
        last_heal = healed_at if undone else max(nemesis.last_heal, faults_from)
        window = Window(faults_from, faults_to, last_heal, rate * len(nodes))
        report = check(events, window)
        broker_events, names = _broker_story(nodes)
        problems = (nemesis.errors + [c for n in nodes for c in n.crashes()]
                    + _tracebacks(nodes) + _errors_logged(broker_events))
        return Result(seed, duration, faults, report, window, nemesis.actions, broker_events,
                      names, events, problems)
    finally:
        nemesis.stop(timeout=15)
        bed.close()


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)


def _logged(node: Node, event: str) -> bool:
    return any(e.get("event") == event for e in node.host.log_events())


def _delivered_any(node: Node) -> bool:
    path = node.host.dir / f"consumer-{node.incarnation}.jsonl"
    return path.exists() and b'"delivered"' in path.read_bytes()


def _drain(nodes: list[Node], quiet: float, limit: float) -> None:
    """Until no consumer got a message for ``quiet`` s (at most ``limit`` s)."""
    tails = [LogTail(n.host.dir / f"consumer-{n.incarnation}.jsonl") for n in nodes]
    last = time.monotonic()
    deadline = last + limit
    while time.monotonic() - last < quiet and time.monotonic() < deadline:
        time.sleep(0.2)
        if any(e.get("ev") == "delivered" for tail in tails for e in tail.new()):
            last = time.monotonic()
    for tail in tails:
        tail.close()


def _client_events(nodes: list[Node]) -> list[dict[str, Any]]:
    events = []
    for n in nodes:
        for path in sorted(n.host.dir.glob("*.jsonl")):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    events.append(json.loads(line))
                except ValueError:  # a line cut by a kill: never half an event
                    pass
    return events


def _broker_story(nodes: list[Node]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    names: dict[str, str] = {}
    by_endpoint = {n.host.endpoint: n.name for n in nodes}
    story = []
    for n in nodes:
        for e in n.host.log_events():
            if e.get("event") == "pzq queue started" and e.get("node"):
                names[e["node"]] = n.name
            elif e.get("event") == "peer joined" and e.get("endpoint") in by_endpoint:
                names[e["life"]] = by_endpoint[e["endpoint"]]
            if e.get("event") in STORY_EVENTS or e.get("level") in ("warning", "error"):
                story.append({**e, "host": n.name, "t": wall_time(e)})
    story.sort(key=lambda e: e["t"])
    return story, names


def _tracebacks(nodes: list[Node]) -> list[str]:
    out = []
    for n in nodes:
        for name in ("broker.stderr", "clients.stderr"):
            path = n.host.dir / name
            if path.exists() and "Traceback" in (text := path.read_text(errors="replace")):
                out.append(f"{n.name} {name}: {text[text.index('Traceback'):][:1500]}")
    return out


def _errors_logged(broker_events: list[dict[str, Any]]) -> list[str]:
    """The brokers' error lines, one per host and kind, with how many there were."""
    seen: Counter[tuple[str, str]] = Counter()
    first: dict[tuple[str, str], dict[str, Any]] = {}
    for e in broker_events:
        if e.get("level") == "error":
            kind = (e["host"], e["event"])
            seen[kind] += 1
            first.setdefault(kind, e)
    return [f"{host}: {n} x {event!r}, the first: {json.dumps(first[host, event])[:1500]}"
            for (host, event), n in seen.items()]


# --- what happened to some messages ---------------------------------------------------------

def story(result: Result, ids: Iterable[str], before: float = 3.0) -> str:
    """The client events of ``ids`` and, from shortly before the first of them was sent to
    the end of the run, what the nemesis did and what the brokers logged about replication,
    in order, node ids and cluster lives named by their hosts."""
    ids = set(ids)
    if not ids:
        return ""
    mine = sorted((e for e in result.events if e.get("id") in ids), key=lambda e: e["t"])
    start = min(e["t"] for e in mine) - before
    t0 = result.window.faults_from
    lines = [f"client events of {len(ids)} id(s) (times from the start of the faults):"]
    for e in mine[:60]:
        rest = {k: v for k, v in e.items() if k not in ("t", "ev", "id")}
        lines.append(f"  {e['t'] - t0:8.3f} {e['id']} {e['ev']} {rest}")
    lines.append("nemesis and brokers:")
    merged = [(t, f"nemesis: {text}") for t, text in result.actions if t >= start]
    for e in result.broker_events:
        if e["t"] >= start:
            fields = {k: result.names.get(v, v) if isinstance(v, str) else v
                      for k, v in e.items()
                      if k not in ("timestamp", "level", "event", "host", "t", "id")}
            merged.append((e["t"], f"{e['host']}: {e['event']} {fields}"))
    for t, text in sorted(merged):
        lines.append(f"  {t - t0:8.3f} {text[:STORY_WIDTH]}")
    return "\n".join(lines)


def replay_command(seed: int, duration: float) -> str:
    return f"python bench/bench_pzq_faults.py --seed {seed} --duration {duration:g}"


def dump(result: Result, path: Path) -> None:
    """The client events of a run, one JSON line each (to check again or look into)."""
    with open(path, "w") as f:
        for e in result.events:
            f.write(json.dumps(e) + "\n")


if __name__ == "__main__":  # a quick look at a plan: python pzq_faults.py SEED DURATION
    for fault in plan(int(sys.argv[1]), float(sys.argv[2])):
        print(f"{fault.at:6.1f} s  {fault}")
