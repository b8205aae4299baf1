"""The workload of a pzq fault-injection run (pzq_faults.py): one producer and one consumer
per host, each a process of its own inside the host's network namespace, talking to the
host's broker on loopback with the project's own clients, and writing one JSON line per
event to a file of its own (one file per incarnation: a client is started again after its
broker is).

    python pzq_faults_workload.py producer HOST INCARNATION ENDPOINT FILE UNTIL RATE
    python pzq_faults_workload.py consumer HOST INCARNATION ENDPOINT FILE UNTIL AT_ONCE

Producer events: ``sent`` (id), ``ack`` (id, ok, text: "" or REPLICATION_FAILED for a "1",
the reason of a "0"), ``timeout`` (id: no answer when the producer stopped). Consumer
events: ``delivered`` (id, key, host), ``acked`` (id, key), WORK_S after its delivery (what
it still works on when it stops is never ACKed). A consumer works on at most AT_ONCE
messages at a time, so it takes at most AT_ONCE / WORK_S a second: below the rate offered,
a backlog builds up during a run, and with it the copies a holder takes over when its origin
is lost. SIGUSR1 lifts that bound (the drain at the end of a run). Every event has ``t``, the wall
clock (the same clock in every namespace of the machine).

Ids are ``HOST.INCARNATION.N``, unique over a run; a message's body is its id. The producer
offers RATE messages a second; while its window is full it skips the slots it missed rather
than catch up in a burst. SIGTERM stops a client at once (the producer writes ``timeout``
for what is unanswered); SIGINT stops the producer after it waited up to FLUSH_S for the
answers still due (the end of a run, when every broker is up). A client also stops by itself
at UNTIL (wall clock) or once the process that started it is gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import deque
from typing import Any

WINDOW = 200  # messages a producer leaves unanswered at most (one second at 200/s)
RETRY_S = 5.0  # the producer client resends an unanswered message after this
FLUSH_S = 15.0  # a producer stopped by SIGINT waits this long for its last answers
POLL_S = 0.05  # the longest a client waits before it looks at its stop flag again
BEHIND_S = 0.5  # a producer this far behind its schedule drops the missed slots
WORK_S = 0.05  # a consumer's work on a message, before its ACK


class Events:
    """An append-only file of JSON lines, one per event, each written through at once."""

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1, encoding="utf-8")

    def __call__(self, ev: str, **fields: Any) -> None:
        self.file.write(json.dumps({"t": time.time(), "ev": ev, **fields}) + "\n")


class Stop:
    """SIGTERM: stop now; SIGINT: stop once the answers due have come (producer); UNTIL
    passed or the parent gone: stop now. SIGUSR1: hurry (a consumer drains)."""

    def __init__(self, until: float) -> None:
        self.until = until
        self.parent = os.getppid()
        self.now = self.gently = self.hurry = False
        signal.signal(signal.SIGTERM, self._now)
        signal.signal(signal.SIGINT, self._gently)
        signal.signal(signal.SIGUSR1, self._hurry)

    def _now(self, *_: Any) -> None:
        self.now = True

    def _gently(self, *_: Any) -> None:
        self.gently = True

    def _hurry(self, *_: Any) -> None:
        self.hurry = True

    @property
    def asked(self) -> bool:
        if time.time() > self.until or os.getppid() != self.parent:
            self.now = True
        return self.now or self.gently


def produce(host: str, incarnation: str, endpoint: str, path: str, until: float,
            rate: float) -> None:
    import zmq

    from pzq.client import Producer

    stop, log = Stop(until), Events(path)

    def on_ack(msg_id: bytes, ok: bool, text: str) -> None:
        log("ack", id=msg_id.decode(), ok=ok, text=text)

    producer = Producer(endpoint, window=WINDOW, retry_timeout=RETRY_S, on_ack=on_ack)
    n = 0
    base = time.monotonic()
    while not stop.asked:
        due = base + n / rate
        now = time.monotonic()
        if now < due or producer.inflight >= producer.window:
            producer.poll(min(max(due - now, 0.001), POLL_S))
            continue
        if now - due > BEHIND_S:  # the window was full: skip the missed slots
            base = now - n / rate
        n += 1
        msg_id = f"{host}.{incarnation}.{n}"
        log("sent", id=msg_id)
        producer.send(msg_id.encode(), msg_id=msg_id.encode())
    deadline = time.monotonic() + (FLUSH_S if not stop.now else 0)
    while producer.outstanding and not stop.now and time.monotonic() < deadline:
        producer.poll(POLL_S)
    for msg_id in producer.outstanding:
        log("timeout", id=msg_id.decode())
    producer.sock.setsockopt(zmq.LINGER, 0)  # what is unanswered is logged
    producer.close()


def consume(host: str, incarnation: str, endpoint: str, path: str, until: float,
            at_once: int) -> None:
    """Each message is ACKed WORK_S after it came, at most ``at_once`` worked on at a time:
    so about that many are unACKed, and their copies held by peers, besides the backlog."""
    from pzq.client import Consumer

    stop, log = Stop(until), Events(path)
    working: deque[tuple[float, Any]] = deque()
    with Consumer(endpoint) as consumer:
        while not stop.asked:
            wait = working[0][0] - time.monotonic() if working else POLL_S
            if len(working) < at_once or stop.hurry:
                m = consumer.recv(min(max(wait, 0.0), POLL_S))
                if m is not None:
                    log("delivered", id=m.body.decode(errors="replace"),
                        key=m.key.decode(errors="replace"), host=host)
                    working.append((time.monotonic() + WORK_S, m))
            else:
                time.sleep(min(max(wait, 0.0), POLL_S))
            while working and working[0][0] <= time.monotonic():
                m = working.popleft()[1]
                consumer.ack(m)
                log("acked", id=m.body.decode(errors="replace"),
                    key=m.key.decode(errors="replace"))


def main(argv: list[str]) -> None:
    role, host, incarnation, endpoint, path, until, *rest = argv
    if role == "producer":
        produce(host, incarnation, endpoint, path, float(until), float(rest[0]))
    elif role == "consumer":
        consume(host, incarnation, endpoint, path, float(until), int(rest[0]))
    else:
        raise SystemExit(f"unknown role {role!r}: producer or consumer")


if __name__ == "__main__":
    main(sys.argv[1:])
