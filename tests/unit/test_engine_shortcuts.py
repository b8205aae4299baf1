"""The client engine's shortcuts (a WRITE its pipe takes at once, a READ answered or set waiting
at once, a waiting READ woken with data) do what the state machine's table does, without looking
its rules up: two server cores, one with the shortcuts and one without, are fed the same random
sequences of commands from a few clients on two pipes (opens, READs and WRITEs of random sizes
and timeouts, pipelined or not, CLOSEs, PINGs, bad frames, disconnects, time passing), with
limits small enough that writers wait, chunks are refused and the budget and the pipelining
limit are met. After every step both must have answered the same frames to the same clients, in
the same order, and hold the same state: every client's, the pipes', the budget's, the timers'.
"""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest

from zbroker.services.zpipes.buffers import NoOutside
from zbroker.services.zpipes.engine import ClientEngine
from zbroker.services.zpipes.machine import State
from zbroker.services.zpipes.server import ServerConfig, ZpipesServer
from zpipes import protocol as p

CLIENTS = (b"\0a1", b"\0a2", b"\0b1", b"\0b2")  # two sources: a and b
PIPES = (b"p", b"q")
CONFIG = dict(capacity=64, max_chunk=48, max_buffered=160, max_buffered_per_source=96,
              max_pipelined=3, max_pipelined_bytes=80, client_timeout=5.0)
SHORTCUTS = ("_write_at_once", "_read_at_once", "_queue_read_at_once", "_woken_read",
             "_start_read")

READERS, WRITERS = (CLIENTS[0], CLIENTS[2]), (CLIENTS[1], CLIENTS[3])
#: how often each kind of step comes: mostly READs and WRITEs of each client in its role (the
#: shortcuts' cases), sometimes in the other (the table's INVALIDs), and the rest
WEIGHTS = {"read": 30, "write": 30, "input": 2, "output": 2, "close": 2, "ping": 2, "junk": 1,
           "gone": 1, "time": 4}


def random_step(rng: random.Random, server: ZpipesServer) -> tuple:
    """The next step: mostly a client that has no pipe open opens the one of its role
    (mostly the same pipe for all), else a step of a random kind."""
    def pipe() -> bytes:
        return rng.choice(PIPES[:1] * 3 + PIPES[1:])

    def in_role(mine: tuple[bytes, ...], others: tuple[bytes, ...]) -> bytes:
        return rng.choice(mine * 10 + others)

    clients = server.engine.clients
    idle = [c for c in CLIENTS if c not in clients or clients[c].state is State.START]
    if idle and rng.random() < 0.7:
        who = rng.choice(idle)
        return ("input" if who in READERS else "output", who, pipe())
    kind = rng.choices(list(WEIGHTS), list(WEIGHTS.values()))[0]
    if kind == "read":
        return (kind, in_role(READERS, WRITERS), rng.choice([0, 1, 5, 16, 100]),
                rng.choice([0, 0, 300]))
    if kind == "write":
        size = rng.choice([0, 1, 7, 7, 16, 16, 40] * 3 + [60])  # (over max_chunk: 60)
        return (kind, in_role(WRITERS, READERS), size, rng.choice([0, 0, 300]),
                rng.random() < 0.5)
    if kind == "input":
        return (kind, in_role(READERS, WRITERS), pipe())
    if kind == "output":
        return (kind, in_role(WRITERS, READERS), pipe())
    if kind == "time":
        return (kind, rng.choice([0.1, 0.4, 6.0]))
    return (kind, rng.choice(CLIENTS))


def make_server(shortcuts: bool) -> ZpipesServer:
    server = ZpipesServer(ServerConfig(**CONFIG))
    server.engine.shortcuts = shortcuts
    server.outside = _Sources()
    return server


class _Sources(NoOutside):
    """Clients named alike are of one source (their shares of the budget are one)."""

    def source_of(self, routing_id: bytes) -> Hashable:
        return routing_id[:2]


def count_shortcuts(engine: ClientEngine, taken: dict[str, int]) -> None:
    """Count in ``taken`` each time one of ``engine``'s shortcuts is taken."""
    for name in SHORTCUTS:
        method = getattr(engine, name)

        def counted(*args, _method=method, _name=name):
            done = _method(*args)
            taken[_name] += bool(done)
            return done

        setattr(engine, name, counted)


def frame_of(op: tuple, serial: int) -> bytes | bytearray:
    kind = op[0]
    if kind == "input":
        return p.encode(p.Input(op[2]))
    if kind == "output":
        return p.encode(p.Output(op[2]))
    if kind == "read":
        return p.encode(p.Read(op[2], op[3]))
    if kind == "write":  # numbered chunks; a writable frame may become a READ_OK in place
        chunk = (b"%d:" % serial + b"x" * op[2])[: op[2]]
        frame = p.encode(p.Write(chunk, op[3]))
        return bytearray(frame) if op[4] else frame
    if kind == "close":
        return p.encode(p.Close())
    if kind == "ping":
        return p.encode(p.Ping())
    return b"\xaa\xa0\x63junk"


