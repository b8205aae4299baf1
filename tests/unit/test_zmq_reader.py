"""The one ZeroMQ reader of the broker (zbroker/runtime/zmq_reader.py), on real sockets and a real
asyncio loop: it reads what waited before it started, everything that comes while it drains,
gives timers a turn under a flood, and stops when its handler says so."""

from __future__ import annotations

import asyncio

import zmq
from helpers import wait_for_async

from zbroker.runtime.zmq_reader import SocketReader


def pair(ctx: zmq.Context, name: str) -> tuple[zmq.Socket, zmq.Socket]:
    a, b = ctx.socket(zmq.DEALER), ctx.socket(zmq.ROUTER)
    for s in (a, b):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
    b.bind(f"inproc://{name}")
    a.connect(f"inproc://{name}")
    return a, b


async def until(predicate, timeout: float = 5.0) -> None:
    await wait_for_async(predicate, timeout, "the reader", interval=0.001)


async def test_messages_that_waited_before_start_and_that_come_later_are_all_read():
    ctx = zmq.Context()
    try:
        sender, sock = pair(ctx, "reader-1")
        for i in range(10):
            sender.send_multipart([b"early", b"%d" % i])
        # they wait at the socket, and their edge has gone by (seen) before the reader exists
        await until(lambda: sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)
        got, flushes = [], []
        reader = SocketReader(asyncio.get_running_loop(), sock, got.append,
                              after=lambda: flushes.append(len(got)))
        reader.start()
        await until(lambda: len(got) == 10)
        for i in range(10):
            sender.send_multipart([b"late", b"%d" % i])
        await until(lambda: len(got) == 20)
        assert [f[1:] for f in got] == ([[b"early", b"%d" % i] for i in range(10)]
                                        + [[b"late", b"%d" % i] for i in range(10)])
        assert flushes and flushes[-1] == 20
        reader.stop()
    finally:
        ctx.destroy(linger=0)


async def test_a_flood_is_read_in_budgets_with_timers_running_between():
    ctx = zmq.Context()
    try:
        sender, sock = pair(ctx, "reader-2")
        for i in range(5000):
            sender.send(b"%d" % i)
        await until(lambda: sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)  # they wait there
        loop = asyncio.get_running_loop()
        got: list = []
        seen_by_timer: list[int] = []

        def tick() -> None:
            seen_by_timer.append(len(got))
            if len(got) < 5000:
                loop.call_soon(tick)

        reader = SocketReader(loop, sock, got.append, budget=100)
        reader.start()
        loop.call_soon(tick)
        await until(lambda: len(got) == 5000)
        assert any(0 < n < 5000 for n in seen_by_timer), seen_by_timer[:10]
        reader.stop()
    finally:
        ctx.destroy(linger=0)


async def test_a_handler_that_stops_the_reader_gets_no_more_messages():
    ctx = zmq.Context()
    try:
        sender, sock = pair(ctx, "reader-3")
        got: list = []
        reader = SocketReader(asyncio.get_running_loop(), sock,
                              lambda f: (got.append(f), reader.stop()))
        for _ in range(3):
            sender.send(b"x")
        reader.start()
        await until(lambda: len(got) == 1)
        await asyncio.sleep(0.05)  # a window for more to come (none may)
        assert len(got) == 1 and not reader.running
    finally:
        ctx.destroy(linger=0)


async def test_recheck_after_sending_reads_what_came_meanwhile():
    """Answering on the socket outside the handler may take the edge of a message that came:
    recheck() reads it all the same."""
    ctx = zmq.Context()
    try:
        sender, sock = pair(ctx, "reader-4")
        got: list = []
        reader = SocketReader(asyncio.get_running_loop(), sock, got.append)
        reader.start()
        sender.send(b"hello")
        await until(lambda: len(got) == 1)
        peer = got[0][0]
        for i in range(50):
            sender.send(b"%d" % i)
            sock.send_multipart([peer, b"answer"])
            reader.recheck()
        await until(lambda: len(got) == 51)
        reader.stop()
    finally:
        ctx.destroy(linger=0)