def apply(server: ZpipesServer, op: tuple, now: float, serial: int) -> None:
    if op[0] == "time":
        server.tick(now)
    elif op[0] == "gone":
        server.disconnected(op[1], now)
    else:
        server.receive(op[1], [frame_of(op, serial)], now)


def answers(server: ZpipesServer) -> list[tuple]:
    return [(a.routing_id, bytes(a.frame), a.wakes) for a in server.take_output()]


def client_state(c) -> tuple:
    request = c.request
    shown = None if request is None else (type(request).__name__, getattr(request, "size", None),
                                          bytes(getattr(request, "chunk", b"")))
    return (c.routing_id, c.id, c.state, c.end, c.pipe,
            [(event, type(msg).__name__) for event, msg in c.queue], c.queued_bytes, c.source,
            shown, c.request_event, c.request_serial, c.budget_serial, c.dequeued, c.deadline,
            c.timer_armed, c.last_seen, c.reason, c.terminated,
            c.failed_end, c.close_failure, c.closing_end, c.awaiting)


def state(server: ZpipesServer) -> tuple:
    engine = server.engine
    return ([client_state(c) for c in engine.clients.values()], engine.held,
            dict(engine.buffers.held_by_source), engine.now, server.next_deadline(),
            sorted(engine.timers.entries), server.status(), server.metrics(), server.pipes.buffered,
            {name: sorted(pipe.waiting) for name, pipe in server.pipes.pipes.items()})


@pytest.mark.parametrize("seeds", [range(k, 600, 6) for k in range(6)],
                         ids=lambda seeds: f"seeds {seeds.start}+6k")
def test_the_shortcuts_do_what_the_table_does(seeds):
    taken = dict.fromkeys(SHORTCUTS, 0)
    for seed in seeds:
        table, quick = make_server(False), make_server(True)
        count_shortcuts(quick.engine, taken)
        now, rng = 100.0, random.Random(seed)
        for serial in range(150):
            op = random_step(rng, table)
            if op[0] == "time":
                now += op[1]
            apply(table, op, now, serial)
            apply(quick, op, now, serial)
            assert answers(quick) == answers(table), (seed, serial, op)
            assert state(quick) == state(table), (seed, serial, op)
    assert min(taken.values()) > 500, taken  # (the cases were met)


def test_a_stream_of_lines_takes_the_shortcuts_and_answers_as_the_table():
    """The common case of a stream, a reader keeping four READs outstanding (as the client
    does) and a writer writing lines, takes a shortcut at every step, and answers what the
    table answers."""
    taken = dict.fromkeys(SHORTCUTS, 0)
    table, quick = make_server(False), make_server(True)
    count_shortcuts(quick.engine, taken)
    reader, writer = CLIENTS[0], CLIENTS[2]
    steps = [("input", reader, b"p"), ("output", writer, b"p")] + [("read", reader, 100, 0)] * 4
    for _ in range(3):  # a line, and the READ that replaces the one it answered
        steps += [("write", writer, 7, 0, True), ("read", reader, 100, 0)]
    for serial, op in enumerate(steps):
        apply(table, op, 100.0, serial)
        apply(quick, op, 100.0, serial)
        got = answers(quick)
        assert got == answers(table)
        if op[0] == "write":  # WRITE_OK; then READ_OK, which the I/O writes first (``wakes``)
            line = (b"%d:" % serial + b"x" * 7)[:7]
            assert got == [(writer, b"\xaa\xa0\x0d", False),
                           (reader, b"\xaa\xa0\x08\x00\x00\x00\x07" + line, True)]
    assert taken == {"_write_at_once": 3, "_read_at_once": 1, "_queue_read_at_once": 6,
                     "_woken_read": 3, "_start_read": 4}
    assert state(quick) == state(table)
    assert len(quick.clients[reader].queue) == 3


def test_no_shortcut_where_each_transition_is_to_be_seen():
    """With the machine's trace on (log.animate), every event goes through the table, which
    logs it."""
    taken = dict.fromkeys(SHORTCUTS, 0)
    server = ZpipesServer(ServerConfig(**CONFIG, animate=True))
    count_shortcuts(server.engine, taken)
    for serial, op in enumerate([("input", CLIENTS[0], b"p"), ("output", CLIENTS[2], b"p"),
                                 ("read", CLIENTS[0], 100, 0),
                                 ("write", CLIENTS[2], 7, 0, False)]):
        apply(server, op, 100.0, serial)
    assert taken == dict.fromkeys(SHORTCUTS, 0)
    assert [frame for _, frame, _ in answers(server)][-2:] == [
        b"\xaa\xa0\x0d", b"\xaa\xa0\x08\x00\x00\x00\x073:xxxxx"]
